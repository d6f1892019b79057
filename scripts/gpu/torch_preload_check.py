"""torch's own ProcessGroupNCCL (backend "nccl") with Loom's libnccl.so.2 preloaded, every
rank on GPU 0: what stock NCCL refuses ("Duplicate GPU detected"). Run by
scripts/gpu_check.sh on a machine with a GPU:

    LD_PRELOAD=.gpu/lib/nccl/libnccl.so.2 \\
        python3 -m torch.distributed.run --standalone --nproc-per-node 2 torch_preload_check.py

Checks exact results of all_reduce (sum, max, avg), broadcast, all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single and send/recv on CUDA tensors, then 10 DDP steps
whose parameters must equal a single-process computation on the whole batch. Prints one
line starting "torch_preload_check:" and exits 0 when everything held.
"""
import os
import sys

import torch
import torch.distributed as dist


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def collectives(rank, n, dev):
    x = torch.arange(1000, dtype=torch.float32, device=dev) + rank
    y = x.clone()
    dist.all_reduce(y)
    want = torch.arange(1000, dtype=torch.float32, device=dev) * n + n * (n - 1) / 2
    check(torch.equal(y, want), "all_reduce sum")
    y = x.clone()
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    check(torch.equal(y, x - rank + (n - 1)), "all_reduce max")
    y = x.clone()
    dist.all_reduce(y, op=dist.ReduceOp.AVG)
    check(torch.allclose(y, want / n), "all_reduce avg")
    b = x.clone() if rank == 0 else torch.zeros_like(x)
    dist.broadcast(b, src=0)
    check(torch.equal(b, x - rank), "broadcast")
    g = torch.empty(n * 1000, device=dev)
    dist.all_gather_into_tensor(g, x)
    check(torch.equal(g.view(n, 1000)[n - 1], x - rank + n - 1), "all_gather_into_tensor")
    big = torch.arange(n * 1000, dtype=torch.float32, device=dev) + rank
    rs = torch.empty(1000, device=dev)
    dist.reduce_scatter_tensor(rs, big)
    base = torch.arange(n * 1000, dtype=torch.float32, device=dev)[rank * 1000:(rank + 1) * 1000]
    check(torch.equal(rs, base * n + n * (n - 1) / 2), "reduce_scatter_tensor")
    a2a_in = torch.full((n * 10,), float(rank), device=dev)
    a2a_out = torch.empty_like(a2a_in)
    dist.all_to_all_single(a2a_out, a2a_in)
    check(torch.equal(a2a_out, torch.arange(n, device=dev).float().repeat_interleave(10)),
          "all_to_all_single")
    if n >= 2:
        if rank == 0:
            dist.send(torch.full((100,), 7.0, device=dev), dst=1)
        elif rank == 1:
            r = torch.empty(100, device=dev)
            dist.recv(r, src=0)
            check(torch.equal(r, torch.full((100,), 7.0, device=dev)), "send/recv")
    torch.cuda.synchronize()


def ddp_steps(rank, n, dev, steps=10):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ref.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model.to(dev), device_ids=[dev.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        xs = torch.randn(n * 8, 16, generator=g)
        ys = torch.randn(n * 8, 4, generator=g)
        mine = slice(rank * 8, (rank + 1) * 8)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(xs[mine].to(dev)), ys[mine].to(dev)).backward()
        opt.step()
        # The same step on one process: the mean of the ranks' gradients is the gradient
        # of the mean of their losses.
        ref_opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(ref(xs[r * 8:(r + 1) * 8]), ys[r * 8:(r + 1) * 8])
                   for r in range(n)) / n
        loss.backward()
        ref_opt.step()
    for p, q in zip(ddp.module.parameters(), ref.parameters()):
        check(torch.allclose(p.detach().cpu(), q.detach(), atol=1e-5, rtol=1e-4),
              "DDP parameters differ from the single-process computation")


def main():
    rank = int(os.environ["RANK"])
    n = int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", 0)  # every rank on GPU 0
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    try:
        collectives(rank, n, dev)
        ddp_steps(rank, n, dev)
        dist.barrier()
    except Exception as e:  # one line that gpu_check.sh puts in its table
        print("torch_preload_check: rank %d FAILED: %s: %s" % (rank, type(e).__name__, e), flush=True)
        dist.destroy_process_group()
        return 1
    dist.destroy_process_group()
    if rank == 0:
        print("torch_preload_check: ok: %d processes on GPU 0, torch %s, 7 collectives and 10 DDP "
              "steps exact" % (n, torch.__version__), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
