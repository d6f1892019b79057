// Kernels for fp32 and fp64.
#include "kernels/cuda/reduce_kernels.cuh"

LOOM_CUDA_LAUNCH_TYPE(kFloat32)
LOOM_CUDA_LAUNCH_TYPE(kFloat64)
