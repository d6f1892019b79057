#!/usr/bin/env python3
"""Runs one nccl-tests-compatible Loom benchmark and checks its output.

Launch modes: fork (the tool's own --nranks), threads (-t), torchrun (RANK/WORLD_SIZE/
MASTER_ADDR/MASTER_PORT set per process, as torchrun does), mpi-env (Open MPI's
OMPI_COMM_WORLD_* variables, as mpirun sets them), slurm-env (srun's SLURM_* variables)
and mpirun (the real Open MPI mpirun; exits 77 = skipped when it is not installed).

Asserts: exit status; the header (nThread line, one device line per rank); the column
headers; every row has nccl-tests' 13 columns with consistent size/count; #wrong is 0
(N/A only where nccl-tests prints it); busbw/algbw equals the collective's factor; the
footer says "Out of bounds values : 0 OK". With --expect-wrong N, rows must instead show
N wrong elements, the footer FAILED and exit status 7.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid

SKIP = 77

# tool -> (busbw factor, size multiplier of the row's "size" over count*typesize,
#          in-place checked, rooted)
def tool_facts(tool, n):
    allreduce = 2.0 * (n - 1) / n
    frac = (n - 1) / n
    return {
        "all_reduce_perf": (allreduce, 1, True, False),
        "all_gather_perf": (frac, n, True, False),
        "reduce_scatter_perf": (frac, n, True, False),
        "broadcast_perf": (1.0, 1, True, True),
        "reduce_perf": (1.0, 1, True, True),
        "alltoall_perf": (frac, n, False, False),
        "sendrecv_perf": (1.0, 1, False, False),
        "gather_perf": (frac, n, True, True),
        "scatter_perf": (frac, n, True, True),
    }[tool]

TYPE_SIZES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
              "half": 2, "float": 4, "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}

# Launcher variables a CI machine may carry; the test sets its own.
SCRUB_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "SLURM_", "NCCL_COMM_ID", "NCCL_TESTS_SPLIT", "LOOM_BENCH_", "TORCHELASTIC_")
SCRUB_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "MPI_LOCALRANKID", "MPI_LOCALNRANKS"}


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(SCRUB_PREFIXES) and k not in SCRUB_NAMES}
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fail(msg, out=None):
    print("FAIL: " + msg)
    if out is not None:
        print("---- output ----")
        print(out)
    sys.exit(1)


def run_processes(cmd, envs, timeout):
    """Starts one process per env; returns (rank 0 stdout, [stdout], [returncode], stderr)."""
    procs = [subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for e in envs]
    outs, errs, codes = [], [], []
    try:
        for p in procs:
            o, e = p.communicate(timeout=timeout)
            outs.append(o)
            errs.append(e)
            codes.append(p.returncode)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        fail("timed out after %d s" % timeout)
    return outs, codes, "".join(errs)


def launch(args, tool_args):
    n = args.nranks
    base = clean_env()
    base.update(args.env or {})
    cmd = [args.tool] + tool_args
    if args.mode == "threads":
        r = subprocess.run(cmd + ["-t", str(n)], env=base, capture_output=True, text=True,
                           timeout=args.timeout)
        return r.stdout, r.returncode, r.stderr, n
    if args.mode == "fork":
        r = subprocess.run(cmd + ["--nranks", str(n)], env=base, capture_output=True, text=True,
                           timeout=args.timeout)
        return r.stdout, r.returncode, r.stderr, n
    if args.mode == "mpirun":
        mpirun = shutil.which("mpirun")
        if not mpirun:
            print("SKIP: mpirun is not installed")
            sys.exit(SKIP)
        extra = ["--oversubscribe"]
        if os.geteuid() == 0:
            extra.append("--allow-run-as-root")
        r = subprocess.run([mpirun, "-np", str(n)] + extra + cmd, env=base, capture_output=True,
                           text=True, timeout=args.timeout)
        return r.stdout, r.returncode, r.stderr, n
    envs = []
    if args.mode == "torchrun":
        port = free_port()
        for r in range(n):
            e = dict(base, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                     LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            envs.append(e)
    elif args.mode == "mpi-env":
        rendezvous_dir = tempfile.mkdtemp(prefix="loom-bench-rdv-")
        job = "test-" + uuid.uuid4().hex
        for r in range(n):
            envs.append(dict(base, OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE=str(n),
                             OMPI_COMM_WORLD_LOCAL_RANK=str(r), OMPI_COMM_WORLD_LOCAL_SIZE=str(n),
                             PMIX_NAMESPACE=job, LOOM_BENCH_RENDEZVOUS_DIR=rendezvous_dir))
    elif args.mode == "slurm-env":
        port = free_port()
        for r in range(n):
            envs.append(dict(base, SLURM_PROCID=str(r), SLURM_STEP_NUM_TASKS=str(n),
                             SLURM_NTASKS=str(n), SLURM_LOCALID=str(r), SLURM_STEP_NUM_NODES="1",
                             SLURM_STEP_NODELIST="localhost", SLURM_JOB_ID="4242",
                             SLURM_STEP_ID="0", LOOM_BENCH_PORT=str(port)))
    else:
        fail("unknown mode " + args.mode)
    try:
        outs, codes, err = run_processes(cmd, envs, args.timeout)
    finally:
        if args.mode == "mpi-env":
            shutil.rmtree(rendezvous_dir, ignore_errors=True)
    for r in range(1, n):
        if outs[r].strip():
            fail("rank %d printed to stdout; only rank 0 may" % r, outs[r])
    bad = [c for c in codes if c != codes[0]]
    if bad:
        fail("ranks exited with different codes: %s" % codes, err)
    return outs[0], codes[0], err, n


def expected_sizes(lo, hi, factor):
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= factor
    return sizes


def lines_of(out):
    return out.splitlines()


def parse_size(text):
    mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    if text[-1].upper() in mult:
        return int(float(text[:-1]) * mult[text[-1].upper()])
    return int(text)


def split_color(spec, proc):
    """nccl-tests' color of a process under NCCL_TESTS_SPLIT ("MOD 2") or a mask ("0x1")."""
    if spec.startswith("MASK "):
        return proc & int(spec.split()[1], 16)
    op, value = spec.split()
    value = int(value, 0)
    return {"AND": proc & value, "OR": proc | value, "MOD": proc % value, "DIV": proc // value}[op.upper()]


def check(args, out, code, err, nranks):
    tool = os.path.basename(args.tool)
    # With a split, rank 0's group runs the rows it prints: its size sets the columns.
    group = nranks
    if args.split:
        colors = [split_color(args.split, p) for p in range(nranks)]  # fork mode: a rank a process
        group = colors.count(colors[0])
        line = [l for l in lines_of(out) if l.startswith("# Loom: NCCL_TESTS_SPLIT")]
        if len(line) != 1:
            fail("no '# Loom: NCCL_TESTS_SPLIT...' header line", out)
        for l in lines_of(out):
            if l.startswith("#  Rank "):
                f = l.split()
                if int(f[4]) != colors[int(f[2])]:
                    fail("rank %s is in group %s, expected %d" % (f[2], f[4], colors[int(f[2])]), out)
    factor, size_mult, checks_in_place, rooted = tool_facts(tool, group)
    lines = out.splitlines()
    want_code = 7 if args.expect_wrong else 0
    if code != want_code:
        fail("exit status %d, expected %d; stderr:\n%s" % (code, want_code, err), out)
    if not any(l.startswith("# nThread ") for l in lines):
        fail("no '# nThread' header line", out)
    if "# Using devices" not in lines:
        fail("no '# Using devices' line", out)
    dev_ranks = sorted(int(l.split()[2]) for l in lines if l.startswith("#  Rank "))
    if dev_ranks != list(range(nranks)):
        fail("device lines for ranks %s, expected 0..%d" % (dev_ranks, nranks - 1), out)
    if args.cuda_driver:
        if not any(l.startswith("# Loom:") and "device buffers" in l for l in lines):
            fail("no '# Loom: ... device buffers' line", out)
        if not all("[cuda]" in l for l in lines if l.startswith("#  Rank ")):
            fail("a device line does not name a CUDA device", out)
    heads = [l.split() for l in lines if l.startswith("#") and "redop" in l]
    side = ["time", "algbw", "busbw", "#wrong"]
    if "-I" in args.extra and args.extra[args.extra.index("-I") + 1] != "0":
        side += ["i_min", "i_max", "i_p99", "i_cv%"]
    if len(heads) != 1 or heads[0][1:] != ["size", "count", "type", "redop", "root"] + side + side:
        fail("column header line is not nccl-tests'", out)

    rows = [l for l in lines if l.strip() and not l.startswith("#")]
    sizes = expected_sizes(parse_size(args.min_bytes), parse_size(args.max_bytes), args.step_factor)
    want_rows = len(sizes) * args.expect_tests
    if len(rows) != want_rows:
        fail("%d rows, expected %d (%d sizes x %d tests)" % (len(rows), want_rows, len(sizes),
                                                             args.expect_tests), out)
    per_iter = "-I" in args.extra and args.extra[args.extra.index("-I") + 1] != "0"
    ncols = 21 if per_iter else 13
    in_place_at = 13 if per_iter else 9
    meaningful = 0
    for i, row in enumerate(rows):
        f = row.split()
        if len(f) != ncols:
            fail("row has %d columns, expected %d: %r" % (len(f), ncols, row), out)
        size, count = int(f[0]), int(f[1])
        typ, redop, root = f[2], f[3], int(f[4])
        es = TYPE_SIZES.get(typ)
        if es is None:
            fail("unknown type %r in row %r" % (typ, row), out)
        want_size_bytes = sizes[i % len(sizes)]
        if size != count * es * size_mult:
            fail("size %d != count %d x %d bytes x %d" % (size, count, es, size_mult), out)
        if size > want_size_bytes:
            fail("row size %d exceeds the requested %d" % (size, want_size_bytes), out)
        if rooted != (root >= 0):
            fail("root column %d for a %srooted collective" % (root, "" if rooted else "non-"), out)
        for placement, (t, alg, bus, wrong) in (("out-of-place", f[5:9]),
                                                ("in-place", f[in_place_at:in_place_at + 4])):
            t, alg, bus = float(t), float(alg), float(bus)
            if t <= 0:
                fail("non-positive time in row %r" % row, out)
            tol = 0.0051 * (1 + factor) + 0.001 * alg * factor
            if abs(bus - alg * factor) > tol:
                fail("%s busbw %g != algbw %g x %g in row %r" % (placement, bus, alg, factor, row), out)
            if alg >= 0.1:
                meaningful += 1
            if wrong == "N/A":
                if placement == "out-of-place" or checks_in_place:
                    fail("#wrong N/A where it must be checked: %r" % row, out)
                continue
            if args.expect_wrong:
                # The injection corrupts the first elements of one rank's result.
                result_elts = size // es // (group if tool in ("reduce_scatter_perf", "scatter_perf") else 1)
                if int(wrong) != min(args.expect_wrong, result_elts):
                    fail("#wrong %s, expected %d injected: %r" % (wrong, args.expect_wrong, row), out)
            elif int(wrong) != 0:
                fail("#wrong %s in row %r" % (wrong, row), out)
    if meaningful == 0 and not args.no_bw_floor:
        fail("no row has algbw >= 0.1 GB/s, so the busbw factor was not really checked", out)

    oob = [l for l in lines if l.startswith("# Out of bounds values")]
    if args.expect_wrong:
        if len(oob) != 1 or "FAILED" not in oob[0]:
            fail("footer does not report the injected errors", out)
    elif oob != ["# Out of bounds values : 0 OK"]:
        fail("footer 'Out of bounds values' line is %r" % oob, out)
    avg = [l for l in lines if l.startswith("# Avg bus bandwidth    : ")]
    if len(avg) != 1:
        fail("no 'Avg bus bandwidth' footer line", out)
    float(avg[0].split(":")[1].split()[0])
    if ("# Collective test concluded: %s" % tool) not in lines:
        fail("no 'Collective test concluded' line", out)
    if args.json:
        with open(args.json) as fh:
            doc = json.load(fh)
        results = doc["results"]
        if len(results) != want_rows:
            fail("JSON has %d results, expected %d" % (len(results), want_rows))
        if doc["out_of_bounds"] != {"count": 0, "okay": True}:
            fail("JSON out_of_bounds is %r" % doc["out_of_bounds"])
        if len(doc["config"]["devices"]) != nranks:
            fail("JSON lists %d devices" % len(doc["config"]["devices"]))
        for r, row in zip(results, rows):
            if r["size"] != int(row.split()[0]) or r["out_of_place"]["nwrong"] != 0:
                fail("JSON result %r does not match row %r" % (r, row))
    print("OK: %s %s x%d: %d rows" % (tool, args.mode, nranks, len(rows)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--mode", required=True,
                    choices=["fork", "threads", "torchrun", "mpi-env", "slurm-env", "mpirun"])
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="1M")
    ap.add_argument("--step-factor", type=int, default=4)
    ap.add_argument("--expect-tests", type=int, default=1,
                    help="(type, op, root) combinations the extra arguments select")
    ap.add_argument("--expect-wrong", type=int, default=0)
    ap.add_argument("--inject-wrong", default=None, help="LOOM_BENCH_INJECT_WRONG value")
    ap.add_argument("--json", action="store_true", help="also write and check -J output")
    ap.add_argument("--no-bw-floor", action="store_true",
                    help="small sizes only: do not require a row fast enough (>= 0.1 GB/s) for "
                         "the busbw/algbw check to be meaningful")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--cuda-driver", default=None,
                    help="device buffers (-M device) through this CUDA driver library "
                         "(LOOM_CUDA_DRIVER_LIBRARY: the stand-in driver in CI)")
    ap.add_argument("--split", default=None,
                    help='NCCL_TESTS_SPLIT value ("MOD 2"), or "MASK 0x1" for NCCL_TESTS_SPLIT_MASK '
                         "(fork mode: one rank a process)")
    ap.add_argument("extra", nargs="*", help="more tool arguments (after --)")
    args = ap.parse_args()
    args.env = {}
    if args.split:
        if args.mode != "fork":
            fail("--split is checked in fork mode only")
        if args.split.startswith("MASK "):
            args.env["NCCL_TESTS_SPLIT_MASK"] = args.split.split()[1]
        else:
            args.env["NCCL_TESTS_SPLIT"] = args.split
    if args.cuda_driver:
        args.env["LOOM_CUDA_DRIVER_LIBRARY"] = args.cuda_driver
        args.env["LOOM_NCCL_FALLBACK"] = "off"  # Loom's staged path, not stock NCCL
        args.extra = ["-M", "device"] + args.extra
    if args.inject_wrong:
        args.env["LOOM_BENCH_INJECT_WRONG"] = args.inject_wrong
    tool_args = ["-b", args.min_bytes, "-e", args.max_bytes, "-f", str(args.step_factor),
                 "-T", "60"] + args.extra
    tmp = None
    if args.json:
        tmp = tempfile.mkdtemp(prefix="loom-bench-json-")
        args.json = os.path.join(tmp, "out.json")
        tool_args += ["-J", args.json]
    out, code, err, nranks = launch(args, tool_args)
    check(args, out, code, err, nranks)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
