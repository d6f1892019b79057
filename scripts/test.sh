#!/usr/bin/env bash
# Builds Loom and runs the whole test suite (CTest), the PyTorch backend's tests against a
# real torch (scripts/torch_test.sh; LOOM_SKIP_TORCH=1 skips them), then the multi-rank
# suites again under
# AddressSanitizer + UndefinedBehaviorSanitizer and under ThreadSanitizer
# (scripts/sanitize.sh: each its own build of just what those tests need, in build-asan and
# build-tsan; about 4 minutes each on 2 cores). Fails if any stage fails.
#
#   LOOM_SKIP_SANITIZE=1 scripts/test.sh      skip the sanitizer stages (quicker local runs)
#   LOOM_SANITIZERS="address" scripts/test.sh   run only these (default "address thread")
#   extra arguments go to ctest (e.g. -R core)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
"$repo/scripts/deps.sh"
# No debug information in the test build: -g costs a third of the compile time, and CI's
# budget is about 30 minutes (LOOM_DEBUG_INFO=1 keeps it).
# Without a GPU here the CUDA module only has to compile: for one architecture (sm_90, what
# scripts/gpu_check.sh runs on), not the release's two.
cuda_arch=()
if ! nvidia-smi -L >/dev/null 2>&1; then cuda_arch=(-DCMAKE_CUDA_ARCHITECTURES=90); fi
# The PyTorch stage's torch (a download of a few GB, mostly waiting on the network) comes
# in beside the build.
build="${LOOM_BUILD_DIR:-$repo/build}"
torch_prep=""
if [ -z "${LOOM_SKIP_TORCH:-}" ]; then
  mkdir -p "$build"
  "$repo/scripts/torch_test.sh" --prepare >"$build/torch-prepare.log" 2>&1 &
  torch_prep=$!
fi
LOOM_CMAKE_ARGS="${cuda_arch[*]:-} ${LOOM_CMAKE_ARGS:-}" LOOM_DEBUG_INFO="${LOOM_DEBUG_INFO:-0}" \
  "$repo/scripts/build.sh"
ctest_rc=0
(cd "$build" && ctest --output-on-failure -j "${LOOM_TEST_JOBS:-2}" --timeout 600 "$@") || ctest_rc=$?
# The chaos suites' summary lines (CTest keeps passing tests' output only in its log).
grep -h -E "^(chaos|chaos-tcp|hostile \(|pidns|cpu): " "$build/Testing/Temporary/LastTest.log" 2>/dev/null || true
torch_rc=0
if [ -z "${LOOM_SKIP_TORCH:-}" ]; then
  # If the preparation failed, the stage tries once more and reports why.
  wait "$torch_prep" || { echo "test: torch preparation failed:"; tail -5 "$build/torch-prepare.log"; }
  "$repo/scripts/torch_test.sh" || torch_rc=$?
else
  echo "test: PyTorch backend stage skipped (LOOM_SKIP_TORCH is set)"
fi
san_failed=()
if [ -z "${LOOM_SKIP_SANITIZE:-}" ]; then
  for kind in ${LOOM_SANITIZERS:-address thread}; do
    dir="$repo/build-asan"
    [ "$kind" = thread ] && dir="$repo/build-tsan"
    LOOM_SANITIZER="$kind" LOOM_SANITIZE_DIR="$dir" "$repo/scripts/sanitize.sh" ||
      san_failed+=("$kind")
  done
else
  echo "test: sanitizer stages skipped (LOOM_SKIP_SANITIZE is set)"
fi
if [ "$ctest_rc" -ne 0 ] || [ "$torch_rc" -ne 0 ] || [ ${#san_failed[@]} -ne 0 ]; then
  echo "test: FAILED (ctest exit $ctest_rc; torch stage exit $torch_rc; sanitizer runs failed: ${san_failed[*]:-none})"
  exit 1
fi
echo "test: all stages passed"
