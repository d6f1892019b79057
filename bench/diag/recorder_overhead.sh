#!/usr/bin/env bash
# What the flight recorder costs (issue 14: "with the recorder on (default), host
# all-reduce at 8 B within 3% of it off"): all_reduce_perf at 8 B with 2 forked ranks,
# LOOM_FLIGHT_RECORDER=0 and the default alternately (which goes first alternates too),
# ROUNDS rounds each, in one run on one machine; prints each round's time and the medians.
#
#   bench/diag/recorder_overhead.sh [build-dir]     ROUNDS=31 ITERS=200000 RANKS=2
set -euo pipefail
build="${1:-$(cd "$(dirname "$0")/../.." && pwd)/build}"
tool="$build/bench/all_reduce_perf"
rounds="${ROUNDS:-31}" iters="${ITERS:-200000}" ranks="${RANKS:-2}"
[[ -x "$tool" ]] || { echo "recorder_overhead: no $tool (build first)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
json="$tmp/report.json"
run() {  # prints the out-of-place time in us of one 8-byte run (the JSON report's 6 digits)
  rm -f "$json"
  env "$@" "$tool" --nranks "$ranks" -b 8 -e 8 -n "$iters" -w 2000 -c 0 -J "$json" > /dev/null
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["results"][0]["out_of_place"]["time"])' "$json"
}
off=() on=()
for ((i = 0; i < rounds; i++)); do
  # Alternate which goes first, so that neither always runs on the other's heels.
  if ((i % 2 == 0)); then
    off+=("$(run LOOM_FLIGHT_RECORDER=0)")
    on+=("$(run LOOM_FLIGHT_RECORDER=1024)")
  else
    on+=("$(run LOOM_FLIGHT_RECORDER=1024)")
    off+=("$(run LOOM_FLIGHT_RECORDER=0)")
  fi
  echo "round $i: recorder off ${off[-1]} us, on ${on[-1]} us"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
m_off=$(median "${off[@]}") m_on=$(median "${on[@]}")
awk -v a="$m_off" -v b="$m_on" -v n="$rounds" -v r="$ranks" 'BEGIN {
  printf "8 B all-reduce, %d ranks, median of %d rounds: recorder off %.3f us, on %.3f us (%+.1f%%)\n",
         r, n, a, b, (b - a) / a * 100 }'
