#include "base/mem_kind.h"

#include <atomic>
#include <cstdint>

#include "base/error.h"
#include "base/log.h"

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
  if (r != cuda::kCudaSuccess) {
    // A child forked after the driver was loaded cannot use CUDA at all, so it can hold no
    // device buffer it may use; its host collectives must keep working.
    if (cuda::forkedSinceLoad()) {
      static std::atomic<bool> told{false};
      if (!told.exchange(true))
        LOOM_WARN("cuPointerGetAttributes fails in this process, forked after the CUDA "
                  "driver was loaded (%s): CUDA is unusable here, every buffer is host memory",
                  drv.errorText(r).c_str());
      return MemInfo{};
    }
    LOOM_THROW(kUnhandledCudaError,
               "cuPointerGetAttributes(%p) failed: %s; cannot tell host from device memory",
               p, drv.errorText(r).c_str());
  }
  // Managed memory counts as device memory: its pages may be resident on a GPU, and a CPU
  // touch would migrate them under a running kernel.
  if (managed != 0 || memType == cuda::kMemoryTypeDevice || memType == cuda::kMemoryTypeUnified)
    return MemInfo{MemKind::kDevice, ordinal};
  return MemInfo{};
}

}  // namespace loom
