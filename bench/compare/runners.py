"""Runs one sweep of one library and returns its rows (used by compare.py).

Every runner returns a list of Sample(op, size, library, variant, time_us, busbw, wrong):
the per-call time nccl-tests' way (a timed loop of `iters` calls / iters, averaged over
ranks) and nccl-tests' bus bandwidth. Loom's numbers come from its own nccl-tests
compatible tools (all_reduce_perf ...), parsed from their standard table.
"""

import os
import socket
import subprocess
import time
from dataclasses import dataclass

# Loom tool per op, and the MPI/Gloo op names.
LOOM_TOOLS = {
    "allreduce": "all_reduce_perf",
    "allgather": "all_gather_perf",
    "reducescatter": "reduce_scatter_perf",
}


@dataclass
class Sample:
    op: str
    size: int
    library: str  # "loom", "mpi", "gloo"
    variant: str  # "oop" (out of place) or "ip" (in place)
    time_us: float
    busbw: float
    wrong: int
    round: int = -1
    others_busy: float = -1.0  # CPU share other processes used during the sweep


class RunError(RuntimeError):
    pass


def bus_bw(op, size, time_us, nranks):
    """nccl-tests' bus bandwidth (GB/s) from the time, at full precision (the tools print
    two decimals, which reads 0.00 for small sizes)."""
    factor = 2.0 * (nranks - 1) / nranks if op == "allreduce" else (nranks - 1) / nranks
    return size / (time_us * 1e3) * factor if time_us and time_us > 0 else 0.0


def _run(cmd, env=None, timeout=900):
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-20:])
        raise RunError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")
    return proc.stdout


def parse_nccl_tests_rows(text):
    """Rows of an nccl-tests table: (size, oop_time_us, oop_busbw, oop_wrong, ip_time_us,
    ip_busbw, ip_wrong). Columns: size count type redop root | time algbw busbw #wrong |
    time algbw busbw #wrong. A #wrong of N/A (no check) reads as 0; an in-place column of
    N/A reads as None."""
    rows = []
    for line in text.splitlines():
        tok = line.split()
        if len(tok) < 9 or line.lstrip().startswith("#") or not tok[0].isdigit():
            continue

        def num(s):
            try:
                return float(s)
            except ValueError:
                return None

        def wrong(s):
            return int(s) if s.isdigit() else 0

        oop = (num(tok[5]), num(tok[7]), wrong(tok[8]))
        ip = (num(tok[9]), num(tok[11]), wrong(tok[12])) if len(tok) >= 13 else (None, None, 0)
        rows.append((int(tok[0]),) + oop + ip)
    return rows


def reference_variant(lib):
    """MPI is timed out of place; Gloo's all-reduce is in place only."""
    return "ip" if lib == "gloo" else "oop"


def run_loom(bin_dir, op, nranks, sizes, warmup_of, extra_env, check=False,
             launcher="builtin", bind="core"):
    """One all_*_perf invocation per size (so each size gets its own iteration count);
    returns out-of-place and in-place samples. launcher "mpirun" starts the ranks as
    run_mpi does (same placement and binding); "builtin" forks them (--nranks)."""
    tool = os.path.join(bin_dir, LOOM_TOOLS[op])
    env = dict(os.environ, **extra_env)
    if launcher == "mpirun":
        prefix = mpirun_prefix(nranks, bind)
        for key in extra_env:  # exported to the ranks explicitly (-x), as on many nodes
            prefix += ["-x", key]
        prefix.append(tool)
    else:
        prefix = [tool, "--nranks", str(nranks)]
    samples = []
    for size, iters in sizes:
        cmd = prefix + ["-b", str(size), "-e", str(size),
                        "-n", str(iters), "-w", str(warmup_of(iters)), "-c", "1" if check else "0"]
        rows = parse_nccl_tests_rows(_run(cmd, env=env))
        if len(rows) != 1:
            raise RunError(f"{' '.join(cmd)}: expected one table row, got {len(rows)}")
        got_size, ot, ob, ow, it, ib, iw = rows[0]
        if got_size != size:
            raise RunError(f"{' '.join(cmd)}: asked for {size} B, the tool ran {got_size} B")
        samples.append(Sample(op, size, "loom", "oop", ot, bus_bw(op, size, ot, nranks), ow))
        if it is not None:
            samples.append(Sample(op, size, "loom", "ip", it, bus_bw(op, size, it, nranks), iw))
    return samples


def _parse_result_lines(text, library, variant, nranks):
    samples = []
    for line in text.splitlines():
        tok = line.split()
        if len(tok) == 9 and tok[0] == "RESULT":
            op, size, time_us = tok[1], int(tok[2]), float(tok[5])
            samples.append(Sample(op, size, library, variant, time_us,
                                  bus_bw(op, size, time_us, nranks), int(tok[8])))
    return samples


def _sizes_arg(sizes, warmup_of):
    return ",".join(f"{s}:{i}:{warmup_of(i)}" for s, i in sizes)


def mpirun_prefix(nranks, bind="core"):
    cmd = ["mpirun", "-np", str(nranks), "--mca", "btl", "self,vader", "--bind-to", bind]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if nranks > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    return cmd


def run_mpi(mpi_exe, op, nranks, sizes, warmup_of, bind="core"):
    cmd = mpirun_prefix(nranks, bind) + [mpi_exe, "--op", op, "--sizes", _sizes_arg(sizes, warmup_of)]
    samples = _parse_result_lines(_run(cmd), "mpi", "oop", nranks)
    if len(samples) != len(sizes):
        raise RunError(f"{' '.join(cmd)}: expected {len(sizes)} RESULT lines, got {len(samples)}")
    return samples


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_gloo_once(python, script, op, nranks, sizes, warmup_of, timeout, bind):
    port = _free_port()
    procs = []
    for rank in range(nranks):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nranks), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                   OMP_NUM_THREADS="1")
        cmd = [python, script, "--op", op, "--sizes", _sizes_arg(sizes, warmup_of)]
        cpus = sorted(os.sched_getaffinity(0))
        pin = (lambda c=cpus[rank % len(cpus)]: os.sched_setaffinity(0, {c})) \
            if bind == "core" else None
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, preexec_fn=pin,
                                      stderr=subprocess.STDOUT, text=True))
    # A rank that fails (e.g. the port was taken between our probe and its bind) must not
    # leave the others waiting for it: poll all, and stop the rest when one fails.
    deadline = time.time() + timeout
    failed = None
    try:
        while any(p.poll() is None for p in procs):
            failed = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            if failed is not None or time.time() > deadline:
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    outputs = [p.communicate()[0] for p in procs]
    if failed is None:
        failed = next((r for r, p in enumerate(procs) if p.returncode != 0), None)
    if failed is not None:
        tail = "\n".join(outputs[failed].splitlines()[-20:])
        raise RunError(f"gloo rank {failed} exited with {procs[failed].returncode}:\n{tail}")
    samples = _parse_result_lines(outputs[0], "gloo", "ip", nranks)
    if len(samples) != len(sizes):
        raise RunError(f"gloo: expected {len(sizes)} RESULT lines, got {len(samples)}")
    return samples


def run_gloo(python, script, op, nranks, sizes, warmup_of, bind="core", timeout=900,
             attempts=3):
    """Starts nranks processes of gloo_allreduce.py with torch.distributed's env:// init
    (retrying with a new port when the rendezvous port was taken meanwhile)."""
    for attempt in range(attempts):
        try:
            return _run_gloo_once(python, script, op, nranks, sizes, warmup_of, timeout, bind)
        except RunError as e:
            if "Address already in use" not in str(e) or attempt + 1 == attempts:
                raise
