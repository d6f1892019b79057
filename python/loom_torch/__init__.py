"""Loom as a torch.distributed backend.

    import loom_torch  # registers the backend "loom"
    torch.distributed.init_process_group("loom", ...)

CPU tensors (Loom's host path). For CUDA tensors use torch's own backend "nccl" with
Loom's libnccl.so.2 preloaded (LD_PRELOAD), which hands them to Loom's device paths. The unique id of each process group travels through the store torch passes in
(env://, TCPStore, FileStore ...).
"""
import torch  # noqa: F401  (the extension needs torch's libraries loaded first)
import torch.distributed as dist

from . import _C

__all__ = ["library", "nccl_version"]

library = _C.library
nccl_version = _C.nccl_version


def _create_backend(store, rank, size, timeout):
    return _C.create_backend(store, rank, size, timeout)


try:
    dist.Backend.register_backend("loom", _create_backend, devices=["cpu"])
except TypeError:  # torch before 2.1: no `devices`
    dist.Backend.register_backend("loom", _create_backend)
