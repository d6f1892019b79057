#!/usr/bin/env bash
# The GPU check (issue 11): everything that needs a real GPU, as one call on a machine the
# `device` tool lends (nothing can be fetched there), prepared on this machine.
#
#   scripts/gpu_check.sh prepare     here: builds with CUDA for sm_90 (build-gpu/) and stages
#                                    what the GPU machine runs in .gpu/ (git-ignored):
#                                    test binaries, libloom, the drop-in libnccl.so.2, the
#                                    *_perf tools, and NVIDIA's nccl-tests source when
#                                    LOOM_NCCL_TESTS_SRC names a checkout (never committed)
#   scripts/gpu_check.sh run [DIR]   there: runs every check, writes DIR/gpu_check.md (the
#                                    summary table) and DIR/gpu_check.log; DIR defaults to
#                                    $OUT, else .gpu/out
#
# The device call: command "scripts/gpu_check.sh run", carry [".gpu"], timeout_s 540.
# Checks, each bounded by a timeout so that one hang costs its own row only:
#   1. the GPU (nvidia-smi) and the stock NCCL beside PyTorch (what the fallback opens)
#   2. memory kinds and the staged path against the real driver (the same tests CI runs
#      against the stand-in driver), the CUDA reduction kernels' parity with the CPU loops
#   3. Loom's all_reduce_perf on device buffers: 1 rank served by stock NCCL (fallback),
#      1 rank through Loom's staged path, 2 ranks on the one GPU as threads and processes
#   4. nccl-tests built from source: stock NCCL, then Loom preloaded (LD_PRELOAD) with
#      every rank on GPU 0 (2 ranks where mpirun exists)
#   5. torch's ProcessGroupNCCL under LD_PRELOAD: two processes on one GPU (stock NCCL
#      refuses that), collectives and DDP steps checked (scripts/gpu/torch_preload_check.py)
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
stage="$repo/.gpu"
mode="${1:-}"

prepare() {
  set -e
  local build="$repo/build-gpu"
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  cmake --build "$build" -j "${LOOM_JOBS:-$(nproc)}" --target loom loom_nccl loom_cuda_kernels \
    engine_mem_kind_cuda_test engine_staged_cuda_test engine_interp_cuda_test kernels_test all_reduce_perf \
    all_gather_perf reduce_scatter_perf sendrecv_perf alltoall_perf
  rm -rf "$stage"
  mkdir -p "$stage/bin" "$stage/lib/nccl"
  cp "$build"/tests/engine/engine_mem_kind_cuda_test "$build"/tests/engine/engine_staged_cuda_test \
    "$build"/tests/engine/engine_interp_cuda_test \
    "$build"/tests/kernels/kernels_test "$stage/bin/"
  for t in all_reduce all_gather reduce_scatter sendrecv alltoall; do cp "$build/bench/${t}_perf" "$stage/bin/"; done
  cp -P "$build"/libloom.so* "$build"/libloom-cuda-kernels.so "$stage/lib/"
  cp "$build"/tests/engine/tunerplugins/libnccl-tuner-loomtest-v5.so \
    "$build"/tests/engine/tunerplugins/libnccl-tuner-loomtest-v6.so "$stage/lib/"
  cp -P "$build"/nccl/libnccl.so* "$stage/lib/nccl/"
  g++ -std=c++17 -O1 -o "$stage/bin/cuda_sync_probe" "$repo/scripts/gpu/cuda_sync_probe.cc" -ldl -lpthread
  if [ -n "${LOOM_NCCL_TESTS_SRC:-}" ]; then
    mkdir -p "$stage/nccl-tests"
    if [ -d "$LOOM_NCCL_TESTS_SRC/.git" ] || git -C "$LOOM_NCCL_TESTS_SRC" rev-parse HEAD >/dev/null 2>&1; then
      git -C "$LOOM_NCCL_TESTS_SRC" archive HEAD | tar -x -C "$stage/nccl-tests"
    else
      cp -r "$LOOM_NCCL_TESTS_SRC"/. "$stage/nccl-tests/"
    fi
  fi
  # nccl-tests' all_reduce_perf built here for sm_90 without MPI, with its CUDA runtime.
  if [ -d "$stage/nccl-tests/src" ] && [ -f "${CUDA_HOME:-/usr/local/cuda}/include/nccl.h" ]; then
    make -C "$stage/nccl-tests/src" -j "${LOOM_JOBS:-$(nproc)}" BUILDDIR="$stage/nccl-tests/build" \
      "$stage/nccl-tests/build/all_reduce_perf" NCCL_HOME="${CUDA_HOME:-/usr/local/cuda}" \
      CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" MPI=0 NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" >/dev/null
    find "$stage/nccl-tests/build" -name '*.o' -delete
    cp -L "$(ldd "$stage/nccl-tests/build/all_reduce_perf" | awk '/libcudart/ {print $3}')" "$stage/nccl-tests/build/"
  fi
  git -C "$repo" rev-parse --short HEAD >"$stage/commit"
  echo "gpu_check: staged $(du -sh "$stage" | cut -f1) in .gpu (limit 64 MiB with the tree)"
}

[ "$mode" = prepare ] && { prepare; exit $?; }
if [ "$mode" != run ]; then
  echo "usage: scripts/gpu_check.sh prepare | run [DIR]" >&2
  exit 2
fi

out="${2:-${OUT:-$stage/out}}"
mkdir -p "$out"
log="$out/gpu_check.log"
md="$out/gpu_check.md"
: >"$log"
rows=()
write_md() {  # the table so far: a run cut short by the call's limit still brings it back
  {
    echo "# GPU check ($(date -u +%Y-%m-%d), Loom $(cat "$stage/commit" 2>/dev/null))"
    echo
    echo "| check | result | detail |"
    echo "|---|---|---|"
    printf '%s\n' "${rows[@]}"
  } >"$md"
}
row() {
  if [ "$(tail -1 "$out/step.out" 2>/dev/null)" = "skipped by LOOM_GPU_SKIP" ]; then
    : >"$out/step.out"
    return
  fi
  rows+=("| $1 | $2 | $3 |"); echo "gpu_check: $1: $2 ($3)" | tee -a "$log"; write_md; }
# step <name> <timeout s> <command...>: output to the log; returns the command's status
# (124 when it ran out of time). A command still running at its limit first has the
# stacks of its processes written to the log (cuda-gdb, where there is one), then is
# killed with everything it started: a hang costs its own row, and says where it hung.
step() {
  local name="$1" limit="$2"; shift 2
  # LOOM_GPU_SKIP: an extended regex of step names not to run (to rerun a part in a short call)
  if [ -n "${LOOM_GPU_SKIP:-}" ] && [[ "$name" =~ $LOOM_GPU_SKIP ]]; then
    echo "=== $name: skipped (LOOM_GPU_SKIP)" >>"$log"
    echo "skipped by LOOM_GPU_SKIP" >"$out/step.out"
    return 99
  fi
  echo "=== $name: $*" >>"$log"
  local t0=$SECONDS
  setsid "$@" >"$out/step.out" 2>&1 </dev/null &
  local pid=$! rc
  step_pid=$pid  # killed with its descendants if the script itself is stopped
  while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "=== $name: still running after $limit s: stacks" >>"$out/step.out"
    dump_stacks "$pid" >>"$out/step.out" 2>&1
    kill_tree "$pid"
    wait "$pid" 2>/dev/null
    rc=124
  else
    wait "$pid"
    rc=$?
  fi
  step_pid=
  cat "$out/step.out" >>"$log"
  echo "=== $name: exit $rc after $((SECONDS - t0)) s" >>"$log"
  return $rc
}
# A process and all its descendants (mpirun's ranks and torchrun's workers may leave the
# step's process group, not its tree).
tree() {
  local p
  echo "$1"
  for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do tree "$p"; done
}
kill_tree() {
  local pids
  pids=$(tree "$1")
  kill -TERM $pids 2>/dev/null  # mpirun and torchrun pass it on
  sleep 2
  kill -KILL $pids 2>/dev/null
  kill -KILL -- "-$1" 2>/dev/null
}
step_pid=
trap '[ -n "$step_pid" ] && kill_tree "$step_pid"' EXIT
trap '[ -n "$step_pid" ] && kill_tree "$step_pid"; exit 143' TERM INT
# The threads' stacks of a step that hangs: its process tree (at most 9 processes, 20 s each).
dump_stacks() {
  local gdb
  gdb=$(command -v cuda-gdb || command -v gdb) || { echo "(no gdb to read stacks with)"; return; }
  local n=0 p
  for p in $(tree "$1"); do
    [ $n -ge 9 ] && break
    n=$((n + 1))
    echo "--- stacks of pid $p ($(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | head -c 120))"
    timeout -k 2 20 "$gdb" -q -batch -p "$p" -ex 'thread apply all bt 12' 2>&1 |
      grep -E '^(Thread|#)' | head -150
  done
}
gtest_summary() {  # "N passed, M failed, K skipped" from the last step's output
  local p f s
  p=$(grep -oE '\[  PASSED  \] [0-9]+' "$out/step.out" | grep -oE '[0-9]+$' | tail -1)
  # (gtest names each failed or skipped test twice: as it runs and in its summary)
  f=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$out/step.out" | awk '{print $4}' | sort -u | wc -l)
  s=$(grep -E '^\[  SKIPPED \] [A-Za-z]' "$out/step.out" | awk '{print $4}' | sort -u | wc -l)
  echo "${p:-0} passed, $f failed, $s skipped"
}
perf_summary() {  # the first and largest rows' out-of-place time and busbw, #wrong, footer,
  # and what served the device buffers (the INIT log of the run's first rank)
  local first last wrong served
  first=$(grep -E '^ +[0-9]+ +[0-9]+ ' "$out/step.out" | head -1 | awk '{print $1" B: "$6" us"}')
  last=$(grep -E '^ +[0-9]+ +[0-9]+ ' "$out/step.out" | tail -1 | awk '{print $1" B: "$6" us, "$8" GB/s busbw, "$9" wrong"}')
  [ -n "$first" ] && last="$first; $last"
  wrong=$(grep -E 'Out of bounds values' "$out/step.out" | sed 's/# *//')
  served=$(grep -m1 -oE 'device buffers served by [^(:;]*' "$out/step.out" | sed 's/device buffers //')
  served="${served%"${served##*[! ]}"}"
  local no
  no=$(grep -m1 -oE 'no device executor \(LOOM_DEVICE_EXECUTOR=kernel\): .*' "$out/step.out" | cut -c1-200)
  echo "${last:-no rows}; ${wrong:-no footer}${served:+; $served}${no:+; $no}"
}

[ -d "$stage/bin" ] || { echo "gpu_check: no .gpu/bin: run 'scripts/gpu_check.sh prepare' here and carry .gpu" >&2; exit 2; }
export LD_LIBRARY_PATH="$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LOOM_TIMEOUT=120
echo "gpu_check: Loom $(cat "$stage/commit" 2>/dev/null) on $(hostname)" | tee -a "$log"

# 1. The GPU and stock NCCL.
if step gpu 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; then
  row "GPU" ok "$(head -1 "$out/step.out")"
else
  row "GPU" FAILED "nvidia-smi: $(head -1 "$out/step.out")"
fi
py=python3
# What the machine offers the later rows (recorded, never a failure).
row "tools" info "$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' | head -1); torch $($py -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null || echo none); mpirun $(command -v mpirun >/dev/null && echo yes || echo no); compute-sanitizer $(command -v compute-sanitizer >/dev/null && echo yes || echo no)"
stock=$($py - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia.nccl as n
    roots = list(n.__path__)
except Exception:
    roots = []
for r in roots:
    for f in glob.glob(os.path.join(r, "lib", "libnccl.so*")):
        print(os.path.realpath(f)); raise SystemExit
EOF
)
if [ -n "$stock" ]; then
  row "stock NCCL" ok "$stock"
  export LOOM_NCCL_LIBRARY="$stock"
else
  row "stock NCCL" missing "no nvidia.nccl beside python3's torch: fallback rows run without it"
fi

# Which driver calls wait for a stream held by cuStreamWaitValue32 (the staged path holds
# a rank's stream so until its peers arrive): a rank thread making such a call deadlocks.
if [ -x "$stage/bin/cuda_sync_probe" ]; then
  step cuda-sync-probe 60 "$stage/bin/cuda_sync_probe"
  rc=$?
  row "driver calls that wait for a held stream" "$([ $rc = 0 ] && echo info || echo FAILED)" \
    "$(grep -E 'WAITS|BLOCKED' "$out/step.out" | sed -E 's/^probe: *//; s/ +(WAITS|STILL).*//' | paste -sd ';' -)"
fi

# 2. Loom's tests against the real driver (the staged tests once more with the CUDA kernels
# module, which rank threads on one GPU reduce between their buffers with).
for t in engine_mem_kind_cuda_test engine_staged_cuda_test; do
  step "$t" 90 "$stage/bin/$t"
  rc=$?
  row "$t" "$([ $rc = 0 ] && echo ok || echo FAILED)" "$(gtest_summary)"
done
step engine_staged_cuda_test-kernels 90 env LOOM_CUDA_KERNELS_LIBRARY="$stage/lib/libloom-cuda-kernels.so" \
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL "$stage/bin/engine_staged_cuda_test" --gtest_filter='-*DeviceExecutor*'
rc=$?
row "engine_staged_cuda_test, CUDA kernels module" "$([ $rc = 0 ] && echo ok || echo FAILED)" \
  "$(gtest_summary); $(grep -E 'collectives went direct' "$out/step.out" | paste -sd ';' -)"
# The device executor (LOOM_DEVICE_EXECUTOR=kernel, engine/device_exec.h): every collective
# as the plan-interpreter kernel over FIFOs in device memory, ranks as processes (CUDA IPC)
# and as threads on GPU 0; a dead peer and an abort.
step engine_staged_cuda_test-executor 120 env LOOM_CUDA_KERNELS_LIBRARY="$stage/lib/libloom-cuda-kernels.so" \
  LOOM_TEST_TUNER_PLUGIN="$stage/lib/libnccl-tuner-loomtest-v5.so" \
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL "$stage/bin/engine_staged_cuda_test" --gtest_filter='*DeviceExecutor*'
rc=$?
row "engine_staged_cuda_test, device executor" "$([ $rc = 0 ] && echo ok || echo FAILED)" \
  "$(gtest_summary); $(grep -oE '^[0-9]+ ranks: [0-9]+ kernel launches' "$out/step.out" | awk '{s += $3} END {print s + 0}') kernel launches"
step kernels_cuda_parity 60 "$stage/bin/kernels_test" --gtest_filter='*Cuda*'
rc=$?
row "CUDA reduction kernels vs CPU" "$([ $rc = 0 ] && echo ok || echo FAILED)" "$(gtest_summary)"

# The device executor's kernel: every rank a launch on GPU 0, against the host interpreter.
step interp-kernel 150 "$stage/bin/engine_interp_cuda_test"
rc=$?
row "device executor kernel (plan interpreter) vs host threads" "$([ $rc = 0 ] && echo ok || echo FAILED)" \
  "$(gtest_summary); $(grep -m1 -E 'Failure|differs|never finished|status' "$out/step.out" | head -c 300)"

# The staged path under compute-sanitizer (memcheck): four ranks as threads on one device.
if command -v compute-sanitizer >/dev/null; then
  step compute-sanitizer 90 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$stage/bin/engine_staged_cuda_test" --gtest_filter='*FourRanksShareOneDeviceAsThreads*:*CapturedCollectivesRunAtEveryReplay*'
  rc=$?
  row "compute-sanitizer memcheck, staged path" "$([ $rc = 0 ] && echo ok || echo FAILED)" \
    "$(gtest_summary); $(grep -m1 -E 'ERROR SUMMARY' "$out/step.out" | sed 's/=* *//')"
fi

# 3. Loom's own benchmark on device buffers.
perf=(-b 8 -e 256M -f 8 -n 5 -w 2 -c 1 -M device)
run_perf() {  # run_perf <label> <env...> -- <args...>
  local label="$1"; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local tool="${label%% *}"  # every label starts with its tool's name
  step "$label" 60 env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT "${envs[@]}" "$stage/bin/$tool" "${perf[@]}" "$@"
  local rc=$?
  row "$label" "$([ $rc = 0 ] && echo ok || echo FAILED)" "$(perf_summary)"
}
[ -n "$stock" ] && run_perf "all_reduce_perf 1 rank, stock NCCL (fallback)" LOOM_NCCL_FALLBACK=force --
run_perf "all_reduce_perf 1 rank, staged" LOOM_NCCL_FALLBACK=off --
run_perf "all_reduce_perf 2 ranks on GPU 0 (threads), staged" LOOM_NCCL_FALLBACK=off -- -t 2
# The same through the host engine (no CUDA kernels module): side by side with the direct
# reductions between the rank threads' buffers above.
run_perf "all_reduce_perf 2 ranks on GPU 0 (threads), host engine" LOOM_NCCL_FALLBACK=off \
  LOOM_CUDA_KERNELS_LIBRARY=/nonexistent/libloom-cuda-kernels.so -- -t 2
run_perf "all_reduce_perf 2 ranks on GPU 0 (processes), staged" LOOM_NCCL_FALLBACK=off -- -np 2
# Rank processes on one GPU go direct through CUDA IPC (engine/device_board.h); the same
# through the host engine, side by side.
run_perf "all_reduce_perf 2 ranks on GPU 0 (processes), host engine" LOOM_NCCL_FALLBACK=off \
  LOOM_LOCAL_DIRECT=0 -- -np 2
# The device executor (LOOM_DEVICE_EXECUTOR=kernel) on the same rank layouts, side by side
# with the rows above: rank processes on one GPU (CUDA IPC; without MPS their kernels take
# turns in time slices); rank threads sharing one GPU are declined (the INIT log says why)
# and take the direct path; one rank.
kexec=(LOOM_NCCL_FALLBACK=off LOOM_DEVICE_EXECUTOR=kernel LOOM_CUDA_KERNELS_LIBRARY="$stage/lib/libloom-cuda-kernels.so")
run_perf "all_reduce_perf 1 rank, device executor" "${kexec[@]}" --
run_perf "all_reduce_perf 2 ranks on GPU 0 (threads), device executor asked" "${kexec[@]}" -- -t 2
run_perf "all_reduce_perf 2 ranks on GPU 0 (processes), device executor" "${kexec[@]}" -- -np 2
run_perf "all_reduce_perf 4 ranks on GPU 0 (threads), staged" LOOM_NCCL_FALLBACK=off -- -t 4
run_perf "all_reduce_perf 8 ranks on GPU 0 (processes), staged" LOOM_NCCL_FALLBACK=off -- -np 8
perf=(-b 8 -e 64M -f 8 -n 3 -w 1 -c 1 -M device)
for t in all_gather reduce_scatter sendrecv; do
  run_perf "${t}_perf 3 ranks on GPU 0 (threads), staged" LOOM_NCCL_FALLBACK=off -- -t 3
done
# Sends and receives (all-to-all is a group of them) as one kernel per group.
for t in sendrecv alltoall; do
  run_perf "${t}_perf 3 ranks on GPU 0 (processes), device executor" "${kexec[@]}" -- -np 3
done
# Every data type and reduction on device buffers, checked (-c 1), small and medium sizes:
# ranks as threads and as processes on GPU 0.
perf=(-b 8 -e 256K -f 16 -n 1 -w 1 -c 1 -d all -M device)
for t in all_reduce reduce_scatter all_gather sendrecv; do
  ops=()
  case $t in all_reduce|reduce_scatter) ops=(-o all) ;; esac
  run_perf "${t}_perf every type${ops:+ and op}, 3 ranks (threads), staged" LOOM_NCCL_FALLBACK=off -- -t 3 "${ops[@]}"
  run_perf "${t}_perf every type${ops:+ and op}, 4 ranks (processes), staged" LOOM_NCCL_FALLBACK=off -- -np 4 "${ops[@]}"
done
perf=(-b 8 -e 256M -f 8 -n 5 -w 2 -c 1 -M device)
run_perf "all_reduce_perf 8 ranks on GPU 0 (threads), staged" LOOM_NCCL_FALLBACK=off -- -t 8
run_perf "all_reduce_perf 8 ranks on GPU 0 (threads), device executor asked" "${kexec[@]}" -- -t 8
perf=(-b 8 -e 256K -f 16 -n 1 -w 1 -c 1 -d all -o all -M device)
run_perf "all_reduce_perf every type and op, 3 ranks (processes), device executor" "${kexec[@]}" -- -np 3
# Small messages, plain and inside a CUDA graph (issue 11's latency targets).
perf=(-b 8 -e 1K -f 4 -n 50 -w 5 -c 1 -M device)
run_perf "all_reduce_perf 8 B-1 KiB 2 ranks (threads), staged" LOOM_NCCL_FALLBACK=off -- -t 2
run_perf "all_reduce_perf 8 B-1 KiB 2 ranks (processes), device executor (LL)" "${kexec[@]}" -- -np 2
run_perf "all_reduce_perf 8 B-1 KiB 1 rank, device executor (LL)" "${kexec[@]}" --
run_perf "all_reduce_perf 8 B-1 KiB 1 rank, device executor, Simple" "${kexec[@]}" LOOM_DEVICE_LL_BYTES=0 --
run_perf "all_reduce_perf 8 B-1 KiB 1 rank, device executor (LL), CUDA graph" "${kexec[@]}" -- -G 10
run_perf "all_reduce_perf 8 B-1 KiB 2 ranks (processes), device executor (LL), CUDA graph" "${kexec[@]}" -- -np 2 -G 10
# Ranks as threads on one GPU share a CUDA context: their staged calls run on the calling
# thread, so that no stream waits on the GPU for another rank's (engine/staged.h). With one
# work queue for every stream (CUDA_DEVICE_MAX_CONNECTIONS=1) a wait on the GPU would hold
# the other ranks' streams at once; capturing such calls into a graph is refused.
run_perf "all_reduce_perf 8 B-1 KiB 4 ranks (threads), staged, one work queue" LOOM_NCCL_FALLBACK=off \
  CUDA_DEVICE_MAX_CONNECTIONS=1 -- -t 4
step "graph of rank threads refused" 60 env LOOM_NCCL_FALLBACK=off "$stage/bin/all_reduce_perf" \
  "${perf[@]}" -t 2 -G 10
rc=$?
msg=$(grep -m1 -oE 'run in this process on the same CUDA device' "$out/step.out")
row "all_reduce_perf 2 ranks (threads), staged, CUDA graph: refused" \
  "$([ $rc != 0 ] && [ $rc != 124 ] && [ -n "$msg" ] && echo ok || echo FAILED)" "exit $rc; ${msg:-no refusal message}"
run_perf "all_reduce_perf 8 B-1 KiB 2 ranks (processes), staged, CUDA graph" LOOM_NCCL_FALLBACK=off -- -np 2 -G 10
run_perf "all_reduce_perf 8 B-1 KiB 1 rank, staged, CUDA graph" LOOM_NCCL_FALLBACK=off -- -G 10
[ -n "$stock" ] && run_perf "all_reduce_perf 8 B-1 KiB 1 rank, stock NCCL, CUDA graph" LOOM_NCCL_FALLBACK=force -- -G 10

# 4. nccl-tests: stock, then Loom preloaded. all_reduce_perf without MPI comes built from
# prepare (1 rank); with mpirun and mpicc here it is built with MPI for 2 ranks on GPU 0.
nt="$stage/nccl-tests"
homes=$(mktemp -d)
nccl_home=""
[ -n "$stock" ] && nccl_home="$(dirname "$(dirname "$stock")")"
nt_row() {  # nt_row <label> <rc>
  row "$1" "$([ "$2" = 0 ] && echo ok || echo FAILED)" "$(perf_summary)"
}
if [ -z "$stock" ]; then
  row "nccl-tests" skipped "no stock NCCL beside torch"
else
  # The wheel has libnccl.so.2 only; the link wants libnccl.so: a home with both.
  nh="$homes/nccl"
  mkdir -p "$nh/lib"
  ln -sfn "$nccl_home/include" "$nh/include"
  ln -sf "$stock" "$nh/lib/libnccl.so"
  ln -sf "$stock" "$nh/lib/libnccl.so.2"
  args=(-b 8 -e 256M -f 8 -n 5 -w 2 -c 1 -g 1)
  ntp="$nt/build/all_reduce_perf"
  if [ -x "$ntp" ]; then
    step "nccl-tests stock" 60 env LD_LIBRARY_PATH="$nh/lib:$nt/build" "$ntp" "${args[@]}"
    nt_row "nccl-tests all_reduce_perf, stock NCCL, 1 rank" $?
    step "nccl-tests loom" 90 env LD_PRELOAD="$stage/lib/nccl/libnccl.so.2" LOOM_NCCL_FALLBACK=off \
      LD_LIBRARY_PATH="$nh/lib:$nt/build" "$ntp" "${args[@]}"
    nt_row "nccl-tests all_reduce_perf, Loom preloaded (staged), 1 rank" $?
    # -R 2: buffers from ncclMemAlloc registered as symmetric windows (in a group), which
    # under Loom are stock NCCL's (docs/gpu.md): stock alone, then through Loom.
    step "nccl-tests stock -R 2" 60 env LD_LIBRARY_PATH="$nh/lib:$nt/build" "$ntp" "${args[@]}" -R 2
    nt_row "nccl-tests all_reduce_perf -R 2 (windows), stock NCCL, 1 rank" $?
    step "nccl-tests loom -R 2" 90 env LD_PRELOAD="$stage/lib/nccl/libnccl.so.2" LOOM_NCCL_FALLBACK=force \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ALLOC LD_LIBRARY_PATH="$nh/lib:$nt/build" "$ntp" "${args[@]}" -R 2
    nt_row "nccl-tests all_reduce_perf -R 2 (windows), Loom preloaded, stock NCCL (force), 1 rank" $?
  else
    row "nccl-tests, 1 rank" skipped "not built at prepare (nvcc and nccl.h there)"
  fi
  # nccl-tests looks for MPI_HOME/include/mpi.h and MPI_HOME/lib: a home made of where
  # mpicc says they are (Open MPI's --showme, MPICH's -show).
  inc="" libd=""
  if command -v mpirun >/dev/null && command -v mpicc >/dev/null; then
    inc=$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')
    libd=$(mpicc --showme:libdirs 2>/dev/null | awk '{print $1}')
    [ -z "$inc" ] && inc=$(mpicc -show 2>/dev/null | grep -oE -- '-I[^ ]+' | head -1 | cut -c3-)
    [ -z "$libd" ] && libd=$(mpicc -show 2>/dev/null | grep -oE -- '-L[^ ]+' | head -1 | cut -c3-)
  fi
  if [ ! -d "$nt/src" ] || [ ! -f "$nccl_home/include/nccl.h" ]; then
    row "nccl-tests, 2 ranks on GPU 0" skipped "no nccl-tests source staged, or no stock nccl.h"
  elif [ ! -f "$inc/mpi.h" ] || [ ! -d "$libd" ]; then
    row "nccl-tests, 2 ranks on GPU 0" skipped "no MPI (mpirun, mpicc, mpi.h): nccl-tests' threads take one GPU each"
  else
    mh="$homes/mpi"
    mkdir -p "$mh"
    ln -sfn "$inc" "$mh/include"
    ln -sfn "$libd" "$mh/lib"
    cuda_home="$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")"
    ntb="$homes/build-mpi"
    if step nccl-tests-build 150 make -C "$nt/src" -j 16 BUILDDIR="$ntb" "$ntb/all_reduce_perf" \
        NCCL_HOME="$nh" CUDA_HOME="$cuda_home" MPI=1 MPI_HOME="$mh" \
        NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"; then
      step "nccl-tests loom 2 ranks" 90 mpirun --allow-run-as-root --oversubscribe -np 2 \
        -x LD_PRELOAD="$stage/lib/nccl/libnccl.so.2" -x NCCL_TESTS_DEVICE=0 -x LOOM_NCCL_FALLBACK=off \
        -x LD_LIBRARY_PATH="$nh/lib:$LD_LIBRARY_PATH" "$ntb/all_reduce_perf" "${args[@]}"
      nt_row "nccl-tests all_reduce_perf, Loom preloaded, 2 ranks (MPI) on GPU 0" $?
    else
      row "nccl-tests with MPI" FAILED "build: $(grep -m1 -E 'error' "$out/step.out")"
    fi
  fi
fi

# 5. torch's ProcessGroupNCCL over Loom, two processes on one GPU.
if $py -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  step torch-preload 120 env LD_PRELOAD="$stage/lib/nccl/libnccl.so.2" \
    $py -m torch.distributed.run --standalone --nproc-per-node 2 "$repo/scripts/gpu/torch_preload_check.py"
  rc=$?
  row "torch ProcessGroupNCCL, Loom preloaded, 2 processes on GPU 0" \
    "$([ $rc = 0 ] && echo ok || echo FAILED)" "$(grep -E '^torch_preload_check:' "$out/step.out" | tail -1)"
else
  row "torch ProcessGroupNCCL under LD_PRELOAD" skipped "python3 has no CUDA torch"
fi

write_md
rm -f "$out/step.out"
cat "$md"
grep -q "| FAILED |" "$md" && exit 1
exit 0
