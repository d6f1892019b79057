// libloom-cuda-kernels.so, the CUDA module of Loom's kernels (kernels/cuda/cuda_kernels_abi.h),
// loaded on first use with dlopen: libloom itself never links the CUDA runtime.
#pragma once

#include <string>

#include "kernels/cuda/cuda_kernels_abi.h"

namespace loom::cuda {

struct Kernels {
  std::string path;
  const void* lib = nullptr;  // the module's DynLib, never closed
  loomCudaReduce_t reduce = nullptr;  // elementwise reductions, enqueued on a stream
  loomCudaReduceMulti_t reduceMulti = nullptr;  // one pass over several inputs and outputs
  loomCudaInterpLaunch_t interpLaunch = nullptr;  // the device executor's plan interpreter
};

// The module (LOOM_CUDA_KERNELS_LIBRARY, else the one next to libloom, else the loader's
// search; with LOOM_CUDA_DRIVER_LIBRARY set, only the first), or nullptr when none loads with
// this ABI (said once at INFO). Thread-safe.
const Kernels* kernels();
// Gives the module up for the rest of the process (it loaded but cannot run here: a GPU it
// was not built for, a driver too old for its runtime); says why once, at WARN.
void disableKernels(const std::string& why);

}  // namespace loom::cuda
