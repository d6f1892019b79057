// Device memory from the stand-in driver: its own cuMemAlloc's (memfd-backed PROT_NONE
// pages, so that a memcpy of them would SIGSEGV, and exportable with cuIpcGetMemHandle as
// cudaMalloc'd memory is). Managed memory is PROT_NONE pages of this file's, registered with
// the stand-in. Streams and copies go through the stand-in's own driver functions, which
// reach such pages without faulting.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/cuda_driver.h"
#include "device_memory.h"
#include "stand_in_hooks.h"

namespace loomtest {
namespace {

constexpr int kStandInDevices = 4;

using CUresult = int;
using CUdeviceptr = unsigned long long;

// The stand-in's driver functions that streams and copies need, as cuda.h declares them.
struct StreamApi {
  CUresult (*memAlloc)(CUdeviceptr* dptr, size_t bytes) = nullptr;
  CUresult (*memFree)(CUdeviceptr dptr) = nullptr;
  CUresult (*memsetD8)(CUdeviceptr dst, unsigned char value, size_t count) = nullptr;
  CUresult (*streamCreate)(void** stream, unsigned flags) = nullptr;
  CUresult (*streamSynchronize)(void* stream) = nullptr;
  CUresult (*streamDestroy)(void* stream) = nullptr;
  CUresult (*memcpyHtoD)(CUdeviceptr dst, const void* src, size_t bytes) = nullptr;
  CUresult (*memcpyDtoH)(void* dst, CUdeviceptr src, size_t bytes) = nullptr;
};

template <typename Fn>
bool bindSymbol(void* lib, Fn*& fn, const char* name) {
  fn = reinterpret_cast<Fn*>(dlsym(lib, name));
  return fn != nullptr;
}

void check(CUresult r, const char* what) {
  if (r != 0)
    throw std::runtime_error(std::string(what) + " failed: CUDA error " + std::to_string(r));
}

class StandInMemory : public DeviceMemory {
 public:
  StandInMemory() {
    // Before Loom's first probe: the knob is read once per process.
    setenv("LOOM_CUDA_DRIVER_LIBRARY", LOOM_STAND_IN_CUDA_PATH, 1);
    if (!loom::cuda::driver()) {
      why_ = "Loom did not load the stand-in driver: " + loom::cuda::driverAbsenceReason();
      return;
    }
    why_ = hooks_.open(LOOM_STAND_IN_CUDA_PATH, RTLD_NOW | RTLD_NOLOAD);
    if (!why_.empty()) return;
    void* lib = hooks_.handle;
    bool ok = hooks_.bindStreams() && bindSymbol(lib, api_.memAlloc, "cuMemAlloc_v2") &&
              bindSymbol(lib, api_.memFree, "cuMemFree_v2") &&
              bindSymbol(lib, api_.memsetD8, "cuMemsetD8_v2") &&
              bindSymbol(lib, api_.streamCreate, "cuStreamCreate") &&
              bindSymbol(lib, api_.streamSynchronize, "cuStreamSynchronize") &&
              bindSymbol(lib, api_.streamDestroy, "cuStreamDestroy_v2") &&
              bindSymbol(lib, api_.memcpyHtoD, "cuMemcpyHtoD_v2") &&
              bindSymbol(lib, api_.memcpyDtoH, "cuMemcpyDtoH_v2");
    if (!ok) why_ = LOOM_STAND_IN_CUDA_PATH " lacks a stream function or hook";
  }
  ~StandInMemory() override {
    if (!why_.empty()) return;
    // First, while the memory their work may use is still mapped: destroying waits for it.
    for (void* s : streams_) api_.streamDestroy(s);
    for (CUdeviceptr p : dev_) api_.memFree(p);
    hooks_.clear();
    hooks_.setCurrentDevice(0);
    for (auto& [p, bytes] : maps_) munmap(p, bytes);
    for (void* p : pinned_) free(p);
  }

  std::string unavailable() const override { return why_; }
  int deviceCount() const override { return kStandInDevices; }
  void makeCurrent(int device) override { hooks_.setCurrentDevice(device); }
  void makeThreadCurrent(int device) override { hooks_.exchangeThreadDevice(device); }

  // cuMemAlloc on `device`, made current for this thread alone while it allocates and
  // fills (ranks as threads allocate at once, each with its own device), then as it was.
  void* allocDevice(size_t bytes, int device, uint8_t fill) override {
    const int before = hooks_.exchangeThreadDevice(device);
    CUdeviceptr p = 0;
    CUresult r = api_.memAlloc(&p, bytes);
    if (r == 0) {
      {
        std::lock_guard<std::mutex> lock(mu_);  // ranks as threads allocate at once
        dev_.push_back(p);
      }
      r = api_.memsetD8(p, fill, bytes);
    }
    hooks_.exchangeThreadDevice(before);
    check(r, "cuMemAlloc / cuMemsetD8");
    return reinterpret_cast<void*>(p);
  }
  void* allocManaged(size_t bytes, int device) override {
    void* p = map(bytes);
    protect(p, bytes, PROT_NONE);
    // The memory type says host on purpose: IS_MANAGED alone must make it device memory.
    hooks_.addRange(p, bytes, 1, 1, device);
    return p;
  }
  void* allocPinned(size_t bytes) override {
    void* p = malloc(bytes);
    if (!p) throw std::bad_alloc();
    {
      std::lock_guard<std::mutex> lock(mu_);  // ranks as threads allocate at once
      pinned_.push_back(p);
    }
    hooks_.addRange(p, bytes, 1, 0, 0);
    return p;
  }
  // Looks without the driver (a copy on the legacy stream would wait for blocking streams a
  // test holds): the PROT_NONE mapping is of a read-write memfd, so it may be made readable.
  bool holds(const void* p, size_t bytes, uint8_t fill) override {
    void* page = const_cast<void*>(p);
    protect(page, bytes, PROT_READ);
    bool same = true;
    for (size_t i = 0; i < bytes; ++i) same = same && static_cast<const uint8_t*>(p)[i] == fill;
    protect(page, bytes, PROT_NONE);
    return same;
  }

  void* createStream(bool blocking) override {
    void* s = nullptr;
    // CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING
    check(api_.streamCreate(&s, blocking ? 0 : 1), "cuStreamCreate");
    {
      std::lock_guard<std::mutex> lock(mu_);  // ranks as threads allocate at once
      streams_.push_back(s);
    }
    return s;
  }
  void syncStream(void* stream) override {
    check(api_.streamSynchronize(stream), "cuStreamSynchronize");
  }
  void toDevice(void* dst, const void* src, size_t bytes) override {
    check(api_.memcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, bytes), "cuMemcpyHtoD");
  }
  void fromDevice(void* dst, const void* src, size_t bytes) override {
    check(api_.memcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), bytes), "cuMemcpyDtoH");
  }
  bool canPause() const override { return true; }
  void pauseStream(void* stream) override { hooks_.pauseStream(stream); }
  void resumeStream(void* stream) override { hooks_.resumeStream(stream); }

 private:
  void* map(size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    {
      std::lock_guard<std::mutex> lock(mu_);  // ranks as threads allocate at once
      maps_.push_back({p, bytes});
    }
    return p;
  }
  static void protect(void* p, size_t bytes, int prot) {
    if (mprotect(p, bytes, prot) != 0) throw std::runtime_error("mprotect failed");
  }

  std::string why_;
  StandInHooks hooks_;
  StreamApi api_;
  std::mutex mu_;  // guards the lists below
  std::vector<void*> streams_;
  std::vector<CUdeviceptr> dev_;                // from cuMemAlloc, freed with cuMemFree
  std::vector<std::pair<void*, size_t>> maps_;  // managed memory
  std::vector<void*> pinned_;
};

}  // namespace

std::unique_ptr<DeviceMemory> makeDeviceMemory() { return std::make_unique<StandInMemory>(); }

}  // namespace loomtest
