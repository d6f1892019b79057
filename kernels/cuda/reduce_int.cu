// Kernels for the integer types.
#include "kernels/cuda/reduce_kernels.cuh"

LOOM_CUDA_LAUNCH_TYPE(kInt8)
LOOM_CUDA_LAUNCH_TYPE(kUint8)
LOOM_CUDA_LAUNCH_TYPE(kInt32)
LOOM_CUDA_LAUNCH_TYPE(kUint32)
LOOM_CUDA_LAUNCH_TYPE(kInt64)
LOOM_CUDA_LAUNCH_TYPE(kUint64)
