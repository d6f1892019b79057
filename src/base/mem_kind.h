// Where a buffer lives. Every collective call classifies its buffers, so that host memory
// runs on the CPU executor and CUDA memory never reaches a host memcpy.
#pragma once

#include <cstdint>

#include "base/cuda_driver.h"

namespace loom {

enum class MemKind : uint8_t { kHost, kDevice };

const char* memKindName(MemKind kind);  // "host" or "device"

struct MemInfo {
  MemKind kind = MemKind::kHost;
  int device = -1;  // CUDA ordinal of device (or managed) memory; -1 for host memory
};

// The slow path of classifyPointer, for when a driver is loaded.
MemInfo classifyWithDriver(const cuda::Driver& drv, const void* p);

// Device and managed memory are kDevice; pageable, pinned and registered host memory (and
// anything the driver does not know) are kHost. Without a driver everything is host and
// this is a single branch. Throws kUnhandledCudaError if the driver fails the query.
inline MemInfo classifyPointer(const void* p) {
  const cuda::Driver* drv = cuda::driver();
  if (__builtin_expect(drv == nullptr, 1)) return MemInfo{};
  return classifyWithDriver(*drv, p);
}

}  // namespace loom
