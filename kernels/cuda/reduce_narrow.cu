// Kernels for the 16- and 8-bit float types (computed in fp32, rounded back per op).
#include "kernels/cuda/reduce_kernels.cuh"

LOOM_CUDA_LAUNCH_TYPE(kFloat16)
LOOM_CUDA_LAUNCH_TYPE(kBfloat16)
LOOM_CUDA_LAUNCH_TYPE(kFloat8e4m3)
LOOM_CUDA_LAUNCH_TYPE(kFloat8e5m2)
