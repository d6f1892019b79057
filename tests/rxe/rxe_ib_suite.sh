#!/usr/bin/env bash
# Loom's verbs backend (NCCL_NET=IB) against real verbs: inside the rxe VM, the network
# backend conformance and peer-death suites over IB with 1 and 4 QPs per connection, the
# failure-injecting verbs table tests, collectives through the public API between ranks
# posing as hosts (named, by default, NCCL_IB_DISABLE), rails over two ports and a killed
# peer; then a 2-rank
# all_reduce_perf over net/IB with its result check.
#   rxe_ib_suite.sh <transports_test> <all_reduce_perf>
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
tt="$(readlink -f "$1")" perf="$(readlink -f "$2")"
filter='Net/NetBackendConformance.*/I*:Net/NetBackendDeath.*/I*:IbVerbs.*:IbKnobs.*:NetTransport.*Ib*'
# iproute2's ip as scripts/rxe_vm.sh copies it into the VM (the same path; busybox's own
# lacks "nodad").
ipbin=$(for b in /usr/bin/ip /bin/ip /sbin/ip /usr/sbin/ip; do [[ -x "$b" ]] && { echo "$b"; break; }; done)
# rxenet0 gets a second IPv4 address and an IPv6 one, so that rxe0's GID table offers
# what NCCL_IB_ADDR_FAMILY and NCCL_IB_ADDR_RANGE choose between (IbVerbs.GidChoiceAsNcclAsks).
out=$(LOOM_RXE_PORTS=2 "$repo/scripts/rxe_vm.sh" --timeout 600 --copy "$tt" --copy "$perf" -- "
  cd /tmp
  $ipbin addr add 10.78.0.1/24 dev rxenet0 && $ipbin -6 addr add fd77::1/64 dev rxenet0 nodad
  $tt --gtest_filter='$filter' >g.log 2>&1; echo \"gtest_status \$?\"
  grep -vE '^\[ +RUN +\]' g.log
  NCCL_NET=IB NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT $perf -np 2 -b 8 -e 4M \
    -f 8 -n 5 -w 1 -c 1 >p.log 2>&1; echo \"perf_status \$?\"
  grep -E 'Init COMPLETE|^ +[0-9]+ |Out of bounds|rror' p.log") || { rc=$?; echo "$out"; exit "$rc"; }
echo "$out"
fail() { echo "rxe_ib_suite: $*" >&2; exit 1; }
grep -q "^gtest_status 0$" <<<"$out" || fail "the verbs tests failed inside the VM"
# Every case ran against rxe0 (none skipped for want of a port): 10 conformance cases and
# 2 death cases per variant (IB, IbQps4, IbQps4Split, IbQps4Ar), 20 table cases (a flush by
# RDMA READ, the GID choice, asynchronous events and rxenet1 set down among them), 3
# through the API (rails over the VM's two ports, rxe0 and rxe1, among them).
for pat in '/IB ' '/IbQps4 ' '/IbQps4Split ' '/IbQps4Ar '; do
  n=$(grep -cE "^\[ +OK \] Net/NetBackend(Conformance|Death)\..*$pat" <<<"$out" || true)
  [[ "$n" -eq 12 ]] || fail "expected 12 backend cases over ${pat% } to pass, saw $n"
done
n=$(grep -cE '^\[ +OK \] IbVerbs\.' <<<"$out" || true)
[[ "$n" -eq 20 ]] || fail "expected 20 failure-injection cases to pass, saw $n"
n=$(grep -cE '^\[ +OK \] NetTransport\..*Ib' <<<"$out" || true)
[[ "$n" -eq 3 ]] || fail "expected 3 public-API cases over IB to pass (rails included), saw $n"
grep -q "^perf_status 0$" <<<"$out" || fail "all_reduce_perf over IB failed"
[[ $(grep -c "transports \[[01]:net/IB\] - Init COMPLETE" <<<"$out") -eq 2 ]] ||
  fail "all_reduce_perf's ranks did not connect through net/IB"
# nccl-tests columns: size count type redop root time algbw busbw #wrong (out of place, in place)
bad=$(awk '/^ +[0-9]+ +[0-9]+ +float/ { if ($9 != 0 || $13 != 0) print }' <<<"$out")
rows=$(grep -cE '^ +[0-9]+ +[0-9]+ +float' <<<"$out" || true)
[[ "$rows" -eq 7 && -z "$bad" ]] || fail "all_reduce_perf: expected 7 sizes with 0 wrong ($rows rows; wrong: $bad)"
echo "rxe_ib_suite: verbs backend conformance, failures, collectives and all_reduce_perf over rxe0: ok"
