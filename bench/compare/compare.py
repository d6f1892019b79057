#!/usr/bin/env python3
"""Side by side: Loom vs Open MPI vs PyTorch Gloo, host buffers, one command.

Runs Loom's nccl-tests compatible tools (all_reduce_perf, ...), Open MPI's MPI_Allreduce /
MPI_Allgather / MPI_Reduce_scatter_block (mpi_allreduce.c, built here with mpicc) and
torch.distributed's Gloo backend (gloo_allreduce.py) over the same sizes and rank count.
The libraries alternate: every round runs each library's sweep in turn (the order rotates
from round to round), so machine noise hits all of them alike; the figures are medians over
rounds. Prints ratio tables, writes CSV, JSON, a markdown section and PNG plots of bus
bandwidth against message size (log-log, one line per library).

Installs what is missing (Open MPI, torch, matplotlib) with apt-get (Debian's python3-torch,
python3-matplotlib for /usr/bin/python3) or pip (--install pip), and builds Loom's tools
with CMake if they are not built yet.

  python3 bench/compare/compare.py                      # full run, results under docs/
  python3 bench/compare/compare.py --quick --out-dir /tmp/cmp   # a smoke test
"""

import argparse
import datetime
import os
import platform
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import report  # noqa: E402
import runners  # noqa: E402

DEFAULT_SIZES = "8,128,1K,8K,64K,256K,1M,2M,4M,8M,16M,32M,64M,128M"
QUICK_SIZES = "8,64K,1M"
MD_BEGIN = "<!-- compare.py: generated section begin -->"
MD_END = "<!-- compare.py: generated section end -->"


def parse_size(text):
    text = text.strip().upper().rstrip("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if scale > 1 else text) * scale


def log(msg):
    print(f"[compare] {msg}", flush=True)


# ---------------------------------------------------------------- what is installed
def python_with(module):
    """An interpreter that can import `module`: this one, else Debian's /usr/bin/python3."""
    for py in dict.fromkeys([sys.executable, "/usr/bin/python3"]):
        if py and os.path.exists(py) and subprocess.run(
                [py, "-c", f"import {module}"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL).returncode == 0:
            return py
    return None


def install(method, apt_pkgs, pip_pkgs):
    if method == "none":
        sys.exit(f"[compare] missing: {' '.join(apt_pkgs)} (and --install none was given); "
                 f"install them, e.g. apt-get install -y {' '.join(apt_pkgs)}")
    if method == "pip" and pip_pkgs:
        cmd = [sys.executable, "-m", "pip", "install"] + pip_pkgs
    else:
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        cmd = sudo + ["apt-get", "install", "-y"] + apt_pkgs
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        log("installing: " + " ".join(cmd))
        if subprocess.run(cmd, env=env).returncode != 0:
            subprocess.run(sudo + ["apt-get", "update"], env=env)
            if subprocess.run(cmd, env=env).returncode != 0:
                sys.exit(f"[compare] could not install {' '.join(apt_pkgs)} with apt-get; "
                         "try --install pip, or install them yourself")
        return
    log("installing: " + " ".join(cmd))
    if subprocess.run(cmd).returncode != 0:
        sys.exit(f"[compare] '{' '.join(cmd)}' failed")


def ensure_prerequisites(args):
    """Returns (python for gloo or None, python for matplotlib or None)."""
    if "mpi" in args.libs and not (shutil.which("mpicc") and shutil.which("mpirun")):
        install(args.install, ["openmpi-bin", "libopenmpi-dev"], [])
    torch_py = None
    if "gloo" in args.libs:
        torch_py = python_with("torch.distributed")
        if not torch_py:
            install(args.install, ["python3-torch"], ["torch"])
            torch_py = python_with("torch.distributed")
        if not torch_py:
            sys.exit("[compare] no python can import torch.distributed after installing it")
    plot_py = None
    if not args.no_plot:
        plot_py = python_with("matplotlib")
        if not plot_py:
            install(args.install, ["python3-matplotlib"], ["matplotlib"])
            plot_py = python_with("matplotlib")
    return torch_py, plot_py


def ensure_loom_tools(args):
    bin_dir = args.loom_bin or os.path.join(args.build_dir, "bench")
    tools = [runners.LOOM_TOOLS[op] for op in args.ops]
    missing = [t for t in tools if not os.access(os.path.join(bin_dir, t), os.X_OK)]
    if missing and args.loom_bin:
        sys.exit(f"[compare] {', '.join(missing)} not found in --loom-bin {bin_dir}")
    if not args.loom_bin:
        # Always: a tool left from an older checkout would measure old code (the build is
        # a no-op when it is up to date).
        log(f"building {' '.join(tools)} in {args.build_dir}")
        if not os.path.exists(os.path.join(args.build_dir, "CMakeCache.txt")):
            subprocess.run(["cmake", "-S", REPO, "-B", args.build_dir,
                            "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], check=True)
        subprocess.run(["cmake", "--build", args.build_dir, "-j2", "--target"] + tools,
                       check=True, stdout=subprocess.DEVNULL)
    return bin_dir


def build_mpi_program(args):
    src = os.path.join(HERE, "mpi_allreduce.c")
    out_dir = os.path.join(args.build_dir, "bench", "compare")
    os.makedirs(out_dir, exist_ok=True)
    exe = os.path.join(out_dir, "mpi_allreduce")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        log(f"mpicc -O2 {src} -o {exe}")
        subprocess.run(["mpicc", "-O2", "-std=c11", "-Wall", src, "-o", exe], check=True)
    return exe


# ---------------------------------------------------------------- the machine
def machine_info():
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    mem_gib = None
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / (1 << 20), 1)
    os_name = platform.platform()
    if os.path.exists("/etc/os-release"):
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"')
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem_gib, "os": os_name,
            "kernel": platform.release()}


def versions(torch_py):
    out = {}

    def first_line(cmd):
        try:
            return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True).stdout.strip().splitlines()[0]
        except (OSError, IndexError):
            return None

    out["open_mpi"] = first_line(["mpirun", "--version"])
    if torch_py:
        out["torch"] = first_line([torch_py, "-c", "import torch; print(torch.__version__)"])
    rev = first_line(["git", "-C", REPO, "rev-parse", "--short", "HEAD"])
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           stdout=subprocess.PIPE, text=True).stdout.strip()
    out["loom_git"] = (rev or "unknown") + ("+local changes" if dirty else "")
    return out


def _cpu_ticks():
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals) - idle, sum(vals)


def cpu_busy(seconds=2.0):
    """Fraction of all CPUs busy over `seconds`: between rounds our own ranks are idle, so
    this is the others' load, which the load average (still counting our last round) is not."""
    b0, t0 = _cpu_ticks()
    time.sleep(seconds)
    b1, t1 = _cpu_ticks()
    return (b1 - b0) / max(1, t1 - t0)


class OthersMeter:
    """CPU time the rest of the machine used while our runs ran: all CPUs' busy time minus
    our children's (resource.getrusage counts the ranks mpirun or the launcher waited for),
    as a fraction of the machine's capacity over that time."""

    def __enter__(self):
        self.busy0, self.total0 = _cpu_ticks()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.ours0 = ru.ru_utime + ru.ru_stime
        return self

    def __exit__(self, *exc):
        busy1, total1 = _cpu_ticks()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        hz = os.sysconf("SC_CLK_TCK")
        busy = (busy1 - self.busy0) / hz
        ours = ru.ru_utime + ru.ru_stime - self.ours0
        capacity = max(1e-9, (total1 - self.total0) / hz)
        self.others = max(0.0, busy - ours) / capacity
        return False


def wait_until_quiet(max_load, max_busy, wait_s, first):
    """Before the first round: waits for the 1-minute load average to drop below max_load;
    before every round: for the CPUs to be less than max_busy busy (others' work). Gives up
    waiting after wait_s and measures anyway, saying so. Returns (load, busy)."""
    deadline = time.time() + wait_s
    while True:
        load, busy = os.getloadavg()[0], cpu_busy()
        quiet = (not first or max_load <= 0 or load < max_load) and \
            (max_busy <= 0 or busy < max_busy)
        if quiet:
            return load, busy
        if time.time() >= deadline:
            log(f"WARNING: load average {load:.2f}, CPUs {busy:.0%} busy; measuring anyway "
                "(figures will be noisy)")
            return load, busy
        why = f"load average {load:.2f} (max {max_load}), " if first and max_load > 0 else ""
        log(f"{why}CPUs {busy:.0%} busy (max {max_busy:.0%}); waiting 30 s")
        time.sleep(30)


# ---------------------------------------------------------------- the run
def sizes_for(args, op):
    """The sweep for one op; all-gather and reduce-scatter sizes are whole 16-byte blocks
    per rank (nccl-tests aligns them so)."""
    if op == "allreduce":
        return list(args.sizes)
    unit = 16 * args.nranks
    return list(dict.fromkeys(max(unit, s // unit * unit) for s in args.sizes))


def byte_schedule(args):
    """{op: [(bytes, iters)]} for the calibration pass: ~16 MiB moved per row."""
    return {op: [(s, int(min(200, max(args.min_iters, (16 << 20) // s))))
                 for s in sizes_for(args, op)] for op in args.ops}


def timed_schedule(args, calib):
    """{lib: {op: [(bytes, iters)]}}: as many calls as fill --row-seconds at the speed the
    calibration pass measured, so every library's rows last about as long (and noise that
    lasts a moment weighs the same on each)."""
    plans = {}
    for s in calib:
        if s.variant != runners.reference_variant(s.library):  # Loom: out of place
            continue
        iters = args.row_seconds * 1e6 / max(s.time_us, 0.01)
        iters = int(min(args.max_iters, max(args.min_iters, iters)))
        plans.setdefault(s.library, {}).setdefault(s.op, []).append((s.size, iters))
    return plans


def warmup_of(iters):
    return max(3, min(50, iters // 10))


def lib_ops(args, lib):
    if lib != "gloo":
        return args.ops
    # torch's Gloo backend has no reduce_scatter; all-gather only when asked for.
    return [op for op in args.ops if op in args.gloo_ops and op != "reducescatter"]


def run_lib(args, lib, op, plan, bin_dir, mpi_exe, torch_py, loom_env):
    if lib in ("loom", "before"):
        got = runners.run_loom(bin_dir if lib == "loom" else args.before_bin, op, args.nranks,
                               plan, warmup_of, loom_env, launcher=args.loom_launcher,
                               bind=args.bind)
        for s in got:
            s.library = lib
        return got
    if lib == "mpi":
        return runners.run_mpi(mpi_exe, op, args.nranks, plan, warmup_of, bind=args.bind)
    return runners.run_gloo(torch_py, os.path.join(HERE, "gloo_allreduce.py"), op,
                            args.nranks, plan, warmup_of, bind=args.bind)


def run_round(args, rnd, plans, bin_dir, mpi_exe, torch_py, loom_env):
    """Every library's sweep of every op, in an order that rotates with the round."""
    samples = []
    libs = args.libs[rnd % len(args.libs):] + args.libs[:rnd % len(args.libs)]
    label = "calibration" if rnd < 0 else f"round {rnd + 1}/{args.rounds}"
    for op in args.ops:
        for lib in libs:
            if op not in lib_ops(args, lib):
                continue
            plan = plans[lib][op] if lib in plans else plans["*"][op]
            for attempt in range(args.retries + 1):
                t0 = time.time()
                with OthersMeter() as meter:
                    got = run_lib(args, lib, op, plan, bin_dir, mpi_exe, torch_py, loom_env)
                log(f"{label} {op:13s} {lib:4s} {time.time() - t0:6.1f} s, others kept the "
                    f"CPUs {meter.others:4.0%} busy")
                if rnd < 0 or args.max_busy <= 0 or meter.others < args.max_busy:
                    break
                if attempt < args.retries:  # disturbed: wait for quiet, then run it again
                    log(f"{label} {op} {lib}: disturbed, running it again")
                    wait_until_quiet(0, args.max_busy, args.wait, False)
            for s in got:
                s.round = rnd
                s.others_busy = round(meter.others, 3)
                if s.wrong:
                    log(f"WARNING: {lib} {op} {s.size} B: {s.wrong} wrong elements")
            samples += got
    return samples


def write_markdown(path, args, meta, agg, checks, png_rel):
    tables = report.markdown_tables(agg, args.ops, args.libs)
    m = meta["machine"]
    v = meta["versions"]
    knobs = " ".join(f"{k}={val}" for k, val in meta["loom_env"].items()) or "defaults"
    section = [
        MD_BEGIN,
        f"Measured {meta['date']} on {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, "
        f"{m['os']} (kernel {m['kernel']}); {meta['nranks']} ranks on one host, host buffers, "
        f"float32 sum; median of {meta['rounds']} rounds, the libraries alternating within "
        f"each round. Before the rounds: load average "
        f"{', '.join(f'{x:.2f}' for x in meta['load_before_rounds'])}; CPUs busy (others) "
        f"{', '.join(f'{x:.0%}' for x in meta['cpu_busy_before_rounds'])}.",
        "",
        f"Loom {v.get('loom_git')} (knobs: {knobs}); {v.get('open_mpi')} "
        f"(`{' '.join(meta['mpirun'])}`); PyTorch {v.get('torch')} Gloo. Loom's ranks "
        f"started by {'mpirun, as Open MPI' if meta['loom_launcher'] == 'mpirun' else 'its built-in launcher'}"
        f"; ranks {'pinned one per core' if meta['bind'] == 'core' else 'not pinned'}.",
        "",
        "```",
        meta["command"],
        "```",
        "",
        tables,
        "Loom/Open MPI compares Loom out of place with `MPI_Allreduce` out of place; "
        "Loom/Gloo compares Loom in place with Gloo (whose all-reduce is in place only). "
        "Bus bandwidth is nccl-tests': all-reduce algbw x 2(n-1)/n, all-gather and "
        "reduce-scatter algbw x (n-1)/n, size = the whole buffer (nccl-tests' size column).",
        "",
        "Issue 4's targets:",
        "",
        report.markdown_checks(checks),
    ]
    section += [f"![{os.path.basename(p)}]({p})\n" for p in png_rel]
    section.append(MD_END)
    text = "\n".join(section)
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        if MD_BEGIN in old and MD_END in old:
            head, rest = old.split(MD_BEGIN, 1)
            text = head + text + rest.split(MD_END, 1)[1]
        else:
            text = old.rstrip() + "\n\n" + text + "\n"
    else:
        text = "# Benchmarks\n\n" + text + "\n"
    with open(path, "w") as f:
        f.write(text)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--nranks", type=int, default=2)
    p.add_argument("--sizes", help=f"comma list (default {DEFAULT_SIZES}; all-gather and "
                   "reduce-scatter round them to whole 16-byte blocks per rank)")
    p.add_argument("--ops", default="allreduce,allgather,reducescatter")
    p.add_argument("--libs", default="loom,mpi,gloo")
    p.add_argument("--gloo-ops", default="allreduce", help="ops Gloo runs (allreduce,allgather)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--row-seconds", type=float, default=0.2,
                   help="each row (one size, one library) times a loop this long; the calls "
                   "per loop come from a calibration pass")
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--max-iters", type=int, default=1000000)
    p.add_argument("--loom-launcher", choices=["mpirun", "builtin"],
                   help="how Loom's ranks start: under mpirun like Open MPI's (default when "
                   "mpi is compared), or the tools' own --nranks launcher (unpinned ranks)")
    p.add_argument("--bind", choices=["core", "none"], default="core",
                   help="pin each rank to a core (Open MPI's default for np <= cores; Gloo's "
                   "ranks get the same with sched_setaffinity), or not")
    p.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES}, 1 round, few iters")
    p.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    p.add_argument("--loom-bin", help="directory with all_reduce_perf ... (default BUILD/bench)")
    p.add_argument("--before-bin", help="directory with the *_perf tools of another Loom build "
                   "(e.g. the commit before a change): runs as library 'before', side by side")
    p.add_argument("--loom-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment for Loom's runs only (e.g. LOOM_SLOT_BYTES=1M)")
    p.add_argument("--out-dir", default=os.path.join(REPO, "docs"),
                   help="writes benchmarks.{md,csv,json} and img/<op>_busbw.png here")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target of issue 4 is missed")
    p.add_argument("--install", choices=["apt", "pip", "none"], default="apt")
    p.add_argument("--max-load", type=float, default=1.5,
                   help="before the first round, wait for the 1-min load average to drop "
                   "below this (0: don't)")
    p.add_argument("--max-busy", type=float, default=0.15,
                   help="before each round, wait until others keep the CPUs less than this "
                   "fraction busy (0: don't)")
    p.add_argument("--wait", type=int, default=1800, help="longest wait for a quiet machine (s)")
    p.add_argument("--retries", type=int, default=3,
                   help="run a library's sweep again (after waiting for quiet) when others "
                   "kept the CPUs more than --max-busy busy during it; the last try counts")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.rounds, args.row_seconds = args.sizes or QUICK_SIZES, 1, 0.02
    args.sizes = args.sizes or DEFAULT_SIZES
    if args.loom_launcher is None:
        args.loom_launcher = "mpirun" if "mpi" in args.libs else "builtin"
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    args.ops = [o for o in args.ops.split(",") if o]
    args.libs = [l for l in args.libs.split(",") if l]
    args.gloo_ops = args.gloo_ops.split(",")
    bad = [o for o in args.ops if o not in runners.LOOM_TOOLS] + \
          [l for l in args.libs if l not in report.LIB_NAMES]
    if bad or "loom" not in args.libs:
        p.error(f"unknown op/library {bad}" if bad else "--libs must include loom")
    if args.before_bin and "before" not in args.libs:
        args.libs.append("before")
    if "before" in args.libs and not args.before_bin:
        p.error("--libs before needs --before-bin")
    for kv in args.loom_env:
        if "=" not in kv:
            p.error(f"--loom-env wants KEY=VALUE, got {kv}")
    return args


def main(argv):
    args = parse_args(argv)
    torch_py, plot_py = ensure_prerequisites(args)
    bin_dir = ensure_loom_tools(args)
    mpi_exe = build_mpi_program(args) if "mpi" in args.libs else None
    loom_env = dict(kv.split("=", 1) for kv in args.loom_env)
    # One checked Loom pass first (-c 1): the timed rounds run with -c 0.
    for op in args.ops:
        check = runners.run_loom(bin_dir, op, args.nranks, [(s, 2) for s in sizes_for(args, op)],
                                 lambda i: 1, loom_env, check=True,
                                 launcher=args.loom_launcher, bind=args.bind)
        bad = [s for s in check if s.wrong]
        if bad:
            sys.exit(f"[compare] Loom {op} gave wrong results: {bad}")
    log("Loom results checked (#wrong 0) for every op and size")

    # Calibration: one short pass of everything, to size each library's rows.
    wait_until_quiet(args.max_load, args.max_busy, args.wait, True)
    calib = run_round(args, -1, {"*": byte_schedule(args)}, bin_dir, mpi_exe, torch_py, loom_env)
    plans = timed_schedule(args, calib)

    samples, loads = [], []
    for rnd in range(args.rounds):
        loads.append(wait_until_quiet(args.max_load, args.max_busy, args.wait, rnd == 0))
        samples += run_round(args, rnd, plans, bin_dir, mpi_exe, torch_py, loom_env)

    agg = report.aggregate(samples)
    checks = report.target_checks(agg, args.ops, args.libs, args.nranks)
    meta = {
        "command": "python3 bench/compare/compare.py" + "".join(f" {a}" for a in argv),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(), "versions": versions(torch_py),
        "nranks": args.nranks, "rounds": args.rounds, "ops": args.ops, "libs": args.libs,
        "iterations": plans, "row_seconds": args.row_seconds,
        "warmup": "max(3, min(50, iters/10))", "loom_launcher": args.loom_launcher,
        "bind": args.bind,
        "loom_env": loom_env, "load_before_rounds": [round(l, 2) for l, _ in loads],
        "cpu_busy_before_rounds": [round(b, 3) for _, b in loads],
        "mpirun": runners.mpirun_prefix(args.nranks, args.bind),
    }
    print()
    print(report.markdown_tables(agg, args.ops, args.libs))
    print(report.markdown_checks(checks))

    os.makedirs(os.path.join(args.out_dir, "img"), exist_ok=True)
    csv_path = os.path.join(args.out_dir, "benchmarks.csv")
    json_path = os.path.join(args.out_dir, "benchmarks.json")
    report.write_csv(csv_path, agg)
    report.write_json(json_path, meta, agg, args.ops, args.libs, checks, samples)
    pngs = []
    if plot_py:
        proc = subprocess.run([plot_py, os.path.join(HERE, "plot.py"), json_path,
                               os.path.join(args.out_dir, "img")], stdout=subprocess.PIPE,
                              text=True)
        pngs = proc.stdout.split()
        if proc.returncode != 0:
            log("WARNING: plotting failed")
    png_rel = [os.path.relpath(p, args.out_dir) for p in pngs]
    write_markdown(os.path.join(args.out_dir, "benchmarks.md"), args, meta, agg, checks, png_rel)
    log(f"wrote {csv_path}, {json_path}, {os.path.join(args.out_dir, 'benchmarks.md')}"
        + "".join(f", {p}" for p in pngs))
    return 1 if args.strict and not all(c["pass"] for c in checks) else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (runners.RunError, subprocess.SubprocessError) as e:
        sys.exit(f"[compare] {e}")
