"""Launched by torchrun (env://: MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, torch's TCPStore):
the unique id travels through the store torch passes in, and all_reduce is exact."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist, loom_torch
    dist.init_process_group("loom")            # env:// from torchrun
    r, n = dist.get_rank(), dist.get_world_size()
    t = torch.full((1000,), float(r + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((1000,), float(n * (n + 1) // 2))), t[:4]
    print(f"rank {r}/{n} ok", flush=True)
    dist.destroy_process_group()
""")


class Torchrun(unittest.TestCase):
    def test_torchrun_env_init(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "job.py")
            with open(path, "w") as f:
                f.write(SCRIPT)
            p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
                                "--master-port", "29733", path], capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            for r in range(3):
                self.assertIn(f"rank {r}/3 ok", p.stdout, p.stdout + p.stderr)


if __name__ == "__main__":
    unittest.main()
