#!/usr/bin/env bash
# Quick start: install what is missing, build and install Loom, then run the bundled
# all-reduce benchmark across 4 local ranks on host memory.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
"$repo/scripts/deps.sh"
"$repo/scripts/build.sh"
prefix="${LOOM_PREFIX:-$repo/install}"
exec "$prefix/bin/all_reduce_perf" --nranks "${LOOM_NRANKS:-4}" -b 8 -e 128M -f 4 -c 1 "$@"
