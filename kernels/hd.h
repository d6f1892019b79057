// Marks functions that host threads and CUDA kernels both run. Headers of kernels/ that a
// device executor compiles with nvcc (fifo_sync.h, step_primitive.h) use it; compiled by a
// host compiler it expands to nothing.
#pragma once

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__
#define LOOM_DEVICE __device__
#else
#define LOOM_HD
#define LOOM_DEVICE
#endif
