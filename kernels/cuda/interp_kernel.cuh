// The device executor's kernel: kernels/interp.h's plan interpreter with one block per
// channel. Thread 0 polls the FIFOs (and the abort word); the block then runs the piece
// together through the step primitive with DeviceOps, the element functors of
// kernels/arith.h (the CPU loops' arithmetic, so both executors give the same bits).
// Each interp_<types>.cu instantiates interpLaunch<D> for some data types.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/arith.h"
#include "kernels/cuda/cuda_kernels_abi.h"
#include "kernels/interp.h"

namespace loom {
namespace cuda {

constexpr int kInterpThreads = 256;
// FIFO ends one block keeps: a direct algorithm over 8 ranks uses 7 sends and 7 receives.
constexpr int kInterpMaxFifos = LOOM_CUDA_INTERP_MAX_FIFOS;

using DevFifo = FifoEndT<DeviceAtomics>;

// Every thread keeps its own copy of the FIFO ends its block's channel uses, taken from the
// launch's table as the channel first needs each (every thread looks them up in the same
// order, so the copies stay alike; their step counters advance alike); thread 0 writes the
// counters back at the end, so the next launch goes on from there.
struct DeviceEnv {
  const loomCudaInterpArgs* a;
  DevFifo ends[kInterpMaxFifos];
  uint64_t start[kInterpMaxFifos];  // the counters as this block found them
  int peer[kInterpMaxFifos], conn[kInterpMaxFifos], send[kInterpMaxFifos], at[kInterpMaxFifos];
  int n = 0;

  __device__ explicit DeviceEnv(const loomCudaInterpArgs* args) : a(args) {}
  // Only the ends this block moved: the ends of concurrent channels are disjoint.
  __device__ void writeBack() const {
    for (int i = 0; i < n; ++i)
      if (ends[i].step != start[i]) *a->fifos[at[i]].step = ends[i].step;
  }
  // The sending ends this block moved, each until its receiver has released every step
  // posted on it: the receiver writes the head into this rank's memory, which its owner may
  // free once the kernel has ended. Thread 0 only; gives up when the kernel must stop.
  __device__ void drain(volatile const uint32_t* abortWord, volatile const uint32_t* status) const {
    for (int i = 0; i < n; ++i)
      for (uint32_t polls = 0; send[i] && ends[i].step != start[i] && !ends[i].drained(); ++polls)
        if ((polls & 1023u) == 1023u && (*abortWord || *status)) return;
  }
  __device__ DevFifo* find(int p, int c, int s) {
    for (int i = 0; i < n; ++i)
      if (peer[i] == p && conn[i] == c && send[i] == s) return &ends[i];
    for (int j = 0; j < a->nFifos; ++j) {
      const loomCudaFifo& f = a->fifos[j];
      if (f.peer != p || f.conn != c || f.send != s) continue;
      if (n == kInterpMaxFifos) {  // the status stops the block at its next turn
        atomicCAS(a->status, LOOM_CUDA_INTERP_OK, LOOM_CUDA_INTERP_TOO_MANY_FIFOS);
        return nullptr;
      }
      DevFifo& e = ends[n];
      e.ctrl = static_cast<FifoCtrl*>(f.ctrl);
      e.slots = static_cast<char*>(f.slots);
      e.slotBytes = f.slotBytes;
      e.depth = f.depth;
      e.step = start[n] = *f.step;
      e.headAt = f.headAt;
      peer[n] = p;
      conn[n] = c;
      send[n] = s;
      at[n] = j;
      return &ends[n++];
    }
    return nullptr;
  }
  // LL: every device connection's slots are shared memory (peer GPU or host-mapped).
  __device__ bool llRecv(int, int) const { return true; }
  __device__ bool llSend(int, int) const { return true; }
  // LL staging: two regions of a->llStageBytes per channel.
  __device__ void* llStage(int which, size_t) const {
    return static_cast<char*>(a->llStaging) + (size_t(blockIdx.x) * 2 + which) * a->llStageBytes;
  }
  __device__ DevFifo* recvFifo(int peer, int conn) { return find(peer, conn, 0); }
  __device__ DevFifo* sendFifo(int peer, int conn) { return find(peer, conn, 1); }
  __device__ const char* ptr(BufRef r, size_t off) const {
    return bufAt(r, off, a->sendbuf, a->recvbuf, a->scratch);
  }
};

// The step primitive's Ops for a block of threads, each taking every blockDim.x-th element.
template <DataType D>
struct DeviceOps {
  using S = typename Traits<D>::Storage;
  static constexpr size_t kBlockBytes = size_t(1) << 30;  // one pass: no cache to reuse

  RedKind kind;
  uint64_t scalarBits;
  uint32_t* status;
  const uint32_t* abortWord;

  __device__ size_t eltSize() const { return sizeof(S); }
  __device__ unsigned lane() const { return threadIdx.x; }
  __device__ unsigned lanes() const { return blockDim.x; }
  // Whether any thread of the block says so (a barrier: every thread must call it).
  __device__ bool anyLane(bool v) const { return __syncthreads_or(v) != 0; }
  // The host asked the kernel to stop, or another block failed.
  __device__ bool stopRequested() const {
    return *reinterpret_cast<const volatile uint32_t*>(abortWord) ||
           *reinterpret_cast<const volatile uint32_t*>(status);
  }
  __device__ bool hasPre() const { return kind == RedKind::kPreMulSum; }

  template <typename F>
  __device__ void binary(void* d, const void* a, const void* b, size_t n, F f) const {
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
      static_cast<S*>(d)[i] = f(static_cast<const S*>(a)[i], static_cast<const S*>(b)[i]);
  }
  template <typename F>
  __device__ void unary(void* d, const void* s, size_t n, F f) const {
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
      static_cast<S*>(d)[i] = f(static_cast<const S*>(s)[i]);
  }
  __device__ void reduce2(void* d, const void* a, const void* b, size_t n) const {
    switch (kind) {
      case RedKind::kProd: return binary(d, a, b, n, ReduceElt<D, OpProd>{});
      case RedKind::kMax: return binary(d, a, b, n, ReduceElt<D, OpMax>{});
      case RedKind::kMin: return binary(d, a, b, n, ReduceElt<D, OpMin>{});
      default: return binary(d, a, b, n, ReduceElt<D, OpSum>{});
    }
  }
  __device__ void reduce(void* d, const void* in, const void* local, size_t n) const {
    if (kind == RedKind::kPreMulSum)
      return binary(d, in, local, n, PreSumElt<D>{scalarFromBits<D>(scalarBits)});
    reduce2(d, in, local, n);
  }
  __device__ void pre(void* d, const void* s, size_t n) const {
    if (kind == RedKind::kPreMulSum) unary(d, s, n, ScaleElt<D>{scalarFromBits<D>(scalarBits)});
    else copy(d, s, n * sizeof(S));
  }
  __device__ void post(void* d, const void* s, size_t n) const {
    if (kind != RedKind::kSumPostDiv) return copy(d, s, n * sizeof(S));
    if constexpr (Traits<D>::kIsFloat) {
      unary(d, s, n, ScaleElt<D>{scalarFromBits<D>(scalarBits)});
    } else {
      using Wide = typename DivElt<D>::Wide;
      unary(d, s, n, DivElt<D>{Wide(scalarBits)});
    }
  }
  __device__ void copy(void* d, const void* s, size_t bytes) const {
    if (d == s) return;
    const bool vec = ((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s)) & 15u) == 0;
    const size_t packs = vec ? bytes / 16 : 0;
    for (size_t i = threadIdx.x; i < packs; i += blockDim.x)
      static_cast<uint4*>(d)[i] = static_cast<const uint4*>(s)[i];
    for (size_t i = packs * 16 + threadIdx.x; i < bytes; i += blockDim.x)
      static_cast<char*>(d)[i] = static_cast<const char*>(s)[i];
  }
  __device__ void copyOut(void* d, const void* s, size_t bytes) const { copy(d, s, bytes); }
  // Between a piece's passes: each pass spreads the bytes over the threads its own way
  // (an element each, or 16 bytes each), so a pass that reads what the previous one wrote
  // waits for every thread of the block.
  __device__ void sync() const { __syncthreads(); }
  // Every thread's writes are done (the barrier) and visible to every observer (the
  // system fence) before the counters move.
  __device__ void fence() const {
    __syncthreads();
    __threadfence_system();
  }
  __device__ const void* received(DevFifo& f, StepPiece& p) const {
    const FifoSlotInfo& info = f.recvInfo();
    if (info.bytes != p.bytes && threadIdx.x == 0)
      atomicCAS(status, LOOM_CUDA_INTERP_OK, LOOM_CUDA_INTERP_SIZE_MISMATCH);
    if (info.remote && threadIdx.x == 0)
      atomicCAS(status, LOOM_CUDA_INTERP_OK, LOOM_CUDA_INTERP_REMOTE_PAYLOAD);
    return f.recvSlot();
  }
};

template <DataType D>
__global__ void __launch_bounds__(kInterpThreads) interpKernel(loomCudaInterpArgs args) {
  __shared__ int go;  // 1: the piece is ready; 0: stop (aborted or failed)
  const FlatPlan& plan = *static_cast<const FlatPlan*>(args.plan);
  DeviceEnv env(&args);
  DeviceOps<D> ops{static_cast<RedKind>(args.kind), args.scalarBits, args.status, args.abortWord};
  const bool hasPost = args.kind == int(RedKind::kSumPostDiv);
  ChannelInterp<DeviceAtomics, DeviceEnv> in(plan, blockIdx.x, args.count, args.elt,
                                             args.proto == LOOM_CUDA_INTERP_PROTO_LL);
  volatile const uint32_t* abortWord = args.abortWord;
  volatile const uint32_t* status = args.status;
  while (!in.done()) {
    if (threadIdx.x == 0) {
      int g = *status ? 0 : 1;  // a piece failed (here or in another block): stop
      // The abort word lives in host memory: look at it now and then, not on every poll.
      for (uint32_t polls = 0; g && !in.ready(env); ++polls)
        if ((polls & 1023u) == 1023u && (*abortWord || *status)) g = 0;
      go = g;
    }
    __syncthreads();
    if (!go) break;  // the same shared value on every thread: the block leaves together
    // A piece of another size than the peer posted (every thread decides alike: anyLane), or
    // an LL read that gave up because the kernel is told to stop. Either way the status
    // stops the block at its next turn: an LL piece whose header came in is ready() again
    // at once, so the poll loop's look at the abort word would never come.
    if (!in.run(env, ops, hasPost) && threadIdx.x == 0)
      atomicCAS(args.status, LOOM_CUDA_INTERP_OK,
                *abortWord ? LOOM_CUDA_INTERP_ABORTED : LOOM_CUDA_INTERP_SIZE_MISMATCH);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    env.drain(abortWord, status);
    env.writeBack();
  }
}

// The launch's own result (cudaGetLastError would also return an earlier, unrelated error
// of the calling thread, failing this rank's launch while its peers wait).
template <DataType D>
cudaError_t interpLaunch(const loomCudaInterpArgs* args, int channels, cudaStream_t stream) {
  loomCudaInterpArgs copy = *args;
  void* params[] = {&copy};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&interpKernel<D>), dim3(channels), dim3(kInterpThreads),
                          params, 0, stream);
}

}  // namespace cuda
}  // namespace loom

#define LOOM_CUDA_INTERP_TYPE(T)                                    \
  template cudaError_t loom::cuda::interpLaunch<loom::DataType::T>( \
      const loomCudaInterpArgs*, int, cudaStream_t);
#define LOOM_CUDA_EXTERN_INTERP_TYPE(T) extern LOOM_CUDA_INTERP_TYPE(T)
LOOM_CUDA_EXTERN_INTERP_TYPE(kInt8)
LOOM_CUDA_EXTERN_INTERP_TYPE(kUint8)
LOOM_CUDA_EXTERN_INTERP_TYPE(kInt32)
LOOM_CUDA_EXTERN_INTERP_TYPE(kUint32)
LOOM_CUDA_EXTERN_INTERP_TYPE(kInt64)
LOOM_CUDA_EXTERN_INTERP_TYPE(kUint64)
LOOM_CUDA_EXTERN_INTERP_TYPE(kFloat16)
LOOM_CUDA_EXTERN_INTERP_TYPE(kFloat32)
LOOM_CUDA_EXTERN_INTERP_TYPE(kFloat64)
LOOM_CUDA_EXTERN_INTERP_TYPE(kBfloat16)
LOOM_CUDA_EXTERN_INTERP_TYPE(kFloat8e4m3)
LOOM_CUDA_EXTERN_INTERP_TYPE(kFloat8e5m2)
