#!/usr/bin/env bash
# One build against another at 8 B (a change to the path of every call): all_reduce_perf
# with 2 forked ranks from build A and build B alternately (which goes first alternates
# too), ROUNDS rounds each, in one run on one machine; prints each round and the medians.
# Run it also with A and B the same build: that spread is what the machine cannot resolve.
#
#   bench/diag/builds_ab.sh BUILD-A BUILD-B     ROUNDS=21 ITERS=1000000
set -euo pipefail
a="${1:?usage: builds_ab.sh BUILD-A BUILD-B}" b="${2:?usage: builds_ab.sh BUILD-A BUILD-B}"
rounds="${ROUNDS:-21}" iters="${ITERS:-1000000}"
for d in "$a" "$b"; do
  [[ -x "$d/bench/all_reduce_perf" ]] || { echo "builds_ab: no $d/bench/all_reduce_perf" >&2; exit 1; }
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
json="$tmp/report.json"
run() {  # the out-of-place time in us of one 8-byte run of build $1
  rm -f "$json"
  "$1/bench/all_reduce_perf" --nranks 2 -b 8 -e 8 -n "$iters" -w 2000 -c 0 -J "$json" > /dev/null
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["results"][0]["out_of_place"]["time"])' "$json"
}
A=() B=()
for ((i = 0; i < rounds; i++)); do
  if ((i % 2 == 0)); then
    A+=("$(run "$a")")
    B+=("$(run "$b")")
  else
    B+=("$(run "$b")")
    A+=("$(run "$a")")
  fi
  echo "round $i: A ${A[-1]} us, B ${B[-1]} us"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ma=$(median "${A[@]}") mb=$(median "${B[@]}")
awk -v a="$ma" -v b="$mb" -v n="$rounds" 'BEGIN {
  printf "8 B all-reduce, 2 ranks, median of %d rounds: A %.3f us, B %.3f us (B %+.1f%%)\n",
         n, a, b, (b - a) / a * 100 }'
