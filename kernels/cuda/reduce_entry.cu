// The module's C entry points (cuda_kernels_abi.h): runtime (fn, dtype, kind) to the
// compiled kernels.
#include "kernels/cuda/reduce_kernels.cuh"

#define LOOM_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using loom::DataType;
using loom::RedKind;
using loom::cuda::launchType;

cudaError_t dispatch(int fn, int dtype, int kind, uint64_t scalarBits, void* dst, const void* a,
                     const void* b, size_t n, cudaStream_t stream) {
  if (fn < LOOM_CUDA_FN_REDUCE || fn > LOOM_CUDA_FN_POST) return cudaErrorInvalidValue;
  if (kind < 0 || kind >= loom::kNumRedKinds) return cudaErrorInvalidValue;
  RedKind k = RedKind(kind);
  bool isInt = dtype >= 0 && dtype < int(DataType::kFloat16);
  if (k == RedKind::kSumPostDiv && isInt && scalarBits == 0) return cudaErrorInvalidValue;
  switch (DataType(dtype)) {
    case DataType::kInt8:
      return launchType<DataType::kInt8>(fn, k, scalarBits, dst, a, b, n, stream);
    case DataType::kUint8:
      return launchType<DataType::kUint8>(fn, k, scalarBits, dst, a, b, n, stream);
    case DataType::kInt32:
      return launchType<DataType::kInt32>(fn, k, scalarBits, dst, a, b, n, stream);
    case DataType::kUint32:
      return launchType<DataType::kUint32>(fn, k, scalarBits, dst, a, b, n, stream);
    case DataType::kInt64:
      return launchType<DataType::kInt64>(fn, k, scalarBits, dst, a, b, n, stream);
    case DataType::kUint64:
      return launchType<DataType::kUint64>(fn, k, scalarBits, dst, a, b, n, stream);
    case DataType::kFloat16:
      return launchType<DataType::kFloat16>(fn, k, scalarBits, dst, a, b, n, stream);
    case DataType::kFloat32:
      return launchType<DataType::kFloat32>(fn, k, scalarBits, dst, a, b, n, stream);
    case DataType::kFloat64:
      return launchType<DataType::kFloat64>(fn, k, scalarBits, dst, a, b, n, stream);
    case DataType::kBfloat16:
      return launchType<DataType::kBfloat16>(fn, k, scalarBits, dst, a, b, n, stream);
    case DataType::kFloat8e4m3:
      return launchType<DataType::kFloat8e4m3>(fn, k, scalarBits, dst, a, b, n, stream);
    case DataType::kFloat8e5m2:
      return launchType<DataType::kFloat8e5m2>(fn, k, scalarBits, dst, a, b, n, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t dispatchMulti(int dtype, int kind, uint64_t postBits, const loomCudaMulti* m,
                          size_t n, cudaStream_t stream) {
  if (!m || m->nin < 1 || m->nin > LOOM_CUDA_MULTI_MAX || m->nout < 0 ||
      m->nout > LOOM_CUDA_MULTI_MAX)
    return cudaErrorInvalidValue;
  for (int i = 0; i < m->nin; ++i)
    if (!m->in[i]) return cudaErrorInvalidValue;
  for (int j = 0; j < m->nout; ++j)
    if (!m->out[j]) return cudaErrorInvalidValue;
  if (kind < 0 || kind >= loom::kNumRedKinds) return cudaErrorInvalidValue;
  RedKind k = RedKind(kind);
  bool isInt = dtype >= 0 && dtype < int(DataType::kFloat16);
  if (k == RedKind::kSumPostDiv && isInt && postBits == 0) return cudaErrorInvalidValue;
  switch (DataType(dtype)) {
#define LOOM_MULTI_CASE(T) \
  case DataType::T:        \
    return loom::cuda::launchMulti<DataType::T>(k, postBits, *m, n, stream);
    LOOM_MULTI_CASE(kInt8)
    LOOM_MULTI_CASE(kUint8)
    LOOM_MULTI_CASE(kInt32)
    LOOM_MULTI_CASE(kUint32)
    LOOM_MULTI_CASE(kInt64)
    LOOM_MULTI_CASE(kUint64)
    LOOM_MULTI_CASE(kFloat16)
    LOOM_MULTI_CASE(kFloat32)
    LOOM_MULTI_CASE(kFloat64)
    LOOM_MULTI_CASE(kBfloat16)
    LOOM_MULTI_CASE(kFloat8e4m3)
    LOOM_MULTI_CASE(kFloat8e5m2)
#undef LOOM_MULTI_CASE
  }
  return cudaErrorInvalidValue;
}

}  // namespace

LOOM_CUDA_EXPORT int loomCudaReduceMulti(int dtype, int kind, uint64_t postBits,
                                         const loomCudaMulti* m, size_t n,
                                         loomCudaStream_t stream) {
  return int(dispatchMulti(dtype, kind, postBits, m, n, stream));
}

LOOM_CUDA_EXPORT int loomCudaReduce(int fn, int dtype, int kind, uint64_t scalarBits, void* dst,
                                    const void* a, const void* b, size_t n,
                                    loomCudaStream_t stream) {
  return int(dispatch(fn, dtype, kind, scalarBits, dst, a, b, n, stream));
}

LOOM_CUDA_EXPORT int loomCudaKernelsAbiVersion(void) { return LOOM_CUDA_KERNELS_ABI_VERSION; }
