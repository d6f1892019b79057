#!/usr/bin/env bash
# Configures and builds Loom into ${LOOM_BUILD_DIR:-build} and installs it into
# ${LOOM_PREFIX:-<repo>/install}.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="${LOOM_BUILD_DIR:-$repo/build}"
prefix="${LOOM_PREFIX:-$repo/install}"
jobs="${LOOM_JOBS:-$(nproc)}"
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE="${LOOM_BUILD_TYPE:-RelWithDebInfo}" \
  -DCMAKE_INSTALL_PREFIX="$prefix" ${LOOM_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$jobs"
cmake --install "$build" >/dev/null
echo "loom: built in $build, installed in $prefix"
