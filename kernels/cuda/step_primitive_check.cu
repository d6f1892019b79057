// The step primitive and the FIFO wait/post compiled for the device: one float-sum Ops for
// a block of CUDA threads and a kernel that runs plan pieces through runStepPiece with
// DeviceAtomics. Built as an object library so CI's nvcc proves the shared headers stay
// device code; the CUDA executor's interpreter kernel will instantiate the same templates.
#include <stddef.h>
#include <stdint.h>

#include "kernels/fifo_sync.h"
#include "kernels/step_primitive.h"

namespace loom {
namespace {

// Float sum by the threads of one block, each taking every blockDim.x-th element.
struct DeviceSumOps {
  static constexpr size_t kBlockBytes = size_t(1) << 30;  // one pass: no cache to reuse

  __device__ size_t eltSize() const { return sizeof(float); }
  __device__ bool hasPre() const { return false; }
  __device__ void reduce(void* d, const void* a, const void* b, size_t n) const {
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
      static_cast<float*>(d)[i] = static_cast<const float*>(a)[i] + static_cast<const float*>(b)[i];
  }
  __device__ void reduce2(void* d, const void* a, const void* b, size_t n) const {
    reduce(d, a, b, n);
  }
  __device__ void pre(void* d, const void* s, size_t n) const { copy(d, s, n * sizeof(float)); }
  __device__ void post(void* d, const void* s, size_t n) const { pre(d, s, n); }
  __device__ void copy(void* d, const void* s, size_t bytes) const {
    for (size_t i = threadIdx.x; i < bytes / 4; i += blockDim.x)
      static_cast<uint32_t*>(d)[i] = static_cast<const uint32_t*>(s)[i];
  }
  __device__ void copyOut(void* d, const void* s, size_t bytes) const { copy(d, s, bytes); }
  __device__ void fence() const { __syncthreads(); }
  __device__ const void* received(FifoEndT<DeviceAtomics>& f, StepPiece&) const {
    return f.recvSlot();
  }
};

}  // namespace

// One channel's pieces of a recv-reduce-send chain: src and dst advance by `bytes` a piece.
// Thread 0 polls the FIFOs; the block then runs the piece together (the counters only
// grow, so every thread's own check inside runStepPiece agrees).
__global__ void loomStepPrimitiveCheck(FifoEndT<DeviceAtomics> recv, FifoEndT<DeviceAtomics> send,
                                       const float* src, float* dst, size_t bytes, int pieces) {
  __shared__ int ready;
  DeviceSumOps ops;
  FifoEndT<DeviceAtomics>* r = recv.ctrl ? &recv : nullptr;
  FifoEndT<DeviceAtomics>* s = send.ctrl ? &send : nullptr;
  for (int k = 0; k < pieces;) {
    if (threadIdx.x == 0) ready = stepReady(r, s);
    __syncthreads();
    if (ready) {
      StepPiece p;
      p.bytes = bytes;
      p.b = reinterpret_cast<const char*>(src) + k * bytes;
      p.dst = reinterpret_cast<char*>(dst) + k * bytes;
      runStepPiece(r, s, p, ops);
      ++k;
    }
    __syncthreads();
  }
}

}  // namespace loom
