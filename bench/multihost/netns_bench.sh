#!/usr/bin/env bash
# All-reduce across emulated hosts: H Linux network namespaces x R ranks each, bridged on
# 10.213.0.0/24 (the layout of tests/multihost), ranks reaching rank 0 through NCCL_COMM_ID
# and each other over the veth picked by NCCL_SOCKET_IFNAME (TCP between namespaces, shm
# within one). Runs all_reduce_perf once per variant per repetition, the variants
# alternating so that drift on a shared machine hits all of them alike, and prints the
# median out-of-place busbw per size with each variant's ratio to the first.
#
#   sudo bench/multihost/netns_bench.sh [options]
#     --tool PATH         all_reduce_perf (default: $LOOM_BUILD_DIR or build/bench/all_reduce_perf)
#     --hosts H           namespaces (default 2)
#     --ranks-per-host R  (default 2)
#     --reps N            repetitions of every variant (default 5)
#     --rate RATE         shape every veth with tc tbf, e.g. 10gbit, to emulate a datacenter
#                         link (default: unshaped, as fast as the kernel moves TCP)
#     --variant NAME:ENV  a variant, e.g. 'ring:NCCL_ALGO=Ring' or 'ucx:NCCL_NET=UCX UCX_TLS=tcp'
#                         (ENV: space-separated VAR=VALUE, may be empty); repeatable; default:
#                         'ring:NCCL_ALGO=Ring' and 'default:' (the library's own choice)
#     --mpi NAME:ARGS     an Open MPI variant: bench/compare/mpi_allreduce.c (MPI_Allreduce,
#                         float sum) under mpirun with these extra arguments, e.g.
#                         'ompi-tcp:--mca pml ob1 --mca btl self,vader,tcp'; mpirun runs in host
#                         0's namespace and starts its daemons in the others through an "ssh"
#                         that enters the namespace; repeatable, alternating with the others
#     -b/-e/-f/-n/-w      passed to all_reduce_perf (default -b 1M -e 128M -f 4 -n 20 -w 5)
#
# Needs root (namespaces, tc). Everything it creates is named lmb<pid>-* and removed on exit;
# namespaces left by a killed run are removed by the next one.
set -euo pipefail

die() { echo "netns_bench: $*" >&2; exit 1; }

repo="$(cd "$(dirname "$0")/../.." && pwd)"
tool="${LOOM_BUILD_DIR:-$repo/build}/bench/all_reduce_perf"
hosts=2 per_host=2 reps=5 rate=""
perf_args=(-b 1M -e 128M -f 4 -n 20 -w 5)
custom_args=()
variants=()
while (($#)); do
  case "$1" in
    --tool) tool="$2"; shift 2 ;;
    --hosts) hosts="$2"; shift 2 ;;
    --ranks-per-host) per_host="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --variant) variants+=("$2"); shift 2 ;;
    --mpi) variants+=("${2%%:*}:@mpi ${2#*:}"); shift 2 ;;
    -b|-e|-f|-n|-w) custom_args+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
((${#custom_args[@]})) && perf_args=(-n 20 -w 5 "${custom_args[@]}")
((${#variants[@]})) || variants=("ring:NCCL_ALGO=Ring" "default:")
[[ $EUID -eq 0 ]] || die "needs root: it creates network namespaces"
[[ -x "$tool" ]] || die "no all_reduce_perf at $tool (build it, or pass --tool)"
command -v ip >/dev/null || die "needs iproute2 (ip)"
[[ -z "$rate" ]] || command -v tc >/dev/null || die "--rate needs tc"

prefix="lmb$$-"
work="$(mktemp -d /tmp/loom-netns-bench.XXXXXX)"

remove_ns() {  # kill what runs inside, then delete (the veths go with the namespaces)
  for ns in "$@"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done
  for ns in "$@"; do ip netns del "$ns" 2>/dev/null || true; done
}
cleanup() {
  local mine=()
  mapfile -t mine < <(ip netns list | awk '{print $1}' | grep "^$prefix" || true)
  if ((${#mine[@]})); then remove_ns "${mine[@]}"; fi
  [[ -n "${LOOM_BENCH_KEEP:-}" ]] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# Leftovers of earlier runs that were killed before their trap ran.
for ns in $(ip netns list | awk '{print $1}' | grep -E '^lmb[0-9]+-' || true); do
  pid="${ns#lmb}"; pid="${pid%%-*}"
  kill -0 "$pid" 2>/dev/null || remove_ns "$ns"
done

# The switch: a bridge in a namespace of its own; host k is namespace ${prefix}k with mh0.
sw="${prefix}sw"
ip netns add "$sw"
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
for ((k = 0; k < hosts; k++)); do
  ns="$prefix$k"
  ip netns add "$ns"
  ip -n "$sw" link add "p$k" type veth peer name mh0 netns "$ns"
  ip -n "$sw" link set "p$k" master br0 up
  ip -n "$ns" addr add "10.213.0.$((k + 1))/24" dev mh0
  ip -n "$ns" link set mh0 up
  ip -n "$ns" link set lo up
  if [[ -n "$rate" ]]; then
    # Both directions: the host's egress, and the switch port's egress towards the host.
    ip netns exec "$ns" tc qdisc add dev mh0 root tbf rate "$rate" burst 4mb latency 50ms
    ip netns exec "$sw" tc qdisc add dev "p$k" root tbf rate "$rate" burst 4mb latency 50ms
  fi
done

nranks=$((hosts * per_host))
run=0
# run_variant NAME "ENV" -> appends "NAME size busbw" lines to $work/results
run_variant() {
  local name="$1" vars="$2" out="$work/run$run.out" port=$((29500 + run % 1000)) pids=()
  run=$((run + 1))
  for ((r = 0; r < nranks; r++)); do
    local host=$((r / per_host))
    # shellcheck disable=SC2086  # $vars is a list of VAR=VALUE words
    ip netns exec "$prefix$host" env -u NCCL_ALGO -u LOOM_ALGO -u LOOM_HOSTID -u NCCL_COMM_ID \
      RANK=$r WORLD_SIZE=$nranks LOCAL_RANK=$((r % per_host)) LOCAL_WORLD_SIZE=$per_host \
      NCCL_COMM_ID="10.213.0.1:$port" NCCL_SOCKET_IFNAME=mh0 $vars \
      timeout -k 5 600 "$tool" "${perf_args[@]}" >"$out.$r" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  if ((failed)); then
    cat "$out".* >&2
    die "variant $name (run $run) failed"
  fi
  # Rank 0 prints the table: size count type redop root time algbw busbw #wrong ...
  awk -v v="$name" '$1 ~ /^[0-9]+$/ && NF >= 13 {
      if ($9 != 0 || $13 != 0) { print "WRONG " $0 > "/dev/stderr"; exit 7 }
      print v, $1, $8 }' "$out.0" >>"$work/results" || die "variant $name: wrong results"
}

# Open MPI variants: mpi_allreduce over the sizes all_reduce_perf's -b/-e/-f/-n/-w give.
mpi_setup() {
  command -v mpicc >/dev/null && command -v mpirun >/dev/null ||
    die "--mpi needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
  mpicc -O2 -o "$work/mpi_allreduce" "$repo/bench/compare/mpi_allreduce.c" || die "mpicc failed"
  local b=1048576 e=134217728 f=4 n=20 w=5 i sizes=""
  for ((i = 0; i < ${#perf_args[@]}; i += 2)); do
    case "${perf_args[i]}" in
      -b) b=$(numfmt --from=iec "${perf_args[i+1]}") ;; -e) e=$(numfmt --from=iec "${perf_args[i+1]}") ;;
      -f) f="${perf_args[i+1]}" ;; -n) n="${perf_args[i+1]}" ;; -w) w="${perf_args[i+1]}" ;;
    esac
  done
  for ((i = b; i <= e; i *= f)); do sizes+="${sizes:+,}$i:$n:$w"; done
  mpi_sizes="$sizes"
  for ((k = 0; k < hosts; k++)); do echo "10.213.0.$((k + 1)) slots=$per_host"; done >"$work/hosts"
  # mpirun's "ssh": the host is an address 10.213.0.<k+1>; the command runs in namespace k.
  cat >"$work/agent.sh" <<AGENT
#!/bin/sh
host="\$1"; shift
exec ip netns exec "$prefix\$((\${host##*.} - 1))" sh -c "\$*"
AGENT
  chmod +x "$work/agent.sh"
}
# run_mpi NAME "ARGS" -> appends "NAME size busbw" lines to $work/results
run_mpi() {
  local name="$1" args="$2" out="$work/run$run.mpi"
  run=$((run + 1))
  # shellcheck disable=SC2086  # $args is a list of mpirun arguments
  ip netns exec "${prefix}0" timeout -k 5 600 mpirun --allow-run-as-root --oversubscribe \
    -np "$nranks" --bind-to none --hostfile "$work/hosts" --mca plm_rsh_agent "$work/agent.sh" \
    --mca oob_tcp_if_include mh0 --mca btl_tcp_if_include mh0 $args \
    "$work/mpi_allreduce" --op allreduce --sizes "$mpi_sizes" >"$out" 2>&1 ||
    { cat "$out" >&2; die "MPI variant $name (run $run) failed"; }
  # RESULT <op> <bytes> <count> <iters> <time_us> <algbw> <busbw> <wrong>
  awk -v v="$name" '$1 == "RESULT" {
      if ($9 != 0) { print "WRONG " $0 > "/dev/stderr"; exit 7 }
      print v, $3, $8 }' "$out" >>"$work/results" || die "MPI variant $name: wrong results"
}

names=()
for v in "${variants[@]}"; do names+=("${v%%:*}"); done
for v in "${variants[@]}"; do [[ "${v#*:}" == @mpi* ]] && { mpi_setup; break; }; done
echo "# Loom all-reduce across $hosts network namespaces x $per_host ranks ($nranks ranks)," \
     "veth + bridge, TCP between namespaces, shm within"
if [[ -n "$rate" ]]; then
  echo "# link: tc tbf $rate on every veth, both directions (emulated datacenter link)"
else
  echo "# link: unshaped veth (no tc rate limit)"
fi
echo "# tool: $tool ${perf_args[*]}; $reps repetitions, variants alternating: ${variants[*]}"
for ((i = 1; i <= reps; i++)); do
  for v in "${variants[@]}"; do
    echo "# rep $i/$reps: ${v%%:*}" >&2
    if [[ "${v#*:}" == @mpi* ]]; then
      run_mpi "${v%%:*}" "${v#*:@mpi}"
    else
      run_variant "${v%%:*}" "${v#*:}"
    fi
  done
done

# Median busbw per (variant, size); ratios against the first variant.
awk -v names="${names[*]}" '
  function median(key,   n, i, j, t, a) {
    n = split(vals[key], a, " ")
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { vals[$1 SUBSEP $2] = vals[$1 SUBSEP $2] " " $3; if (!($2 in seen)) { seen[$2] = 1; sizes[++ns] = $2 } }
  END {
    nv = split(names, v, " ")
    printf "%12s", "size(B)"
    for (i = 1; i <= nv; i++) printf " %14s", v[i] " busbw"
    for (i = 2; i <= nv; i++) printf " %14s", v[i] "/" v[1]
    printf "\n"
    for (s = 1; s <= ns; s++) {
      printf "%12d", sizes[s]
      for (i = 1; i <= nv; i++) { m[i] = median(v[i] SUBSEP sizes[s]); printf " %14.2f", m[i] }
      for (i = 2; i <= nv; i++) printf " %14s", (m[1] > 0 ? sprintf("%.2fx", m[i] / m[1]) : "-")
      printf "\n"
    }
    printf "# busbw in GB/s, median of the repetitions (out-of-place)\n"
  }' "$work/results"
