// A stand-in for the CUDA driver (libcuda.so.1), selected with LOOM_CUDA_DRIVER_LIBRARY.
// It exports the driver functions Loom binds, with cuda.h's signatures and values, and
// reports address ranges that a test registers as device, managed or pinned host memory;
// every other address is unregistered host memory, as the real driver reports it. Tests
// reach its hooks (loomStandIn*) with dlopen(path, RTLD_NOLOAD) and dlsym.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace {

using CUresult = int;
constexpr CUresult kSuccess = 0;
constexpr CUresult kInvalidValue = 1;
constexpr CUresult kInvalidContext = 201;
constexpr int kAttrMemoryType = 2, kAttrIsManaged = 8, kAttrDeviceOrdinal = 9;
constexpr int kNoOrdinal = -2;  // what the driver reports for memory it does not know

struct Range {
  uintptr_t begin, end;
  unsigned memType;
  unsigned managed;
  int device;
};

struct State {
  std::mutex mu;
  std::vector<Range> ranges;
  int currentDevice = 0;
  std::atomic<CUresult> initResult{kSuccess};
  std::atomic<CUresult> queryResult{kSuccess};
  std::atomic<long> queries{0};
};

State& state() {
  static State* s = new State();  // outlives any static destructor that still queries
  return *s;
}

constexpr int kDevices = 4;
constexpr int kNoThreadContext = -100;
// A thread that made a context current (cuCtxSetCurrent) sees its device; other threads
// see the process-wide one the test sets.
thread_local int tlsDevice = kNoThreadContext;

}  // namespace

extern "C" {

__attribute__((visibility("default"))) CUresult cuInit(unsigned flags) {
  return flags != 0 ? kInvalidValue : state().initResult.load();
}

__attribute__((visibility("default"))) CUresult cuDriverGetVersion(int* version) {
  if (!version) return kInvalidValue;
  *version = 13000;
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuGetErrorString(CUresult error,
                                                                 const char** text) {
  if (!text) return kInvalidValue;
  switch (error) {
    case 0: *text = "no error"; break;
    case 1: *text = "invalid argument"; break;
    case 3: *text = "initialization error"; break;
    case 4: *text = "driver shutting down"; break;
    case 100: *text = "no CUDA-capable device is detected"; break;
    case 201: *text = "invalid device context"; break;
    default: *text = nullptr; return kInvalidValue;
  }
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuCtxGetDevice(int* device) {
  if (!device) return kInvalidValue;
  std::lock_guard<std::mutex> lock(state().mu);
  const int current = tlsDevice != kNoThreadContext ? tlsDevice : state().currentDevice;
  if (current < 0) return kInvalidContext;
  *device = current;
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuDeviceGet(int* device, int ordinal) {
  if (!device || ordinal < 0 || ordinal >= kDevices) return kInvalidValue;
  *device = ordinal;
  return kSuccess;
}

// Device d's UUID: "stand-in gpu" and the ordinal.
__attribute__((visibility("default"))) CUresult cuDeviceGetUuid_v2(unsigned char* uuid,
                                                                   int device) {
  if (!uuid || device < 0 || device >= kDevices) return kInvalidValue;
  static const char kTag[] = "stand-in gpu ";
  for (int i = 0; i < 16; ++i) uuid[i] = i < 13 ? kTag[i] : 0;
  uuid[15] = static_cast<unsigned char>(device);
  return kSuccess;
}

// A primary context is the device's ordinal + 1 in disguise.
__attribute__((visibility("default"))) CUresult cuDevicePrimaryCtxRetain(void** ctx,
                                                                         int device) {
  if (!ctx || device < 0 || device >= kDevices) return kInvalidValue;
  *ctx = reinterpret_cast<void*>(static_cast<uintptr_t>(device) + 1);
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuCtxGetCurrent(void** ctx) {
  if (!ctx) return kInvalidValue;
  std::lock_guard<std::mutex> lock(state().mu);
  const int current = tlsDevice != kNoThreadContext ? tlsDevice : state().currentDevice;
  *ctx = reinterpret_cast<void*>(static_cast<uintptr_t>(current + 1));  // -1: none
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuCtxSetCurrent(void* ctx) {
  tlsDevice = static_cast<int>(reinterpret_cast<uintptr_t>(ctx)) - 1;
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuPointerGetAttributes(
    unsigned count, int* attrs, void** data, unsigned long long ptr) {
  State& s = state();
  s.queries.fetch_add(1);
  if (CUresult r = s.queryResult.load(); r != kSuccess) return r;
  if (!attrs || !data) return kInvalidValue;
  Range found{0, 0, 0, 0, kNoOrdinal};
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (const Range& r : s.ranges)
      if (ptr >= r.begin && ptr < r.end) found = r;
  }
  for (unsigned i = 0; i < count; ++i) {
    switch (attrs[i]) {
      case kAttrMemoryType: *static_cast<unsigned*>(data[i]) = found.memType; break;
      case kAttrIsManaged: *static_cast<unsigned char*>(data[i]) = found.managed ? 1 : 0; break;
      case kAttrDeviceOrdinal: *static_cast<int*>(data[i]) = found.device; break;
      default: return kInvalidValue;
    }
  }
  return kSuccess;
}

// ---- test hooks

// memType is a CUmemorytype (1 host, 2 device); managed marks cudaMallocManaged memory.
__attribute__((visibility("default"))) void loomStandInAddRange(const void* p, size_t bytes,
                                                               unsigned memType, int managed,
                                                               int device) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto b = reinterpret_cast<uintptr_t>(p);
  state().ranges.push_back({b, b + bytes, memType, managed ? 1u : 0u, device});
}

__attribute__((visibility("default"))) void loomStandInAddDeviceRange(const void* p,
                                                                     size_t bytes, int device) {
  loomStandInAddRange(p, bytes, 2, 0, device);
}

__attribute__((visibility("default"))) void loomStandInClear() {
  std::lock_guard<std::mutex> lock(state().mu);
  state().ranges.clear();
}

// The device of the (process-wide) current context; -1: no current context.
__attribute__((visibility("default"))) void loomStandInSetCurrentDevice(int device) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().currentDevice = device;
}

// What cuInit returns (0 = success); only useful before Loom's first call.
__attribute__((visibility("default"))) void loomStandInSetInitResult(int result) {
  state().initResult = result;
}

// What cuPointerGetAttributes returns; anything but 0 makes it fail.
__attribute__((visibility("default"))) void loomStandInSetQueryResult(int result) {
  state().queryResult = result;
}

__attribute__((visibility("default"))) long loomStandInQueryCount() {
  return state().queries.load();
}

}  // extern "C"
