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
# Ports below Linux's ephemeral range (32768-60999), where the suite's own outgoing
# connections cannot be holding them; a port some other program listens on is retried.
run() {
  port=$((15000 + RANDOM % 10000))
  export LOOM_HOSTID=one-host LOOM_SHM_CMA=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 \
         NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LOOM_BOOTSTRAP_TIMEOUT=30
  RANK=0 LOCAL_RANK=0 timeout 60 "$tool" -b 4M -e 4M -c 1 -n 2 -w 1 >"$dir/r0" 2>&1 &
  r0=$!
  local rc1=0 rc0=0
  RANK=1 LOCAL_RANK=1 timeout 60 unshare --pid --fork --mount-proc \
    "$tool" -b 4M -e 4M -c 1 -n 2 -w 1 >"$dir/r1" 2>&1 || rc1=$?
  wait "$r0" || rc0=$?
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] && return 0
  if grep -qi "address already in use" "$dir/r0"; then return 2; fi
  echo "rank 0 (exit $rc0):"; cat "$dir/r0"; echo "rank 1 (exit $rc1):"; cat "$dir/r1"
  return 1
}
for attempt in 1 2 3; do
  rc=0
  run || rc=$?
  [ "$rc" -eq 0 ] && break
  [ "$rc" -eq 2 ] && { echo "port $port is taken by another program; another port"; continue; }
  exit 1
done
[ "$rc" -eq 0 ] || { echo "no free port in 3 attempts"; exit 1; }
fail=0
for r in 0 1; do
  peer=$((1 - r))
  grep -q "transports \[$peer:socket\]" "$dir/r$r" ||
    { echo "rank $r did not reach rank $peer over socket:"; grep "Init COMPLETE" "$dir/r$r"; fail=1; }
done
grep -q "Out of bounds values : 0 OK" "$dir/r0" || { echo "rank 0: wrong results"; cat "$dir/r0"; fail=1; }
[ "$fail" -eq 0 ] && echo "pidns: two pid namespaces, one LOOM_HOSTID: socket transport, results exact"
exit "$fail"
