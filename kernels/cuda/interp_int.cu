// The interpreter kernel for the integer types.
#include "kernels/cuda/interp_kernel.cuh"

LOOM_CUDA_INTERP_TYPE(kInt8)
LOOM_CUDA_INTERP_TYPE(kUint8)
LOOM_CUDA_INTERP_TYPE(kInt32)
LOOM_CUDA_INTERP_TYPE(kUint32)
LOOM_CUDA_INTERP_TYPE(kInt64)
LOOM_CUDA_INTERP_TYPE(kUint64)
