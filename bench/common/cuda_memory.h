// Device buffers for the tools (-M device, or -M auto where a GPU is), as nccl-tests runs
// them: CUDA memory, a stream per rank, and the stream synchronized before a time is taken.
// The CUDA driver is reached through dlopen (LOOM_CUDA_DRIVER_LIBRARY, else libcuda.so.1),
// so the tools still start where there is none.
#pragma once

#include <cstddef>
#include <string>

namespace loom::bench {

class CudaDriver {
 public:
  // The process's driver, loaded once; nullptr with *why set when there is none (no
  // library, a missing function, cuInit failing, or no device).
  static const CudaDriver* get(std::string* why);

  int deviceCount() const { return count_; }
  // Makes `device` current on the calling thread (its primary context).
  void makeCurrent(int device) const;
  void* alloc(size_t bytes) const;  // device memory of the current device
  void free(void* p) const;
  void* createStream() const;       // non-blocking
  void destroyStream(void* s) const;
  void sync(void* stream) const;    // cuStreamSynchronize
  void toDevice(void* dst, const void* src, size_t bytes) const;    // synchronous
  void toHost(void* dst, const void* src, size_t bytes) const;      // synchronous
  std::string name(int device) const;

  // CUDA graphs (-G): capture a stream's work, then replay it. hasGraphs() is false where
  // the driver lacks them.
  bool hasGraphs() const;
  void beginCapture(void* stream) const;   // thread-local mode: other threads go on
  void* endCapture(void* stream) const;    // the graph, instantiated; free with destroyGraph
  void discardCapture(void* stream) const;  // ends a capture that failed, keeping nothing
  void launchGraph(void* exec, void* stream) const;
  void destroyGraph(void* exec) const;

  struct Api;  // the driver functions (cuda_memory.cc)

 private:
  CudaDriver() = default;
  Api* api_ = nullptr;
  int count_ = 0;
};

// One rank's device buffer with a host mirror: fill() and check() work on the mirror,
// which is copied to or from the device around the checked calls.
class DeviceBuffer {
 public:
  // From the driver (cuMemAlloc), or with `viaNccl` from ncclMemAlloc (as nccl-tests
  // allocates; what -R 2's windows need).
  DeviceBuffer(const CudaDriver& drv, size_t bytes, bool viaNccl = false);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* device() const { return dev_; }
  char* mirror() const { return host_; }
  size_t size() const { return size_; }
  // The device address of a pointer into the mirror.
  char* onDevice(const void* mirrorPtr) const {
    return dev_ + (static_cast<const char*>(mirrorPtr) - host_);
  }
  void upload(const void* mirrorPtr, size_t bytes) const;    // mirror -> device
  void download(const void* mirrorPtr, size_t bytes) const;  // device -> mirror

 private:
  void release();
  const CudaDriver& drv_;
  char* dev_ = nullptr;
  char* host_ = nullptr;
  size_t size_ = 0;
  bool viaNccl_ = false;
};

}  // namespace loom::bench
