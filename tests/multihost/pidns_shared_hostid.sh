#!/usr/bin/env bash
# Two ranks told they share a host (one LOOM_HOSTID) but living in different pid
# namespaces: pids mean nothing across them, so shared memory (pidfd liveness,
# process_vm_readv, "same process" checks) must not be used. The ranks must connect over
# TCP and reduce correctly. Needs root (unshare --pid); LOOM_SKIP_NETNS=1 skips it.
#   pidns_shared_hostid.sh <all_reduce_perf>
set -euo pipefail
tool="$1"
if [ -n "${LOOM_SKIP_NETNS:-}" ]; then echo "skipped (LOOM_SKIP_NETNS)"; exit 77; fi
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
port=$((20000 + RANDOM % 20000))
export LOOM_HOSTID=one-host LOOM_SHM_CMA=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 \
       NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LOOM_BOOTSTRAP_TIMEOUT=30
RANK=0 LOCAL_RANK=0 timeout 60 "$tool" -b 4M -e 4M -c 1 -n 2 -w 1 >"$dir/r0" 2>&1 &
r0=$!
RANK=1 LOCAL_RANK=1 timeout 60 unshare --pid --fork --mount-proc \
  "$tool" -b 4M -e 4M -c 1 -n 2 -w 1 >"$dir/r1" 2>&1 || { cat "$dir/r1"; exit 1; }
wait "$r0" || { cat "$dir/r0"; exit 1; }
fail=0
for r in 0 1; do
  peer=$((1 - r))
  grep -q "transports \[$peer:socket\]" "$dir/r$r" ||
    { echo "rank $r did not reach rank $peer over socket:"; grep "Init COMPLETE" "$dir/r$r"; fail=1; }
done
grep -q "Out of bounds values : 0 OK" "$dir/r0" || { echo "rank 0: wrong results"; cat "$dir/r0"; fail=1; }
[ "$fail" -eq 0 ] && echo "pidns: two pid namespaces, one LOOM_HOSTID: socket transport, results exact"
exit "$fail"
