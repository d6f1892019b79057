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

}  // namespace

LOOM_CUDA_EXPORT int loomCudaReduce(int fn, int dtype, int kind, uint64_t scalarBits, void* dst,
                                    const void* a, const void* b, size_t n,
                                    loomCudaStream_t stream) {
  return int(dispatch(fn, dtype, kind, scalarBits, dst, a, b, n, stream));
}

LOOM_CUDA_EXPORT int loomCudaKernelsAbiVersion(void) { return LOOM_CUDA_KERNELS_ABI_VERSION; }
