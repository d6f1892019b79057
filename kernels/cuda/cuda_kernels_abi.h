/* The C ABI of libloom-cuda-kernels.so, the CUDA reductions libloom loads with dlopen (so
 * libloom itself never links the CUDA runtime). Plain C, no CUDA headers: the engine
 * includes it to call through dlsym'd pointers. Data types use ncclDataType_t's numbers;
 * kinds are loom::RedKind's (kernels/arith.h); scalarBits is loom::Reducer::scalarBits.
 * Arithmetic is kernels/arith.h, so results are bit-identical to the CPU executor's. */
#ifndef LOOM_KERNELS_CUDA_CUDA_KERNELS_ABI_H_
#define LOOM_KERNELS_CUDA_CUDA_KERNELS_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_CUDA_KERNELS_LIBRARY "libloom-cuda-kernels.so"
#define LOOM_CUDA_KERNELS_ABI_VERSION 1

/* What loomCudaReduce computes, element-wise over n elements (see loom::Reducer):
 * REDUCE  dst = a OP pre(b)   (b is this rank's own contribution)
 * REDUCE2 dst = a OP b
 * PRE     dst = pre(a)        (a copy unless the kind is PreMulSum)
 * POST    dst = post(a)       (a copy unless the kind is SumPostDiv)
 * dst may be the same pointer as a or b; otherwise buffers must not overlap. */
#define LOOM_CUDA_FN_REDUCE 0
#define LOOM_CUDA_FN_REDUCE2 1
#define LOOM_CUDA_FN_PRE 2
#define LOOM_CUDA_FN_POST 3

/* Identical to cudaStream_t. */
typedef struct CUstream_st* loomCudaStream_t;

/* Enqueues the kernel on stream; returns a cudaError_t (0 on success;
 * cudaErrorInvalidValue (1) for an unknown fn, dtype or kind). */
typedef int (*loomCudaReduce_t)(int fn, int dtype, int kind, uint64_t scalarBits, void* dst,
                                const void* a, const void* b, size_t n, loomCudaStream_t stream);
typedef int (*loomCudaKernelsAbiVersion_t)(void);

int loomCudaReduce(int fn, int dtype, int kind, uint64_t scalarBits, void* dst, const void* a,
                   const void* b, size_t n, loomCudaStream_t stream);
int loomCudaKernelsAbiVersion(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_KERNELS_CUDA_CUDA_KERNELS_ABI_H_ */
