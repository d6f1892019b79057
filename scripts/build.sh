#!/usr/bin/env bash
# Configures and builds Loom into ${LOOM_BUILD_DIR:-build} and installs it into
# ${LOOM_PREFIX:-<repo>/install}. LOOM_DEBUG_INFO=0 builds RelWithDebInfo without the debug
# information (-O2, no -g): a third less compile time, for CI (scripts/test.sh sets it).
# Generator: Ninja where it is installed (scripts/deps.sh installs it) for a new build
# directory, else CMake's default; an existing build directory keeps its own.
# LOOM_CMAKE_GENERATOR=<name> chooses.
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
# Ninja schedules every compile of the build in one graph: the Makefiles' per-target steps
# and their make/cmake processes left a core idle about a sixth of the time on 2 cores.
generator=()
if [ -n "${LOOM_CMAKE_GENERATOR:-}" ]; then
  generator=(-G "$LOOM_CMAKE_GENERATOR")
elif [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then
  generator=(-G Ninja)
fi
cmake -S "$repo" -B "$build" ${generator[@]+"${generator[@]}"} \
  -DCMAKE_BUILD_TYPE="${LOOM_BUILD_TYPE:-RelWithDebInfo}" \
  -DCMAKE_INSTALL_PREFIX="$prefix" "${debug_flags[@]}" ${LOOM_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$jobs"
cmake --install "$build" >/dev/null
echo "loom: built in $build, installed in $prefix"
