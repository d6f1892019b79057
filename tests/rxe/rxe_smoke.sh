#!/usr/bin/env bash
# Inside the rxe VM: ibv_rc_pingpong (RC send/receive, 1000 x 64 KiB) and perftest's
# ib_write_bw (RDMA WRITE, 200 x 64 KiB) between two processes over rxe0. Fails unless
# both sides of both report their transfers.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
out=$("$repo/scripts/rxe_vm.sh" --timeout 300 -- '
  timeout 60 ibv_rc_pingpong -d rxe0 -g 1 -n 1000 -s 65536 >/tmp/s1 2>&1 & sleep 2
  timeout 60 ibv_rc_pingpong -d rxe0 -g 1 -n 1000 -s 65536 127.0.0.1 >/tmp/c1 2>&1; a=$?; wait $!; b=$?
  timeout 60 ib_write_bw -d rxe0 -x 1 -s 65536 -n 200 >/tmp/s2 2>&1 & sleep 2
  timeout 60 ib_write_bw -d rxe0 -x 1 -s 65536 -n 200 127.0.0.1 >/tmp/c2 2>&1; c=$?; wait $!; d=$?
  for f in s1 c1 s2 c2; do echo "== $f"; cat /tmp/$f; done
  echo "status $a $b $c $d"') || { rc=$?; echo "$out"; exit "$rc"; }
echo "$out"
fail() { echo "rxe_smoke: $*" >&2; exit 1; }
grep -q "^status 0 0 0 0$" <<<"$out" || fail "a verbs program failed inside the VM"
[[ $(grep -c "^131072000 bytes in" <<<"$out") -eq 2 ]] ||
  fail "ibv_rc_pingpong: expected both sides to report 131072000 bytes (1000 x 64 KiB each way)"
grep -qE "^ *65536 +200 +[0-9.]+ +[0-9.]+" <<<"$out" || fail "ib_write_bw: no 65536 x 200 result"
echo "rxe_smoke: RC send/receive and RDMA WRITE over rxe0 inside the VM: ok"
