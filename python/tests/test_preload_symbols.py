"""How torch reaches NCCL, and that Loom's drop-in serves all of it (issue 13, part 2).

torch's Linux wheels link NCCL dynamically: libtorch_cuda.so has DT_NEEDED libnccl.so.2
(found through its RPATH in the nvidia-nccl-cu12 package), so LD_PRELOAD of Loom's
drop-in lib/nccl/libnccl.so.2 puts Loom's nccl* symbols first. Every nccl* symbol any
library of this torch imports must be exported by that drop-in, or ProcessGroupNCCL
would fail to bind (or bind half to Loom, half to stock NCCL).
"""
import glob
import os
import subprocess
import unittest

import torch

import loom_torch


def dynamic_symbols(path, undefined):
    flag = "--undefined-only" if undefined else "--defined-only"
    out = subprocess.run(["nm", "-D", flag, path], capture_output=True, text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


class PreloadSymbols(unittest.TestCase):
    def setUp(self):
        self.torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        prefix = os.path.dirname(os.path.dirname(loom_torch.library()))
        self.dropin = os.path.join(prefix, "lib", "nccl", "libnccl.so.2")
        self.assertTrue(os.path.exists(self.dropin), f"no drop-in at {self.dropin}")

    def test_torch_links_nccl_dynamically(self):
        cuda = os.path.join(self.torch_lib, "libtorch_cuda.so")
        if not os.path.exists(cuda):
            self.skipTest("a CPU-only torch: no libtorch_cuda.so, no NCCL")
        needed = subprocess.run(["readelf", "-d", cuda], capture_output=True, text=True).stdout
        self.assertIn("[libnccl.so.2]", needed, "libtorch_cuda.so no longer needs libnccl.so.2 "
                      "dynamically: LD_PRELOAD would not reach it")

    def test_every_nccl_symbol_torch_imports_is_exported_by_the_dropin(self):
        wanted = {}
        for lib in glob.glob(os.path.join(self.torch_lib, "*.so*")):
            for sym in dynamic_symbols(lib, undefined=True):
                if sym.startswith(("nccl", "pnccl")):
                    wanted.setdefault(sym, os.path.basename(lib))
        if not wanted:
            self.skipTest("this torch imports no nccl* symbol")
        exported = dynamic_symbols(self.dropin, undefined=False)
        missing = sorted(s for s in wanted if s not in exported)
        self.assertEqual(missing, [], f"{len(missing)} of the {len(wanted)} nccl* symbols torch "
                         f"imports are not exported by {self.dropin}: " +
                         ", ".join(f"{s} ({wanted[s]})" for s in missing))
        self.assertGreaterEqual(len(wanted), 30, f"only {len(wanted)} nccl* imports found")


if __name__ == "__main__":
    unittest.main()
