#!/usr/bin/env bash
# Loom's RDMA device discovery (libibverbs through dlopen) against a real rxe device in the
# rxe VM: loom-info lists rxe0 port 1 as an active RoCE port, NCCL_IB_HCA selecting it by
# exact name and port is honoured, and a filter matching nothing names the ports there are.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
tool="$(readlink -f "$1")"
out=$("$repo/scripts/rxe_vm.sh" --copy "$tool" -- "
  echo A; $tool | grep 'RDMA ports'
  echo B; NCCL_IB_HCA==rxe0:1 $tool | grep 'RDMA ports'
  echo C; NCCL_IB_HCA=^rxe $tool | grep 'RDMA ports'
  echo D; NCCL_IB_HCA=mlx9 $tool | grep 'RDMA ports'") || { rc=$?; echo "$out"; exit "$rc"; }
echo "$out"
fail() { echo "rxe_loom_info: $*" >&2; exit 1; }
line() { sed -n "/^$1\$/{n;p}" <<<"$out"; }
[[ "$(line A)" == "  RDMA ports: rxe0:1 ACTIVE Ethernet (RoCE)" ]] || fail "A: rxe0:1 not listed as an active RoCE port"
[[ "$(line B)" == *"(NCCL_IB_HCA==rxe0:1 selects rxe0:1)" ]] || fail "B: exact name and port not selected"
[[ "$(line C)" == *"(NCCL_IB_HCA=^rxe matches no active RDMA port; active ports here: rxe0:1)" ]] ||
  fail "C: '^rxe' should exclude rxe0 and say what exists"
[[ "$(line D)" == *"(NCCL_IB_HCA=mlx9 matches no active RDMA port; active ports here: rxe0:1)" ]] ||
  fail "D: a filter matching nothing should name the active ports"
echo "rxe_loom_info: rxe0:1 discovered through dlopen'd libibverbs; NCCL_IB_HCA rules hold: ok"
