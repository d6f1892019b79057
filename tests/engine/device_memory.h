// Where the memory-kind tests get their CUDA memory: from the stand-in driver (protected
// host pages that it reports as device memory) or from the real driver on a GPU. The test
// bodies (mem_kind_test.cc) are the same for both; each executable links one source.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace loomtest {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Why device memory cannot be had here ("" when it can): tests GTEST_SKIP with it.
  virtual std::string unavailable() const = 0;
  virtual int deviceCount() const = 0;
  // Makes `device` the calling thread's current CUDA device; -1: no current context.
  virtual void makeCurrent(int device) = 0;
  // `bytes` of memory on `device` whose every byte is `fill`. A host access to it must
  // fail loudly (SIGSEGV), so that a test that survives proves nothing touched it.
  virtual void* allocDevice(size_t bytes, int device, uint8_t fill) = 0;
  virtual void* allocManaged(size_t bytes, int device) = 0;
  // Page-locked host memory the driver knows about (cuMemAllocHost / cudaHostAlloc).
  virtual void* allocPinned(size_t bytes) = 0;
  // Whether device memory from allocDevice still holds `fill` in every byte.
  virtual bool holds(const void* p, size_t bytes, uint8_t fill) = 0;
};

// Defined by stand_in_memory.cc or cuda_memory.cc; frees everything on destruction.
std::unique_ptr<DeviceMemory> makeDeviceMemory();

}  // namespace loomtest
