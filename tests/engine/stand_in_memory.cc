// Device memory from the stand-in driver: mmap'd pages, reported as device memory and
// protected with PROT_NONE, so that a memcpy of them would SIGSEGV.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "base/cuda_driver.h"
#include "device_memory.h"
#include "stand_in_hooks.h"

namespace loomtest {
namespace {

constexpr int kStandInDevices = 4;

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
  }
  ~StandInMemory() override {
    if (!why_.empty()) return;
    hooks_.clear();
    hooks_.setCurrentDevice(0);
    for (auto& [p, bytes] : maps_) munmap(p, bytes);
    for (void* p : pinned_) free(p);
  }

  std::string unavailable() const override { return why_; }
  int deviceCount() const override { return kStandInDevices; }
  void makeCurrent(int device) override { hooks_.setCurrentDevice(device); }

  void* allocDevice(size_t bytes, int device, uint8_t fill) override {
    void* p = map(bytes);
    memset(p, fill, bytes);
    protect(p, bytes, PROT_NONE);
    hooks_.addDeviceRange(p, bytes, device);
    return p;
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
    pinned_.push_back(p);
    hooks_.addRange(p, bytes, 1, 0, 0);
    return p;
  }
  bool holds(const void* p, size_t bytes, uint8_t fill) override {
    void* page = const_cast<void*>(p);
    protect(page, bytes, PROT_READ);
    bool same = true;
    for (size_t i = 0; i < bytes; ++i) same = same && static_cast<const uint8_t*>(p)[i] == fill;
    protect(page, bytes, PROT_NONE);
    return same;
  }

 private:
  void* map(size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    maps_.push_back({p, bytes});
    return p;
  }
  static void protect(void* p, size_t bytes, int prot) {
    if (mprotect(p, bytes, prot) != 0) throw std::runtime_error("mprotect failed");
  }

  std::string why_;
  StandInHooks hooks_;
  std::vector<std::pair<void*, size_t>> maps_;
  std::vector<void*> pinned_;
};

}  // namespace

std::unique_ptr<DeviceMemory> makeDeviceMemory() { return std::make_unique<StandInMemory>(); }

}  // namespace loomtest
