#!/usr/bin/env bash
# Configures and builds Loom into ${LOOM_BUILD_DIR:-build} and installs it into
# ${LOOM_PREFIX:-<repo>/install}. LOOM_DEBUG_INFO=0 builds RelWithDebInfo without the debug
# information (-O2, no -g): a third less compile time, for CI (scripts/test.sh sets it).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="${LOOM_BUILD_DIR:-$repo/build}"
prefix="${LOOM_PREFIX:-$repo/install}"
jobs="${LOOM_JOBS:-$(nproc)}"
debug_flags=()
if [ "${LOOM_DEBUG_INFO:-1}" = 0 ]; then
  debug_flags=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG"
               -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG"
               -DCMAKE_CUDA_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG")
fi
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE="${LOOM_BUILD_TYPE:-RelWithDebInfo}" \
  -DCMAKE_INSTALL_PREFIX="$prefix" "${debug_flags[@]}" ${LOOM_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$jobs"
cmake --install "$build" >/dev/null
echo "loom: built in $build, installed in $prefix"
