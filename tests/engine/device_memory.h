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
  // Makes `device` current for the calling thread alone: on the real driver makeCurrent
  // does so; the stand-in's makeCurrent sets what every thread without one of its own sees.
  virtual void makeThreadCurrent(int device) { makeCurrent(device); }
  // `bytes` of memory on `device` whose every byte is `fill`. A host access to it must
  // fail loudly (SIGSEGV), so that a test that survives proves nothing touched it.
  virtual void* allocDevice(size_t bytes, int device, uint8_t fill) = 0;
  virtual void* allocManaged(size_t bytes, int device) = 0;
  // Page-locked host memory the driver knows about (cuMemAllocHost / cudaHostAlloc).
  virtual void* allocPinned(size_t bytes) = 0;
  // Whether device memory from allocDevice still holds `fill` in every byte.
  virtual bool holds(const void* p, size_t bytes, uint8_t fill) = 0;

  // Streams and copies, for the tests of device-buffer collectives (staged_test.cc).
  // A new stream of the calling thread's current device, destroyed with the DeviceMemory;
  // returned as the cudaStream_t NCCL calls take. Non-blocking (CU_STREAM_NON_BLOCKING)
  // unless asked: a blocking stream and the legacy default stream, on which toDevice and
  // fromDevice copy, wait for each other, so a rank thread's copy would wait for another
  // rank's stream that waits for the copying rank's collective.
  virtual void* createStream(bool blocking = false) = 0;
  // Blocks until every operation queued on `stream` has completed (cuStreamSynchronize).
  virtual void syncStream(void* stream) = 0;
  // Synchronous copies between host memory and device memory from allocDevice (cuMemcpy).
  virtual void toDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void fromDevice(void* dst, const void* src, size_t bytes) = 0;
  // Only the stand-in can hold a stream still: a paused stream starts no further operation
  // until resumed, so a test can see that a call returned before its work ran. The real
  // driver returns false from canPause and the tests that need it skip.
  virtual bool canPause() const { return false; }
  virtual void pauseStream(void* /*stream*/) {}
  virtual void resumeStream(void* /*stream*/) {}
};

// Defined by stand_in_memory.cc or cuda_memory.cc; frees everything on destruction.
std::unique_ptr<DeviceMemory> makeDeviceMemory();

}  // namespace loomtest
