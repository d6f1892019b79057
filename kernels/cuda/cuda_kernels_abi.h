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
#define LOOM_CUDA_KERNELS_ABI_VERSION 4

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

/* One pass over several inputs (ABI 3), for collectives between ranks that share a GPU: for
 * every element i and every output j,
 *   out[j][i] = post(pre_0(in[0][i]) OP pre_1(in[1][i]) OP ... OP pre_{nin-1}(in[nin-1][i]))
 * combined left to right and rounded after each step exactly as the chain PRE/REDUCE2 (or
 * PRE/REDUCE with PreMulSum), ..., POST of loomCudaReduce would, so the bits are the same.
 * pre_i scales by inScalar[i] (PreMulSum: each rank's own scalar); post applies postBits
 * (SumPostDiv). An output may be the same pointer as an input; buffers must not otherwise
 * overlap. Returns cudaErrorInvalidValue (1) for nin outside 1..LOOM_CUDA_MULTI_MAX, nout
 * outside 0..LOOM_CUDA_MULTI_MAX, a null pointer, or an unknown dtype or kind. */
#define LOOM_CUDA_MULTI_MAX 16
typedef struct loomCudaMulti {
  int nin;
  int nout;
  const void* in[LOOM_CUDA_MULTI_MAX];
  uint64_t inScalar[LOOM_CUDA_MULTI_MAX];
  void* out[LOOM_CUDA_MULTI_MAX];
} loomCudaMulti;
typedef int (*loomCudaReduceMulti_t)(int dtype, int kind, uint64_t postBits,
                                     const loomCudaMulti* m, size_t n, loomCudaStream_t stream);
int loomCudaReduceMulti(int dtype, int kind, uint64_t postBits, const loomCudaMulti* m, size_t n,
                        loomCudaStream_t stream);

int loomCudaReduce(int fn, int dtype, int kind, uint64_t scalarBits, void* dst, const void* a,
                   const void* b, size_t n, loomCudaStream_t stream);

/* The device executor: the plan interpreter of kernels/interp.h, one block per channel.
 * A connection FIFO end as the kernel finds it (kernels/fifo_sync.h's FifoEndT): ctrl,
 * slots and headAt in memory the GPU reaches; `step` is where this end's step count is kept
 * between launches (device memory; the kernel reads it at start and writes it back). */
typedef struct loomCudaFifo {
  int peer;
  int conn;
  int send; /* 1: the sending end of the connection; 0: the receiving end */
  int depth;
  void* ctrl;  /* FifoCtrl */
  void* slots; /* depth * slotBytes */
  uint64_t slotBytes;
  uint64_t* step;
  uint64_t* headAt; /* NULL: the head is ctrl's */
} loomCudaFifo;

/* A launch's table holds every channel's FIFO ends, at most LOOM_CUDA_INTERP_MAX_TABLE (more
 * are refused: cudaErrorInvalidValue). Each channel (block) takes the ends it uses from it as
 * it first needs them, at most LOOM_CUDA_INTERP_MAX_FIFOS (ABI 4; a channel needing more stops
 * with LOOM_CUDA_INTERP_TOO_MANY_FIFOS). */
#define LOOM_CUDA_INTERP_MAX_FIFOS 32
#define LOOM_CUDA_INTERP_MAX_TABLE 1024

/* What a launch leaves in *status (memory the GPU writes: device memory, or host memory
 * mapped for it). A nonzero status at launch makes the kernel return at once: the engine
 * keeps one status per communicator, so that a failed collective stops the later ones. */
#define LOOM_CUDA_INTERP_OK 0u
#define LOOM_CUDA_INTERP_SIZE_MISMATCH 1u  /* a peer posted a step of another size */
#define LOOM_CUDA_INTERP_REMOTE_PAYLOAD 2u /* a peer posted an address, not data */
#define LOOM_CUDA_INTERP_ABORTED 3u        /* the abort word stopped an LL read halfway */
#define LOOM_CUDA_INTERP_TOO_MANY_FIFOS 4u /* a channel uses more FIFO ends than it can keep */

typedef struct loomCudaInterpArgs {
  const void* plan; /* a FlatPlan (kernels/interp.h) in device memory */
  size_t count;     /* elements, as the plan's builder counts them */
  size_t elt;       /* bytes per element */
  const void* sendbuf;
  void* recvbuf;
  void* scratch;
  const loomCudaFifo* fifos; /* device memory */
  int nFifos;
  int dtype; /* ncclDataType_t */
  int kind;  /* loom::RedKind */
  uint64_t scalarBits;
  const uint32_t* abortWord; /* host-mapped: nonzero stops the kernel at its next wait */
  uint32_t* status;
  int proto;                 /* LOOM_CUDA_INTERP_PROTO_* (both ends of a connection alike) */
  void* llStaging;           /* LL: 2 * llStageBytes per channel, device memory */
  uint64_t llStageBytes;     /* LL: a multiple of 16, at least llCapacity(slotBytes) of the
                                largest slot (kernels/ll.h) */
} loomCudaInterpArgs;

#define LOOM_CUDA_INTERP_PROTO_SIMPLE 0
#define LOOM_CUDA_INTERP_PROTO_LL 1

/* Enqueues the interpreter for `channels` channels on stream; returns a cudaError_t
 * (cudaErrorInvalidValue (1) for an unknown dtype or kind, or too many FIFOs). */
typedef int (*loomCudaInterpLaunch_t)(const loomCudaInterpArgs* args, int channels,
                                      loomCudaStream_t stream);
int loomCudaInterpLaunch(const loomCudaInterpArgs* args, int channels, loomCudaStream_t stream);
int loomCudaKernelsAbiVersion(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_KERNELS_CUDA_CUDA_KERNELS_ABI_H_ */
