// The interpreter kernel for the 16- and 8-bit floating-point types.
#include "kernels/cuda/interp_kernel.cuh"

LOOM_CUDA_INTERP_TYPE(kFloat16)
LOOM_CUDA_INTERP_TYPE(kBfloat16)
LOOM_CUDA_INTERP_TYPE(kFloat8e4m3)
LOOM_CUDA_INTERP_TYPE(kFloat8e5m2)
