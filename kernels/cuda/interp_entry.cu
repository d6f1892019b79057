// The interpreter's C entry point (cuda_kernels_abi.h): runtime dtype to the compiled kernel.
#include "kernels/cuda/interp_kernel.cuh"

#define LOOM_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using loom::DataType;
using loom::cuda::interpLaunch;

cudaError_t dispatch(const loomCudaInterpArgs* a, int channels, cudaStream_t stream) {
  if (!a || channels <= 0 || a->nFifos < 0 || a->nFifos > LOOM_CUDA_INTERP_MAX_TABLE)
    return cudaErrorInvalidValue;
  if (a->kind < 0 || a->kind >= loom::kNumRedKinds) return cudaErrorInvalidValue;
  if (a->proto != LOOM_CUDA_INTERP_PROTO_SIMPLE &&
      (a->proto != LOOM_CUDA_INTERP_PROTO_LL || !a->llStaging || a->llStageBytes % 16 != 0))
    return cudaErrorInvalidValue;
  switch (DataType(a->dtype)) {
    case DataType::kInt8: return interpLaunch<DataType::kInt8>(a, channels, stream);
    case DataType::kUint8: return interpLaunch<DataType::kUint8>(a, channels, stream);
    case DataType::kInt32: return interpLaunch<DataType::kInt32>(a, channels, stream);
    case DataType::kUint32: return interpLaunch<DataType::kUint32>(a, channels, stream);
    case DataType::kInt64: return interpLaunch<DataType::kInt64>(a, channels, stream);
    case DataType::kUint64: return interpLaunch<DataType::kUint64>(a, channels, stream);
    case DataType::kFloat16: return interpLaunch<DataType::kFloat16>(a, channels, stream);
    case DataType::kFloat32: return interpLaunch<DataType::kFloat32>(a, channels, stream);
    case DataType::kFloat64: return interpLaunch<DataType::kFloat64>(a, channels, stream);
    case DataType::kBfloat16: return interpLaunch<DataType::kBfloat16>(a, channels, stream);
    case DataType::kFloat8e4m3: return interpLaunch<DataType::kFloat8e4m3>(a, channels, stream);
    case DataType::kFloat8e5m2: return interpLaunch<DataType::kFloat8e5m2>(a, channels, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

LOOM_CUDA_EXPORT int loomCudaInterpLaunch(const loomCudaInterpArgs* args, int channels,
                                          loomCudaStream_t stream) {
  return int(dispatch(args, channels, stream));
}
