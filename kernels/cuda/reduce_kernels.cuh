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

// One pass over m.nin inputs into m.nout outputs (loomCudaReduceMulti). C combines: first(x,
// i) for input 0, next(acc, x, i) for the others, post(acc) at the end. Each thread reads
// all inputs of its elements before writing them, so an output may be an input.
template <typename S, typename C>
__global__ void multiKernel(loomCudaMulti m, size_t n, size_t nPacks, C c) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t p = tid; p < nPacks; p += stride) {
    Pack<S> acc = loadPack(static_cast<const S*>(m.in[0]), p);
#pragma unroll
    for (int k = 0; k < Pack<S>::kCount; ++k) acc.v[k] = c.first(acc.v[k], 0);
    for (int i = 1; i < m.nin; ++i) {
      Pack<S> x = loadPack(static_cast<const S*>(m.in[i]), p);
#pragma unroll
      for (int k = 0; k < Pack<S>::kCount; ++k) acc.v[k] = c.next(acc.v[k], x.v[k], i);
    }
#pragma unroll
    for (int k = 0; k < Pack<S>::kCount; ++k) acc.v[k] = c.post(acc.v[k]);
    for (int j = 0; j < m.nout; ++j) storePack(static_cast<S*>(m.out[j]), p, acc);
  }
  for (size_t e = nPacks * Pack<S>::kCount + tid; e < n; e += stride) {
    S acc = c.first(static_cast<const S*>(m.in[0])[e], 0);
    for (int i = 1; i < m.nin; ++i) acc = c.next(acc, static_cast<const S*>(m.in[i])[e], i);
    acc = c.post(acc);
    for (int j = 0; j < m.nout; ++j) static_cast<S*>(m.out[j])[e] = acc;
  }
}

// Combiners for multiKernel: a plain reduction (with an optional post-op), and PreMulSum
// with each input's own scalar.
template <DataType D>
struct NoPost {
  __device__ __forceinline__ typename Traits<D>::Storage operator()(typename Traits<D>::Storage x) const {
    return x;
  }
};
template <DataType D, typename Op, typename Post>
struct PlainMulti {
  using S = typename Traits<D>::Storage;
  Post postOp;
  __device__ __forceinline__ S first(S x, int) const { return x; }
  __device__ __forceinline__ S next(S a, S x, int) const { return ReduceElt<D, Op>{}(a, x); }
  __device__ __forceinline__ S post(S x) const { return postOp(x); }
};
template <DataType D>
struct PreMulMulti {
  using S = typename Traits<D>::Storage;
  typename Traits<D>::Acc scalar[LOOM_CUDA_MULTI_MAX];
  __device__ __forceinline__ S first(S x, int i) const { return ScaleElt<D>{scalar[i]}(x); }
  __device__ __forceinline__ S next(S a, S x, int i) const { return PreSumElt<D>{scalar[i]}(a, x); }
  __device__ __forceinline__ S post(S x) const { return x; }
};

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

template <typename S, typename C>
cudaError_t launchMultiWith(const loomCudaMulti& m, size_t n, C c, cudaStream_t stream) {
  bool al = true;
  for (int i = 0; i < m.nin; ++i) al = al && aligned16(m.in[i]);
  for (int j = 0; j < m.nout; ++j) al = al && aligned16(m.out[j]);
  size_t nPacks = al ? n / Pack<S>::kCount : 0;
  size_t work = nPacks + (n - nPacks * Pack<S>::kCount);
  multiKernel<S, C><<<blocksFor(work), kThreads, 0, stream>>>(m, n, nPacks, c);
  return cudaGetLastError();
}

// loomCudaReduceMulti for one data type (see cuda_kernels_abi.h).
template <DataType D>
cudaError_t launchMulti(RedKind kind, uint64_t postBits, const loomCudaMulti& m, size_t n,
                        cudaStream_t stream) {
  using S = typename Traits<D>::Storage;
  if (n == 0 || m.nout == 0) return cudaSuccess;
  switch (kind) {
    case RedKind::kSum:
      return launchMultiWith<S>(m, n, PlainMulti<D, OpSum, NoPost<D>>{}, stream);
    case RedKind::kProd:
      return launchMultiWith<S>(m, n, PlainMulti<D, OpProd, NoPost<D>>{}, stream);
    case RedKind::kMax:
      return launchMultiWith<S>(m, n, PlainMulti<D, OpMax, NoPost<D>>{}, stream);
    case RedKind::kMin:
      return launchMultiWith<S>(m, n, PlainMulti<D, OpMin, NoPost<D>>{}, stream);
    case RedKind::kPreMulSum: {
      PreMulMulti<D> c{};
      for (int i = 0; i < m.nin; ++i) c.scalar[i] = scalarFromBits<D>(m.inScalar[i]);
      return launchMultiWith<S>(m, n, c, stream);
    }
    case RedKind::kSumPostDiv:
      if constexpr (Traits<D>::kIsFloat) {
        return launchMultiWith<S>(
            m, n, PlainMulti<D, OpSum, ScaleElt<D>>{ScaleElt<D>{scalarFromBits<D>(postBits)}}, stream);
      } else {
        using Wide = typename DivElt<D>::Wide;
        return launchMultiWith<S>(m, n, PlainMulti<D, OpSum, DivElt<D>>{DivElt<D>{Wide(postBits)}},
                                  stream);
      }
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
#define LOOM_CUDA_LAUNCH_TYPE(T)                                                   \
  template cudaError_t loom::cuda::launchType<loom::DataType::T>(                  \
      int, loom::RedKind, uint64_t, void*, const void*, const void*, size_t, cudaStream_t); \
  template cudaError_t loom::cuda::launchMulti<loom::DataType::T>(                 \
      loom::RedKind, uint64_t, const loomCudaMulti&, size_t, cudaStream_t);
#define LOOM_CUDA_EXTERN_LAUNCH_TYPE(T)                                                   \
  extern template cudaError_t loom::cuda::launchType<loom::DataType::T>(                  \
      int, loom::RedKind, uint64_t, void*, const void*, const void*, size_t, cudaStream_t); \
  extern template cudaError_t loom::cuda::launchMulti<loom::DataType::T>(                 \
      loom::RedKind, uint64_t, const loomCudaMulti&, size_t, cudaStream_t);
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
