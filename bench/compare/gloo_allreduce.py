"""PyTorch Gloo side of Loom's side-by-side comparison (bench/compare/compare.py).

One process per rank, started by the driver with torch.distributed's env:// variables
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Times dist.all_reduce (float32 sum, which
is in place: Gloo has no out-of-place all-reduce) or dist.all_gather over a list of sizes
the way nccl-tests times a row: warm-up calls, then `iters` calls timed as one loop; the
per-call time is loop time / iters, averaged over ranks. Sizes are nccl-tests' "size"
column (the whole buffer for all-reduce, the gathered output for all-gather).

Rank 0 prints one machine-readable line per size, the same as mpi_allreduce.c:
  RESULT <op> <bytes> <count> <iters> <time_us> <algbw_GBps> <busbw_GBps> <wrong>
"""

import argparse
import datetime
import os
import sys
import time


def parse_sizes(text):
    """BYTES:ITERS[:WARMUP],... -> [(bytes, iters, warmup or None)]."""
    out = []
    for item in text.split(","):
        fields = [int(f) for f in item.split(":")]
        out.append((fields[0], fields[1], fields[2] if len(fields) > 2 else None))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=["allreduce", "allgather"], default="allreduce")
    parser.add_argument("--sizes", required=True, help="BYTES:ITERS[:WARMUP][,...]")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per rank (default 1: one core per rank)")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    dist.init_process_group(backend="gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=120))
    rank, nranks = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"# gloo_allreduce op {args.op} nranks {nranks} torch {torch.__version__}",
              flush=True)

    for size, iters, warmup in parse_sizes(args.sizes):
        total = size // 4
        count = total if args.op == "allreduce" else total // nranks
        if count == 0:
            continue
        # Small integers: every float sum is exact, so the check is exact.
        base = (torch.arange(count, dtype=torch.int64) % 7 + (rank + 1)).to(torch.float32)
        tensor = base.clone()
        outputs = [torch.empty(count, dtype=torch.float32) for _ in range(nranks)]

        def run_once():
            if args.op == "allreduce":
                dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
            else:
                dist.all_gather(outputs, tensor)

        for _ in range(args.warmup if warmup is None else warmup):
            run_once()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            run_once()
        per_call = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(per_call, op=dist.ReduceOp.SUM)
        sec = per_call.item() / nranks

        # Check once outside the timed loop (the in-place all-reduce grew `tensor`).
        tensor.copy_(base)
        run_once()
        pattern = torch.arange(count, dtype=torch.int64) % 7
        if args.op == "allreduce":
            want = (pattern * nranks + nranks * (nranks + 1) // 2).to(torch.float32)
            wrong = int((tensor != want).sum())
        else:
            wrong = sum(int((outputs[r] != (pattern + r + 1).to(torch.float32)).sum())
                        for r in range(nranks))
        wrong_t = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(wrong_t, op=dist.ReduceOp.SUM)

        nbytes = total * 4
        algbw = nbytes / 1e9 / sec
        factor = 2.0 * (nranks - 1) / nranks if args.op == "allreduce" else (nranks - 1) / nranks
        if rank == 0:
            print(f"RESULT {args.op} {nbytes} {total} {iters} {sec * 1e6:.3f} {algbw:.4f} "
                  f"{algbw * factor:.4f} {int(wrong_t.item())}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
