// The fixtures of the fallback's routing tests (fallback_routing_test.cc,
// registration_test.cc), each built twice: against the stand-in stock NCCL
// (LOOM_STAND_IN_NCCL_PATH defined: StandInStock) and against the machine's real one
// (RealStock). See fallback_routing_test.cc.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "base/cuda_driver.h"
#include "core/rank_harness.h"
#include "dispatch/stock_nccl.h"
#include "engine/stand_in_hooks.h"

namespace routing {

// Before any Loom call: both libraries are chosen once per process.
inline const bool kEnvSet = [] {
  setenv("LOOM_CUDA_DRIVER_LIBRARY", LOOM_STAND_IN_CUDA_PATH, 1);
#ifdef LOOM_STAND_IN_NCCL_PATH
  setenv("LOOM_NCCL_LIBRARY", LOOM_STAND_IN_NCCL_PATH, 1);
#endif
  unsetenv("LOOM_NCCL_FALLBACK");
  // Device buffers that stock NCCL does not serve are refused, not staged (staged_test.cc
  // covers Loom's staged path).
  setenv("LOOM_STAGED_PATH", "0", 1);
  return true;
}();

inline bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
inline size_t countOf(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

struct ScopedFallback {
  explicit ScopedFallback(const char* mode) { setenv("LOOM_NCCL_FALLBACK", mode, 1); }
  ~ScopedFallback() { unsetenv("LOOM_NCCL_FALLBACK"); }
};

// ncclCommInitAll over `devs` (-1: a rank without a device); destroyed at scope end.
struct Comms {
  explicit Comms(std::vector<int> devs) : comms(devs.size(), nullptr) {
    rc = ncclCommInitAll(comms.data(), static_cast<int>(devs.size()), devs.data());
    if (rc != ncclSuccess) error = ncclGetLastError(nullptr);
  }
  ~Comms() {
    for (ncclComm_t c : comms)
      if (c) ncclCommDestroy(c);
  }
  ncclComm_t operator[](size_t i) const { return comms[i]; }
  std::vector<ncclComm_t> comms;
  ncclResult_t rc;
  std::string error;
};

class Fixture : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kEnvSet);
    if (!loom::dispatch::stockNcclSupportedInThisBuild())
      GTEST_SKIP() << "this build cannot open stock NCCL (sanitizer runtime)";
    // Loom loads the stand-in driver once; then its hooks are reachable.
    ASSERT_NE(loom::cuda::driver(), nullptr) << loom::cuda::driverAbsenceReason();
    ASSERT_EQ(hooks_.open(LOOM_STAND_IN_CUDA_PATH, RTLD_NOW | RTLD_NOLOAD), "");
  }
  void TearDown() override {
    if (hooks_.clear) hooks_.clear();
    for (float* p : device_) delete[] p;
  }
  // Host memory the stand-in driver reports as memory of device `dev`, readable by the
  // stand-in stock NCCL that serves it.
  float* deviceFloats(size_t n, int dev, float fill) {
    float* p = new float[n];
    for (size_t i = 0; i < n; ++i) p[i] = fill + static_cast<float>(i % 7);
    hooks_.addDeviceRange(p, n * sizeof(float), dev);
    device_.push_back(p);
    return p;
  }
  // A device all-reduce on `comm` (of device `dev`) that must be refused; its message.
  std::string refusal(ncclComm_t comm, int dev) {
    float* s = deviceFloats(8, dev, 1);
    EXPECT_EQ(ncclAllReduce(s, s, 8, ncclFloat, ncclSum, comm, nullptr), ncclInvalidUsage);
    return ncclGetLastError(comm);
  }
  loomtest::StandInHooks hooks_;
  std::vector<float*> device_;
};

#ifdef LOOM_STAND_IN_NCCL_PATH

// The stand-in stock NCCL's hooks (the library Loom opened).
struct StockLog {
  StockLog() {
    void* h = dlopen(LOOM_STAND_IN_NCCL_PATH, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return;
    text = reinterpret_cast<const char* (*)()>(dlsym(h, "standInNcclLog"));
    clear = reinterpret_cast<void (*)()>(dlsym(h, "standInNcclClearLog"));
    live = reinterpret_cast<int (*)()>(dlsym(h, "standInNcclLiveComms"));
    setAsyncError = reinterpret_cast<void (*)(int)>(dlsym(h, "standInNcclSetAsyncError"));
    failInitOfRank = reinterpret_cast<void (*)(int)>(dlsym(h, "standInNcclFailInitOfRank"));
    setCommAsyncError =
        reinterpret_cast<void (*)(int, int, int)>(dlsym(h, "standInNcclSetCommAsyncError"));
    failMemAlloc = reinterpret_cast<void (*)(int)>(dlsym(h, "standInNcclFailMemAlloc"));
    nullHandles = reinterpret_cast<void (*)(int)>(dlsym(h, "standInNcclNullHandles"));
  }
  bool ok() const {
    return text && clear && live && setAsyncError && failInitOfRank && setCommAsyncError &&
           failMemAlloc && nullHandles;
  }
  std::string str() const { return text(); }
  const char* (*text)() = nullptr;
  void (*clear)() = nullptr;
  int (*live)() = nullptr;
  void (*setAsyncError)(int) = nullptr;
  void (*failInitOfRank)(int) = nullptr;
  void (*setCommAsyncError)(int rank, int nranks, int rc) = nullptr;
  void (*failMemAlloc)(int fail) = nullptr;
  void (*nullHandles)(int null) = nullptr;
};

class StandInStock : public Fixture {
 protected:
  void SetUp() override {
    Fixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    {  // Opened by the first communicator with a device.
      Comms warm({0});
      ASSERT_EQ(warm.rc, ncclSuccess) << warm.error;
    }
    ASSERT_TRUE(log_.ok() || (log_ = StockLog(), log_.ok())) << "stand-in NCCL not loaded";
    log_.clear();
  }
  StockLog log_;
};

#else  // the machine's real stock NCCL

class RealStock : public Fixture {
 protected:
  void SetUp() override {
    Fixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
      dlclose(cuda);
      GTEST_SKIP() << "a CUDA driver is installed: stock NCCL would find its GPU here; the "
                      "stand-in suite and the GPU check cover routing on such a machine";
    }
    std::string why;
    if (!loom::dispatch::processStockNccl(&why)) GTEST_SKIP() << "no stock NCCL: " << why;
  }
};

#endif

}  // namespace routing
