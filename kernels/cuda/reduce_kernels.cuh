// The CUDA reductions: grid-stride kernels applying kernels/arith.h's element functors, in
// 16-byte packs where all pointers allow it. Each .cu file instantiates launchType<D> for
// some data types; reduce_entry.cu dispatches on the runtime (fn, dtype, kind).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/arith.h"
#include "kernels/cuda/cuda_kernels_abi.h"

namespace loom {
namespace cuda {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;

template <typename S>
struct Pack {
  static constexpr int kCount = 16 / sizeof(S);
  S v[kCount];
};

template <typename S>
__device__ __forceinline__ Pack<S> loadPack(const S* p, size_t i) {
  uint4 raw = reinterpret_cast<const uint4*>(p)[i];
  Pack<S> out;
  memcpy(&out, &raw, 16);
  return out;
}
template <typename S>
__device__ __forceinline__ void storePack(S* p, size_t i, const Pack<S>& v) {
  uint4 raw;
  memcpy(&raw, &v, 16);
  reinterpret_cast<uint4*>(p)[i] = raw;
}

// Each thread reads its elements of a and b before writing the same elements of dst, and
// threads own disjoint elements, so dst may be a or b.
template <typename S, typename F>
__global__ void binaryKernel(S* dst, const S* a, const S* b, size_t n, size_t nPacks, F f) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t p = tid; p < nPacks; p += stride) {
    Pack<S> x = loadPack(a, p), y = loadPack(b, p);
#pragma unroll
    for (int k = 0; k < Pack<S>::kCount; ++k) x.v[k] = f(x.v[k], y.v[k]);
    storePack(dst, p, x);
  }
  for (size_t i = nPacks * Pack<S>::kCount + tid; i < n; i += stride) dst[i] = f(a[i], b[i]);
}

template <typename S, typename F>
__global__ void unaryKernel(S* dst, const S* src, size_t n, size_t nPacks, F f) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t p = tid; p < nPacks; p += stride) {
    Pack<S> x = loadPack(src, p);
#pragma unroll
    for (int k = 0; k < Pack<S>::kCount; ++k) x.v[k] = f(x.v[k]);
    storePack(dst, p, x);
  }
  for (size_t i = nPacks * Pack<S>::kCount + tid; i < n; i += stride) dst[i] = f(src[i]);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline unsigned blocksFor(size_t work) {
  size_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  return unsigned(blocks < size_t(kMaxBlocks) ? blocks : size_t(kMaxBlocks));
}

template <typename S, typename F>
cudaError_t launchBinary(void* dst, const void* a, const void* b, size_t n, F f,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  size_t nPacks = aligned16(dst) && aligned16(a) && aligned16(b) ? n / Pack<S>::kCount : 0;
  size_t work = nPacks + (n - nPacks * Pack<S>::kCount);
  binaryKernel<S, F><<<blocksFor(work), kThreads, 0, stream>>>(
      static_cast<S*>(dst), static_cast<const S*>(a), static_cast<const S*>(b), n, nPacks, f);
  return cudaGetLastError();
}

template <typename S, typename F>
cudaError_t launchUnary(void* dst, const void* src, size_t n, F f, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  size_t nPacks = aligned16(dst) && aligned16(src) ? n / Pack<S>::kCount : 0;
  size_t work = nPacks + (n - nPacks * Pack<S>::kCount);
  unaryKernel<S, F><<<blocksFor(work), kThreads, 0, stream>>>(
      static_cast<S*>(dst), static_cast<const S*>(src), n, nPacks, f);
  return cudaGetLastError();
}

inline cudaError_t copyAsync(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (dst == src || bytes == 0) return cudaSuccess;
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
}

template <DataType D>
cudaError_t launchOp(RedKind op, void* dst, const void* a, const void* b, size_t n,
                     cudaStream_t stream) {
  using S = typename Traits<D>::Storage;
  switch (op) {
    case RedKind::kSum:
      return launchBinary<S>(dst, a, b, n, ReduceElt<D, OpSum>{}, stream);
    case RedKind::kProd:
      return launchBinary<S>(dst, a, b, n, ReduceElt<D, OpProd>{}, stream);
    case RedKind::kMax:
      return launchBinary<S>(dst, a, b, n, ReduceElt<D, OpMax>{}, stream);
    case RedKind::kMin:
      return launchBinary<S>(dst, a, b, n, ReduceElt<D, OpMin>{}, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// All four functions of one data type (see cuda_kernels_abi.h).
template <DataType D>
cudaError_t launchType(int fn, RedKind kind, uint64_t scalarBits, void* dst, const void* a,
                       const void* b, size_t n, cudaStream_t stream) {
  using S = typename Traits<D>::Storage;
  bool premul = kind == RedKind::kPreMulSum;
  bool postdiv = kind == RedKind::kSumPostDiv;
  RedKind op = premul || postdiv ? RedKind::kSum : kind;
  switch (fn) {
    case LOOM_CUDA_FN_REDUCE:
      if (premul) {
        return launchBinary<S>(dst, a, b, n, PreSumElt<D>{scalarFromBits<D>(scalarBits)}, stream);
      }
      return launchOp<D>(op, dst, a, b, n, stream);
    case LOOM_CUDA_FN_REDUCE2:
      return launchOp<D>(op, dst, a, b, n, stream);
    case LOOM_CUDA_FN_PRE:
      if (!premul) return copyAsync(dst, a, n * sizeof(S), stream);
      return launchUnary<S>(dst, a, n, ScaleElt<D>{scalarFromBits<D>(scalarBits)}, stream);
    case LOOM_CUDA_FN_POST:
      if (!postdiv) return copyAsync(dst, a, n * sizeof(S), stream);
      if constexpr (Traits<D>::kIsFloat) {
        return launchUnary<S>(dst, a, n, ScaleElt<D>{scalarFromBits<D>(scalarBits)}, stream);
      } else {
        using Wide = typename DivElt<D>::Wide;
        return launchUnary<S>(dst, a, n, DivElt<D>{Wide(scalarBits)}, stream);
      }
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace loom

// Each data type's kernels are compiled in exactly one .cu file (see the explicit
// instantiations there), so the files build in parallel.
#define LOOM_CUDA_LAUNCH_TYPE(T)                                  \
  template cudaError_t loom::cuda::launchType<loom::DataType::T>( \
      int, loom::RedKind, uint64_t, void*, const void*, const void*, size_t, cudaStream_t);
#define LOOM_CUDA_EXTERN_LAUNCH_TYPE(T) extern LOOM_CUDA_LAUNCH_TYPE(T)
LOOM_CUDA_EXTERN_LAUNCH_TYPE(kInt8)
LOOM_CUDA_EXTERN_LAUNCH_TYPE(kUint8)
LOOM_CUDA_EXTERN_LAUNCH_TYPE(kInt32)
LOOM_CUDA_EXTERN_LAUNCH_TYPE(kUint32)
LOOM_CUDA_EXTERN_LAUNCH_TYPE(kInt64)
LOOM_CUDA_EXTERN_LAUNCH_TYPE(kUint64)
LOOM_CUDA_EXTERN_LAUNCH_TYPE(kFloat16)
LOOM_CUDA_EXTERN_LAUNCH_TYPE(kFloat32)
LOOM_CUDA_EXTERN_LAUNCH_TYPE(kFloat64)
LOOM_CUDA_EXTERN_LAUNCH_TYPE(kBfloat16)
LOOM_CUDA_EXTERN_LAUNCH_TYPE(kFloat8e4m3)
LOOM_CUDA_EXTERN_LAUNCH_TYPE(kFloat8e5m2)
