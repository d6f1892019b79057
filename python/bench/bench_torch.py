"""loom vs gloo under torch.distributed, side by side in one run: all_reduce (float32 sum)
from 8 B to 128 MiB, and DDP step time of a small MLP. Both process groups live in the
same processes (loom the default group, gloo a second group over all ranks), and each
measurement alternates between them; every figure is a median.

    python python/bench/bench_torch.py [--ranks 2] [--reps 15]
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import loom_torch  # noqa: F401

SIZES = [8, 1 << 10, 64 << 10, 1 << 20, 8 << 20, 32 << 20, 128 << 20]


def timed(fn, reps):
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def worker(rank, n, reps, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("loom", rank=rank, world_size=n)
    groups = {"loom": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    rows = []
    for size in SIZES:
        t = torch.ones(max(1, size // 4))
        reps_here = reps if size <= (8 << 20) else max(3, reps // 3)
        res = {}
        for _ in range(2):  # warm-up
            for g in groups.values():
                dist.all_reduce(t, group=g)
        samples = {k: [] for k in groups}
        for _ in range(reps_here):  # alternate: one call each, in turn
            for k, g in groups.items():
                dist.barrier(group=g)
                samples[k].append(timed(lambda: dist.all_reduce(t, group=g), 1))
        for k in groups:
            res[k] = statistics.median(samples[k])
        rows.append((size, res))
    # DDP: the same model and data under each group, steps alternating.
    torch.manual_seed(0)
    models = {}
    for k, g in groups.items():
        m = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
        models[k] = (torch.nn.parallel.DistributedDataParallel(m, process_group=g),)
        models[k] += (torch.optim.SGD(models[k][0].parameters(), lr=0.01),)
    x, y = torch.randn(32, 1024), torch.randn(32, 10)

    def step(k):
        ddp, opt = models[k]
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()

    for _ in range(3):
        for k in groups:
            step(k)
    ddp = {k: [] for k in groups}
    for _ in range(reps):
        for k in groups:
            dist.barrier(group=groups[k])
            ddp[k].append(timed(lambda: step(k), 1))
    if rank == 0:
        queue.put((rows, {k: statistics.median(v) for k, v in ddp.items()}))
    dist.barrier()
    dist.destroy_process_group()


def human(b):
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s:
            return f"{b // s} {unit}"
    return f"{b} B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--port", type=int, default=29677)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.spawn(worker, args=(a.ranks, a.reps, a.port, q), nprocs=a.ranks)
    rows, ddp = q.get()
    n = a.ranks
    print(f"torch {torch.__version__}, {n} ranks on one host, float32 sum, CPU tensors, medians")
    print("\n| all_reduce size | loom | gloo | loom busbw (GB/s) | gloo busbw (GB/s) | loom/gloo |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size, res in rows:
        bus = lambda s: size / s * 2 * (n - 1) / n / 1e9  # noqa: E731
        print(f"| {human(size)} | {res['loom'] * 1e6:.0f} us | {res['gloo'] * 1e6:.0f} us | "
              f"{bus(res['loom']):.3f} | {bus(res['gloo']):.3f} | {res['gloo'] / res['loom']:.2f}x |")
    print(f"\nDDP step (MLP 1024-1024-1024-10, 2.1 M parameters, batch 32): loom "
          f"{ddp['loom'] * 1e3:.2f} ms, gloo {ddp['gloo'] * 1e3:.2f} ms "
          f"(loom/gloo speed {ddp['gloo'] / ddp['loom']:.2f}x)")


if __name__ == "__main__":
    main()
