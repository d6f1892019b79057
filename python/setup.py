"""Builds loom_torch against the torch installed here and an installed Loom.

    LOOM_PREFIX=/path/to/loom/install pip install --no-build-isolation ./python

LOOM_PREFIX is Loom's `cmake --install` prefix (include/nccl.h, lib/libloom.so); without
it, pkg-config's loom.pc is asked. Nothing of Loom's sources is compiled in: the
extension loads that libloom.so at run time (LOOM_TORCH_LIBRARY overrides the path).
"""
import os
import subprocess

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension


def loom_prefix():
    prefix = os.environ.get("LOOM_PREFIX")
    if not prefix:
        try:
            prefix = subprocess.check_output(["pkg-config", "--variable=prefix", "loom"],
                                             text=True).strip()
        except (OSError, subprocess.CalledProcessError):
            raise SystemExit("loom_torch: set LOOM_PREFIX to Loom's install prefix "
                             "(cmake --install), or let pkg-config find loom.pc")
    prefix = os.path.abspath(prefix)
    if not os.path.exists(os.path.join(prefix, "include", "nccl.h")):
        raise SystemExit(f"loom_torch: {prefix}/include/nccl.h not found: is LOOM_PREFIX "
                         "Loom's install prefix?")
    return prefix


PREFIX = loom_prefix()
LIBRARY = os.path.join(PREFIX, "lib", "libloom.so")

setup(
    name="loom-torch",
    version="0.1.0",
    description="Loom as a torch.distributed backend",
    packages=["loom_torch"],
    ext_modules=[
        CppExtension(
            "loom_torch._C",
            ["loom_torch/csrc/module.cpp", "loom_torch/csrc/backend.cpp",
             "loom_torch/csrc/backend_gather.cpp", "loom_torch/csrc/loom_api.cpp"],
            include_dirs=[os.path.join(PREFIX, "include")],
            define_macros=[("LOOM_LIBRARY", '"' + LIBRARY + '"')],
            extra_compile_args=["-O2"],
            libraries=["dl"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
