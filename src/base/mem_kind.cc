#include "base/mem_kind.h"

#include <cstdint>

#include "base/error.h"

namespace loom {

const char* memKindName(MemKind kind) { return kind == MemKind::kDevice ? "device" : "host"; }

MemInfo classifyWithDriver(const cuda::Driver& drv, const void* p) {
  // Zero-initialized: for memory the driver does not know it leaves the defaults (type 0),
  // and IS_MANAGED may be written as a one-byte bool.
  unsigned memType = 0;
  int ordinal = -1;
  unsigned managed = 0;
  cuda::CuPointerAttribute attrs[] = {cuda::kPointerAttrMemoryType, cuda::kPointerAttrDeviceOrdinal,
                                      cuda::kPointerAttrIsManaged};
  void* data[] = {&memType, &ordinal, &managed};
  // Unlike cuPointerGetAttribute, this succeeds for pointers the driver does not know, so an
  // error means the driver itself is unusable; guessing "host" could send a device pointer
  // into memcpy.
  cuda::CuResult r = drv.api.pointerGetAttributes(3, attrs, data,
                                                  reinterpret_cast<uintptr_t>(p));
  if (r != cuda::kCudaSuccess)
    LOOM_THROW(kUnhandledCudaError,
               "cuPointerGetAttributes(%p) failed: %s; cannot tell host from device memory (a "
               "process forked after CUDA was initialized cannot use CUDA)",
               p, drv.errorText(r).c_str());
  // Managed memory counts as device memory: its pages may be resident on a GPU, and a CPU
  // touch would migrate them under a running kernel.
  if (managed != 0 || memType == cuda::kMemoryTypeDevice || memType == cuda::kMemoryTypeUnified)
    return MemInfo{MemKind::kDevice, ordinal};
  return MemInfo{};
}

}  // namespace loom
