#!/usr/bin/env bash
# Verbs (NCCL_NET=IB) against the other networks inside the rxe VM (scripts/rxe_vm.sh):
# two ranks (forked by all_reduce_perf, shared memory off so every byte goes through the
# network), variants alternating in one boot, median busbw (MB/s, from the out-of-place
# time) over the repetitions; plus
# perftest's ib_write_bw on the same rxe device, the ceiling of raw RDMA WRITE there.
# rxe is software RoCE and the VM is emulated (TCG): the figures compare networks on this
# emulated device only and say nothing about InfiniBand or RoCE hardware.
#
#   bench/rxe/rxe_bench.sh [--reps N] [--build DIR] [-- all_reduce_perf args]
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
reps=3 build="$repo/build"
args=(-b 8 -e 16M -f 8 -n 10 -w 3)
while (($#)); do
  case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --) shift; args=("$@"); break ;;
    *) echo "rxe_bench: unknown option $1" >&2; exit 2 ;;
  esac
done
perf="$(readlink -f "$build/bench/all_reduce_perf")"
[[ -x "$perf" ]] || { echo "rxe_bench: no $perf (build first)" >&2; exit 2; }
variants=("ib|NCCL_NET=IB" "ib-4qp|NCCL_NET=IB NCCL_IB_QPS_PER_CONNECTION=4"
          "ib-4qp-split|NCCL_NET=IB NCCL_IB_QPS_PER_CONNECTION=4 NCCL_IB_SPLIT_DATA_ON_QPS=1"
          "ib-ar|NCCL_NET=IB NCCL_IB_ADAPTIVE_ROUTING=1"
          "net-socket|NCCL_NET=Socket" "socket|NCCL_IB_DISABLE=1")
cmd="cd /tmp
for r in \$(seq $reps); do"
for v in "${variants[@]}"; do
  cmd+="
  echo \"== ${v%%|*}\"; env ${v#*|} NCCL_SHM_DISABLE=1 $perf -np 2 ${args[*]} 2>&1 | grep -E '^ +[0-9]+ '"
done
cmd+="
done
timeout 60 ib_write_bw -d rxe0 -x 1 -a -n 100 >/tmp/s 2>&1 & sleep 2
timeout 60 ib_write_bw -d rxe0 -x 1 -a -n 100 127.0.0.1 2>&1 | grep -E '^ +[0-9]+ +100 ' | sed 's/^/wbw /'
wait"
out=$(LOOM_RXE_DIR="${LOOM_RXE_DIR:-$build/rxe}" "$repo/scripts/rxe_vm.sh" --timeout 600 --copy "$perf" -- "$cmd")
python3 - "$out" <<'PY'
import statistics, sys
rows, cur, wbw = {}, None, {}
for line in sys.argv[1].splitlines():
    if line.startswith("== "):
        cur = line[3:].strip()
    elif line.startswith("wbw "):
        f = line.split()
        wbw[int(f[1])] = float(f[4])
    elif cur and line.strip() and line.split()[0].isdigit():
        f = line.split()
        # busbw in MB/s from the out-of-place time (2 ranks: busbw = algbw = size / time)
        rows.setdefault(cur, {}).setdefault(int(f[0]), []).append(int(f[0]) / float(f[5]))
names = list(rows)
sizes = sorted(next(iter(rows.values())))
def human(b):
    for u, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s: return f"{b // s} {u}"
    return f"{b} B"
print("| size | " + " | ".join(names) + " | " + " | ".join(f"{n}/socket" for n in names if n != "socket") + " |")
print("|---:" * (1 + len(names) + len(names) - 1) + "|")
for s in sizes:
    med = {n: statistics.median(rows[n][s]) for n in names}
    ratio = [f"{med[n] / med['socket']:.2f}x" if med["socket"] else "-" for n in names if n != "socket"]
    print(f"| {human(s)} | " + " | ".join(f"{med[n]:.3g}" for n in names) + " | " + " | ".join(ratio) + " |")
if wbw:
    print("\nib_write_bw on rxe0 (MB/s, average): " + ", ".join(f"{human(k)} {v:.0f}" for k, v in sorted(wbw.items()) if k >= 4096))
PY
