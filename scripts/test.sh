#!/usr/bin/env bash
# Builds Loom and runs the whole test suite (CTest).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
"$repo/scripts/deps.sh"
"$repo/scripts/build.sh"
build="${LOOM_BUILD_DIR:-$repo/build}"
cd "$build"
ctest --output-on-failure -j "${LOOM_TEST_JOBS:-2}" --timeout 600 "$@"
