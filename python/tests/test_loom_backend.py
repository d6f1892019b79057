"""The "loom" torch.distributed backend under torch's own multi-process harness
(MultiProcessTestCase: one process per rank, a FileStore rendezvous), CPU tensors.

Every collective torch offers on a backend, each checked exactly against what the ranks
contributed; every dtype Loom moves; non-contiguous tensors; asynchronous works; new
groups, split groups and shrunk groups; errors as Python exceptions; a killed rank failing the
others, and the survivors shrinking it out; DDP against gloo.

    python -m pytest python/tests -q      (or: python python/tests/test_loom_backend.py)
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_utils import run_tests

import loom_torch  # noqa: F401  registers "loom"

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
          torch.uint8, torch.int32, torch.int64]
FLOAT8 = [d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d]


class LoomTestBase(MultiProcessTestCase):
    @property
    def world_size(self):
        return 3

    def setUp(self):
        super().setUp()
        # Forked ranks inherit the imported torch (a spawned one imports it again: seconds
        # per rank per test). The test process itself runs no torch ops, so forking is safe.
        # Torch 2.15 dropped _fork_processes; _start_processes takes the process class.
        fork = getattr(self, "_fork_processes", None)
        if fork:
            fork()
        else:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

    def tearDown(self):
        super().tearDown()
        try:
            os.remove(self.file_name)
        except OSError:
            pass

    def init(self, backend="loom", suffix=""):
        store = dist.FileStore(self.file_name + suffix, self.world_size)
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size)

    def fini(self):
        dist.destroy_process_group()

    def sgd_steps(self, model, steps):
        """SGD on random batches, different per rank but the same for every backend."""
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(100 + self.rank)
        for _ in range(steps):
            x = torch.randn(8, 16, generator=g)
            y = torch.randn(8, 4, generator=g)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()


class LoomCollectivesTest(LoomTestBase):
    def test_all_reduce_every_op_and_dtype(self):
        self.init()
        n, r = self.world_size, self.rank
        for dtype in DTYPES:
            base = torch.arange(1, 8).to(dtype)
            for op, want in ((dist.ReduceOp.SUM, base * sum(k + 1 for k in range(n))),
                             (dist.ReduceOp.MAX, base * n), (dist.ReduceOp.MIN, base),
                             (dist.ReduceOp.PRODUCT, base ** 0 * 6 if n == 3 else None)):
                t = base * (r + 1) if op != dist.ReduceOp.PRODUCT else torch.full((7,), r + 1).to(dtype)
                dist.all_reduce(t, op=op)
                self.assertEqual(t, want.to(dtype), msg=f"{dtype} {op}")
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            t = torch.full((5,), float(self.rank * 3), dtype=dtype)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            self.assertEqual(t, torch.full((5,), 3.0, dtype=dtype))
            t = torch.full((5,), float(self.rank + 1), dtype=dtype)
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
            self.assertEqual(t, torch.full((5,), 3.0, dtype=dtype))
        c = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * (r + 1)
        dist.all_reduce(c)
        self.assertEqual(c, torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * 6)
        b = torch.tensor([r == 0, True])
        dist.all_reduce(b, op=dist.ReduceOp.MIN)
        self.assertEqual(b, torch.tensor([False, True]))
        self.fini()

    def test_float8_moves_exactly(self):
        if not FLOAT8:
            self.skipTest("this torch has no float8 types")
        self.init()
        for dtype in FLOAT8:
            t = torch.tensor([0.5, 1.0, 2.0, -4.0]).to(dtype) if self.rank == 1 else torch.zeros(4).to(dtype)
            dist.broadcast(t, src=1)
            self.assertEqual(t.float(), torch.tensor([0.5, 1.0, 2.0, -4.0]))
            s = torch.tensor([1.0, 2.0]).to(dtype)
            dist.all_reduce(s)
            self.assertEqual(s.float(), torch.tensor([3.0, 6.0]))
        self.fini()

    def test_non_contiguous_tensors(self):
        self.init()
        m = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (self.rank + 1)
        col = m.t()  # a transposed view
        self.assertFalse(col.is_contiguous())
        dist.all_reduce(col)
        self.assertEqual(m, torch.arange(12, dtype=torch.float32).reshape(3, 4) * 6)
        v = torch.zeros(4, 2)[:, 0]
        if self.rank == 2:
            v.copy_(torch.tensor([1.0, 2, 3, 4]))
        dist.broadcast(v, src=2)
        self.assertEqual(v, torch.tensor([1.0, 2, 3, 4]))
        self.fini()

    def test_broadcast_and_reduce_from_every_root(self):
        self.init()
        for root in range(self.world_size):
            t = torch.full((9,), float(self.rank + 10))
            dist.broadcast(t, src=root)
            self.assertEqual(t, torch.full((9,), float(root + 10)))
            t = torch.full((9,), float(self.rank + 1))
            dist.reduce(t, dst=root)
            if self.rank == root:
                self.assertEqual(t, torch.full((9,), 6.0))
        self.fini()

    def test_all_gather_family(self):
        self.init()
        n, r = self.world_size, self.rank
        mine = torch.arange(5, dtype=torch.int64) + 100 * r
        outs = [torch.empty(5, dtype=torch.int64) for _ in range(n)]
        dist.all_gather(outs, mine)
        for k in range(n):
            self.assertEqual(outs[k], torch.arange(5, dtype=torch.int64) + 100 * k)
        flat = torch.empty(5 * n, dtype=torch.int64)
        dist.all_gather_into_tensor(flat, mine)
        self.assertEqual(flat, torch.cat([torch.arange(5, dtype=torch.int64) + 100 * k for k in range(n)]))
        objs = [None] * n
        dist.all_gather_object(objs, {"rank": r})
        self.assertEqual(objs, [{"rank": k} for k in range(n)])
        self.fini()

    def test_reduce_scatter_family(self):
        self.init()
        n, r = self.world_size, self.rank
        ins = [torch.full((4,), float(r + 1) * (k + 1)) for k in range(n)]
        out = torch.empty(4)
        dist.reduce_scatter(out, ins)
        self.assertEqual(out, torch.full((4,), 6.0 * (r + 1)))
        big = torch.cat(ins)
        out2 = torch.empty(4)
        dist.reduce_scatter_tensor(out2, big)
        self.assertEqual(out2, torch.full((4,), 6.0 * (r + 1)))
        self.fini()

    def test_all_to_all_even_and_uneven(self):
        self.init()
        n, r = self.world_size, self.rank
        ins = [torch.full((2,), float(10 * r + k)) for k in range(n)]
        outs = [torch.empty(2) for _ in range(n)]
        dist.all_to_all(outs, ins)
        for k in range(n):
            self.assertEqual(outs[k], torch.full((2,), float(10 * k + r)))
        # Uneven: rank r sends k + r + 1 rows to rank k.
        in_splits = [k + r + 1 for k in range(n)]
        out_splits = [r + k + 1 for k in range(n)]
        x = torch.cat([torch.full((s, 3), float(100 * r + k)) for k, s in enumerate(in_splits)])
        y = torch.empty(sum(out_splits), 3)
        dist.all_to_all_single(y, x, out_splits, in_splits)
        want = torch.cat([torch.full((s, 3), float(100 * k + r)) for k, s in enumerate(out_splits)])
        self.assertEqual(y, want)
        z = torch.arange(3 * n, dtype=torch.float64) + 1000 * r
        w = torch.empty(3 * n, dtype=torch.float64)
        dist.all_to_all_single(w, z)
        self.assertEqual(w, torch.cat([torch.arange(3 * r, 3 * r + 3, dtype=torch.float64) + 1000 * k for k in range(n)]))
        self.fini()

    def test_gather_and_scatter(self):
        self.init()
        n, r = self.world_size, self.rank
        for root in range(n):
            mine = torch.full((3,), float(r * 7))
            outs = [torch.empty(3) for _ in range(n)] if r == root else None
            dist.gather(mine, outs, dst=root)
            if r == root:
                for k in range(n):
                    self.assertEqual(outs[k], torch.full((3,), float(k * 7)))
            got = torch.empty(3)
            parts = [torch.full((3,), float(k + root)) for k in range(n)] if r == root else None
            dist.scatter(got, parts, src=root)
            self.assertEqual(got, torch.full((3,), float(r + root)))
        self.fini()

    def test_send_recv_and_batch_isend_irecv(self):
        self.init()
        n, r = self.world_size, self.rank
        nxt, prv = (r + 1) % n, (r - 1) % n
        if r == 0:
            dist.send(torch.tensor([42.0, 43.0]), dst=1)
        elif r == 1:
            t = torch.empty(2)
            dist.recv(t, src=0)
            self.assertEqual(t, torch.tensor([42.0, 43.0]))
        got = torch.empty(4, dtype=torch.int32)
        ops = [dist.P2POp(dist.isend, torch.full((4,), r, dtype=torch.int32), nxt),
               dist.P2POp(dist.irecv, got, prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        self.assertEqual(got, torch.full((4,), prv, dtype=torch.int32))
        self.fini()

    def test_barrier_async_works_and_futures(self):
        self.init()
        dist.barrier()
        ts = [torch.full((1000,), float(self.rank + 1)) for _ in range(8)]
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        fut = works[-1].get_future()
        for w in works:
            w.wait()
        self.assertTrue(all(w.is_completed() for w in works))
        self.assertEqual(fut.wait()[0], torch.full((1000,), 6.0))
        for t in ts:
            self.assertEqual(t, torch.full((1000,), 6.0))
        self.fini()

    def test_new_group_and_subgroup_collectives(self):
        self.init()
        g = dist.new_group([0, 2])
        if self.rank in (0, 2):
            t = torch.full((3,), float(self.rank + 1))
            dist.all_reduce(t, group=g)
            self.assertEqual(t, torch.full((3,), 4.0))
        t = torch.ones(2)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((2,), 3.0))
        self.fini()

    def test_split_group(self):
        """split_group splits the parent's communicator (ncclCommSplit, no new rendezvous);
        a rank in none of the groups gets no group."""
        if not hasattr(dist, "split_group"):
            self.skipTest("this torch has no split_group")
        self.init()
        self.assertTrue(dist.group.WORLD._get_backend(torch.device("cpu")).supports_splitting)
        try:
            g = dist.split_group(split_ranks=[[2, 0]])
        except RuntimeError as e:  # torch 2.9 splits only groups bound to an accelerator
            if "No device associated" not in str(e):
                raise
            self.skipTest("this torch splits only groups bound to an accelerator")
        if self.rank == 1:
            self.assertEqual(g, dist.GroupMember.NON_GROUP_MEMBER)
        else:
            self.assertEqual(dist.get_world_size(g), 2)
            self.assertEqual(dist.get_rank(g), [2, 0].index(self.rank))
            t = torch.full((5,), float(self.rank + 1))
            dist.all_reduce(t, group=g)
            self.assertEqual(t, torch.full((5,), 4.0))
            out = [torch.empty(1) for _ in range(2)]
            dist.all_gather(out, torch.full((1,), float(self.rank)), group=g)
            self.assertEqual(torch.cat(out), torch.tensor([2.0, 0.0]))  # the group's order
        t = torch.ones(2)
        dist.all_reduce(t)  # the parent still works
        self.assertEqual(t, torch.full((2,), 3.0))
        self.fini()

    def test_shrink_group(self):
        """shrink_group (torch >= 2.10) shrinks the communicator (ncclCommShrink): the ranks
        left out do not take part; the survivors' group keeps their order."""
        if not hasattr(dist, "shrink_group"):
            self.skipTest("this torch has no shrink_group")
        self.init()
        self.assertTrue(dist.group.WORLD._get_backend(torch.device("cpu")).supports_shrinking)
        t = torch.ones(4)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((4,), 3.0))
        if self.rank == 1:
            return  # left out: never calls shrink_group; its communicator goes with the process
        g = dist.shrink_group([1])
        self.assertEqual(dist.get_world_size(g), 2)
        self.assertEqual(dist.get_rank(g), [0, 2].index(self.rank))
        t = torch.full((5,), float(self.rank + 1))
        dist.all_reduce(t)  # the shrunk group is the new default
        self.assertEqual(t, torch.full((5,), 4.0))
        out = [torch.empty(1) for _ in range(2)]
        dist.all_gather(out, torch.full((1,), float(self.rank)))
        self.assertEqual(torch.cat(out), torch.tensor([0.0, 2.0]))
        self.fini()

    def test_errors_are_python_exceptions(self):
        self.init()
        with self.assertRaisesRegex(RuntimeError, "BAND, BOR, BXOR"):
            dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND)
        with self.assertRaisesRegex(RuntimeError, "not a multiple of world_size|splits"):
            dist.all_to_all_single(torch.empty(4), torch.empty(4))
        t = torch.ones(3)
        dist.all_reduce(t)  # the group still works
        self.assertEqual(t, torch.full((3,), 3.0))
        self.fini()


class LoomFailureTest(LoomTestBase):
    def _kill_rank_1(self):
        """Rank 1 dies by SIGKILL after a first all-reduce; the others' all-reduces then
        raise. Returns when they did, with the time the victim died."""
        self.init()
        t = torch.ones(1 << 12)
        dist.all_reduce(t)
        if self.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.time()
        with self.assertRaisesRegex(RuntimeError, "loom rank"):
            for _ in range(1000):
                dist.all_reduce(t)
        return start

    # Ranks other than the victim are expected to raise; the victim dies by SIGKILL.
    def test_killed_rank_fails_the_others(self):
        start = self._kill_rank_1()
        self.assertLess(time.time() - start, 30, "the survivors took too long to fail")
        os._exit(0)  # no destroy: the group is broken

    def test_survivors_shrink_the_killed_rank_out_and_carry_on(self):
        """The fault-tolerance path: a rank dies mid-training; the survivors' collective
        fails, they shrink it out with SHRINK_ABORT (no new rendezvous, nobody waits for the
        dead rank) and go on in the smaller group."""
        if not hasattr(dist, "shrink_group"):
            self.skipTest("this torch has no shrink_group")
        start = self._kill_rank_1()
        g = dist.shrink_group([1], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
        self.assertLess(time.time() - start, 30, "the survivors took too long to carry on")
        self.assertEqual(dist.get_rank(g), [0, 2].index(self.rank))
        t = torch.full((7,), float(self.rank + 1))
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((7,), 4.0))
        self.fini()
        os._exit(0)

    def _check_return_codes(self, *args):  # (fn, elapsed) or (elapsed), by torch version
        # The victim's SIGKILL is the point of the test; the others must exit cleanly.
        for i, p in enumerate(self.processes):
            if i == 1:
                self.assertEqual(p.exitcode, -signal.SIGKILL)
            else:
                self.assertEqual(p.exitcode, 0, f"rank {i} exited {p.exitcode}")


class LoomDdpTest(LoomTestBase):
    @property
    def world_size(self):
        return 2

    def _train(self, backend, suffix):
        self.init(backend, suffix)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        self.sgd_steps(ddp, 60)
        params = [p.detach().clone() for p in model.parameters()]
        self.fini()
        return params

    def test_ddp_matches_gloo(self):
        loom = self._train("loom", "_loom")
        gloo = self._train("gloo", "_gloo")
        for a, b in zip(loom, gloo):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        self.assertFalse(torch.equal(loom[0], torch.nn.Linear(16, 32).weight), "nothing trained")


def _fully_shard():
    """FSDP2's fully_shard, where this torch has it (2.6+: torch.distributed.fsdp)."""
    try:
        from torch.distributed.fsdp import fully_shard
        return fully_shard
    except ImportError:
        return None


class LoomFsdpTest(LoomTestBase):
    @property
    def world_size(self):
        return 2

    def _train(self, backend, suffix):
        from torch.distributed.device_mesh import init_device_mesh
        self.init(backend, suffix)
        fully_shard = _fully_shard()
        mesh = init_device_mesh("cpu", (self.world_size,))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.sgd_steps(model, 50)
        # Each rank holds a shard: gather the full parameters (an all-gather over the backend).
        params = [p.full_tensor().detach().clone() for p in model.parameters()]
        self.fini()
        return params

    def test_fsdp_matches_gloo(self):
        if _fully_shard() is None:
            self.skipTest("this torch has no torch.distributed.fsdp.fully_shard (FSDP2)")
        loom = self._train("loom", "_loom")
        gloo = self._train("gloo", "_gloo")
        for a, b in zip(loom, gloo):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.manual_seed(0)
        self.assertFalse(torch.equal(loom[0], torch.nn.Linear(16, 32).weight), "nothing trained")


if __name__ == "__main__":
    run_tests()
