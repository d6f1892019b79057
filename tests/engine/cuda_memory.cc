// Device memory from the real CUDA driver, for the same tests on a machine with a GPU. The
// driver is dlopen'd here as Loom does, so the test binary needs no CUDA at build time.
#include <dlfcn.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_memory.h"

namespace loomtest {
namespace {

using CUresult = int;
using CUcontext = void*;
using CUdeviceptr = unsigned long long;
using CUstream = void*;
constexpr unsigned kAttachGlobal = 1;  // CU_MEM_ATTACH_GLOBAL

struct Api {
  CUresult (*init)(unsigned);
  CUresult (*deviceGetCount)(int*);
  CUresult (*primaryCtxRetain)(CUcontext*, int);
  CUresult (*ctxSetCurrent)(CUcontext);
  CUresult (*ctxPushCurrent)(CUcontext);
  CUresult (*ctxPopCurrent)(CUcontext*);
  CUresult (*memAlloc)(CUdeviceptr*, size_t);
  CUresult (*memFree)(CUdeviceptr);
  CUresult (*memAllocManaged)(CUdeviceptr*, size_t, unsigned);
  CUresult (*memAllocHost)(void**, size_t);
  CUresult (*memFreeHost)(void*);
  CUresult (*memsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*memcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*memcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*streamCreate)(CUstream*, unsigned);
  CUresult (*streamSynchronize)(CUstream);
  CUresult (*streamDestroy)(CUstream);
};

class CudaMemory : public DeviceMemory {
 public:
  CudaMemory() {
    lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
      why_ = "no CUDA driver here (libcuda.so.1 is not loadable), so no GPU to test on";
      return;
    }
    bool ok = bind(api_.init, "cuInit") && bind(api_.deviceGetCount, "cuDeviceGetCount") &&
              bind(api_.primaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
              bind(api_.ctxSetCurrent, "cuCtxSetCurrent") &&
              bind(api_.ctxPushCurrent, "cuCtxPushCurrent_v2") &&
              bind(api_.ctxPopCurrent, "cuCtxPopCurrent_v2") && bind(api_.memAlloc, "cuMemAlloc_v2") &&
              bind(api_.memFree, "cuMemFree_v2") &&
              bind(api_.memAllocManaged, "cuMemAllocManaged") &&
              bind(api_.memAllocHost, "cuMemAllocHost_v2") &&
              bind(api_.memFreeHost, "cuMemFreeHost") && bind(api_.memsetD8, "cuMemsetD8_v2") &&
              bind(api_.memcpyDtoH, "cuMemcpyDtoH_v2") &&
              bind(api_.memcpyHtoD, "cuMemcpyHtoD_v2") &&
              bind(api_.streamCreate, "cuStreamCreate") &&
              bind(api_.streamSynchronize, "cuStreamSynchronize") &&
              bind(api_.streamDestroy, "cuStreamDestroy_v2");
    if (!ok) {
      why_ = "libcuda.so.1 lacks a driver function the test needs";
      return;
    }
    CUresult r = api_.init(0);
    if (r != 0) {
      why_ = "cuInit failed (" + std::to_string(r) + "): no usable GPU here";
      return;
    }
    if (api_.deviceGetCount(&count_) != 0 || count_ < 1) {
      why_ = "the CUDA driver reports no GPU";
      return;
    }
    ctx_.resize(count_, nullptr);
    for (int d = 0; d < count_; ++d)
      if (api_.primaryCtxRetain(&ctx_[d], d) != 0) {
        why_ = "cuDevicePrimaryCtxRetain failed for device " + std::to_string(d);
        return;
      }
  }
  ~CudaMemory() override {
    if (!why_.empty()) return;
    // Streams first, their work done: it may use the memory freed next, and
    // cuStreamDestroy alone returns before that work has finished.
    for (CUstream s : streams_) {
      api_.streamSynchronize(s);
      api_.streamDestroy(s);
    }
    for (CUdeviceptr p : dev_) api_.memFree(p);
    for (void* p : host_) api_.memFreeHost(p);
    api_.ctxSetCurrent(nullptr);
    // The primary contexts stay retained: the process ends soon, and releasing them could
    // pull memory from under a communicator another test still holds.
  }

  std::string unavailable() const override { return why_; }
  int deviceCount() const override { return count_; }
  void makeCurrent(int device) override {
    check(api_.ctxSetCurrent(device < 0 ? nullptr : ctx_.at(device)), "cuCtxSetCurrent");
  }
  void* allocDevice(size_t bytes, int device, uint8_t fill) override {
    makeCurrent(device);
    CUdeviceptr p = 0;
    check(api_.memAlloc(&p, bytes), "cuMemAlloc");
    {
      std::lock_guard<std::mutex> lock(mu_);  // ranks as threads allocate at once
      dev_.push_back(p);
    }
    check(api_.memsetD8(p, fill, bytes), "cuMemsetD8");
    settle();
    return reinterpret_cast<void*>(p);
  }
  void* allocManaged(size_t bytes, int device) override {
    makeCurrent(device);
    CUdeviceptr p = 0;
    check(api_.memAllocManaged(&p, bytes, kAttachGlobal), "cuMemAllocManaged");
    {
      std::lock_guard<std::mutex> lock(mu_);  // ranks as threads allocate at once
      dev_.push_back(p);
    }
    return reinterpret_cast<void*>(p);
  }
  // Pinned memory needs a context, not the caller's: device 0's is pushed for the call.
  void* allocPinned(size_t bytes) override {
    void* p = nullptr;
    check(api_.ctxPushCurrent(ctx_.at(0)), "cuCtxPushCurrent");
    CUresult r = api_.memAllocHost(&p, bytes);
    CUcontext popped = nullptr;
    api_.ctxPopCurrent(&popped);
    check(r, "cuMemAllocHost");
    {
      std::lock_guard<std::mutex> lock(mu_);  // ranks as threads allocate at once
      host_.push_back(p);
    }
    return p;
  }
  bool holds(const void* p, size_t bytes, uint8_t fill) override {
    std::vector<uint8_t> copy(bytes);
    check(api_.memcpyDtoH(copy.data(), reinterpret_cast<CUdeviceptr>(p), bytes), "cuMemcpyDtoH");
    for (uint8_t b : copy)
      if (b != fill) return false;
    return true;
  }
  void* createStream(bool blocking) override {
    CUstream s = nullptr;
    // CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING
    check(api_.streamCreate(&s, blocking ? 0 : 1), "cuStreamCreate");
    {
      std::lock_guard<std::mutex> lock(mu_);  // ranks as threads allocate at once
      streams_.push_back(s);
    }
    return s;
  }
  void syncStream(void* stream) override {
    check(api_.streamSynchronize(static_cast<CUstream>(stream)), "cuStreamSynchronize");
  }
  void toDevice(void* dst, const void* src, size_t bytes) override {
    check(api_.memcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, bytes), "cuMemcpyHtoD");
    settle();
  }
  void fromDevice(void* dst, const void* src, size_t bytes) override {
    check(api_.memcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), bytes), "cuMemcpyDtoH");
  }

 private:
  // cuMemsetD8, and cuMemcpyHtoD from pageable memory, may return before the device
  // memory holds the bytes (the legacy stream still moves them), and the tests' streams
  // are non-blocking: nothing orders a collective after them. Waiting for the legacy
  // stream alone does (CU_STREAM_LEGACY), without waiting for another rank's stream.
  void settle() { check(api_.streamSynchronize(reinterpret_cast<CUstream>(0x1)), "cuStreamSynchronize (legacy)"); }

  template <typename Fn>
  bool bind(Fn*& fn, const char* name) {
    fn = reinterpret_cast<Fn*>(dlsym(lib_, name));
    return fn != nullptr;
  }
  static void check(CUresult r, const char* what) {
    if (r != 0) throw std::runtime_error(std::string(what) + " failed: CUDA error " + std::to_string(r));
  }

  void* lib_ = nullptr;  // never closed: Loom holds the same library
  Api api_{};
  std::string why_;
  int count_ = 0;
  std::vector<CUcontext> ctx_;
  std::mutex mu_;  // guards the lists below
  std::vector<CUdeviceptr> dev_;
  std::vector<void*> host_;
  std::vector<CUstream> streams_;
};

}  // namespace

std::unique_ptr<DeviceMemory> makeDeviceMemory() { return std::make_unique<CudaMemory>(); }

}  // namespace loomtest
