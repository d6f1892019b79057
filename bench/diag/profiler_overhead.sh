#!/usr/bin/env bash
# What an NCCL profiler plugin costs a host all-reduce at 8 B: all_reduce_perf with 2 forked
# ranks, without a plugin (NCCL_PROFILER_PLUGIN=none) and with PLUGIN alternately (which goes
# first alternates too), ROUNDS rounds each, in one run on one machine; prints the medians.
# The plugin's own settings come from the environment (NVIDIA's example plugin:
# NCCL_PROFILE_EVENT_MASK=1862 for every event Loom makes, NCCL_PROFILE_COLL_POOL_SIZE=4 and
# NCCL_PROFILE_P2P_POOL_SIZE=4 on a machine with less than 200 GiB).
#
#   bench/diag/profiler_overhead.sh PLUGIN [build-dir]     ROUNDS=21 ITERS=200000
set -euo pipefail
plugin="${1:?usage: profiler_overhead.sh PLUGIN [build-dir]}"
build="${2:-$(cd "$(dirname "$0")/../.." && pwd)/build}"
tool="$build/bench/all_reduce_perf"
rounds="${ROUNDS:-21}" iters="${ITERS:-200000}"
[[ -x "$tool" ]] || { echo "profiler_overhead: no $tool (build first)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
json="$tmp/report.json"
run() {  # the out-of-place time in us of one 8-byte run, with NCCL_PROFILER_PLUGIN=$1
  rm -f "$json"
  NCCL_PROFILER_PLUGIN="$1" "$tool" --nranks 2 -b 8 -e 8 -n "$iters" -w 2000 -c 0 -J "$json" > /dev/null
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["results"][0]["out_of_place"]["time"])' "$json"
}
off=() on=()
for ((i = 0; i < rounds; i++)); do
  if ((i % 2 == 0)); then
    off+=("$(run none)")
    on+=("$(run "$plugin")")
  else
    on+=("$(run "$plugin")")
    off+=("$(run none)")
  fi
  echo "round $i: no plugin ${off[-1]} us, plugin ${on[-1]} us"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
m_off=$(median "${off[@]}") m_on=$(median "${on[@]}")
awk -v a="$m_off" -v b="$m_on" -v n="$rounds" 'BEGIN {
  printf "8 B all-reduce, 2 ranks, median of %d rounds: no plugin %.3f us, plugin %.3f us (%+.1f%%)\n",
         n, a, b, (b - a) / a * 100 }'
