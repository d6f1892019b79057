// The interpreter kernel for fp32 and fp64.
#include "kernels/cuda/interp_kernel.cuh"

LOOM_CUDA_INTERP_TYPE(kFloat32)
LOOM_CUDA_INTERP_TYPE(kFloat64)
