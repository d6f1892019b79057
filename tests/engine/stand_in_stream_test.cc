// The stand-in driver's streams, on their own: what Loom's staged path for device buffers
// will queue (copies through pinned staging, host functions, 32-bit waits and writes,
// events, capture into graphs) must behave as cuda.h says before Loom's tests can lean on
// it. The test opens the stand-in directly and calls it as Loom would, by dlsym.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "stand_in_hooks.h"

namespace loomtest {
namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUhostFn = void (*)(void*);

constexpr CUresult kInvalidValue = 1, kInvalidContext = 201, kInvalidHandle = 400;
constexpr CUresult kNotFound = 500;
constexpr CUresult kNotReady = 600, kCaptureUnsupported = 900, kCaptureInvalidated = 901;
constexpr CUresult kCaptureImplicit = 906, kCapturedEvent = 907;
constexpr unsigned kWaitGeq = 0, kWaitEq = 1, kWaitAnd = 2, kWaitNor = 3, kWaitFlush = 1u << 30;
constexpr int kCaptureGlobal = 0, kCaptureThreadLocal = 1, kCaptureRelaxed = 2;
constexpr unsigned kUserObjectNoDestructorSync = 1, kGraphUserObjectMove = 1;
constexpr int kStatusNone = 0, kStatusActive = 1, kStatusInvalidated = 2;
void* const kLegacy = reinterpret_cast<void*>(0x1);
void* const kPerThread = reinterpret_cast<void*>(0x2);
constexpr unsigned kEventDisableTiming = 0x2, kEventInterprocess = 0x4;
constexpr unsigned kIpcMemLazyEnablePeerAccess = 0x1;

// CUipcMemHandle and CUipcEventHandle: 64 opaque bytes, passed by value.
struct IpcHandle {
  char reserved[64];
};

// The driver functions under test, bound from the stand-in.
struct Driver {
  CUresult (*getErrorString)(CUresult, const char**);
  CUresult (*pointerGetAttributes)(unsigned, int*, void**, CUdeviceptr);
  CUresult (*memAlloc)(CUdeviceptr*, size_t);
  CUresult (*memFree)(CUdeviceptr);
  CUresult (*memHostAlloc)(void**, size_t, unsigned);
  CUresult (*memAllocHost)(void**, size_t);
  CUresult (*memFreeHost)(void*);
  CUresult (*memHostGetDevicePointer)(CUdeviceptr*, void*, unsigned);
  CUresult (*memcpy)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*memcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, void*);
  CUresult (*memcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*memcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*memsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*streamCreate)(void**, unsigned);
  CUresult (*streamDestroy)(void*);
  CUresult (*streamSynchronize)(void*);
  CUresult (*streamQuery)(void*);
  CUresult (*ctxSynchronize)();
  CUresult (*launchHostFunc)(void*, CUhostFn, void*);
  CUresult (*streamWaitValue32)(void*, CUdeviceptr, uint32_t, unsigned);
  CUresult (*streamWriteValue32)(void*, CUdeviceptr, uint32_t, unsigned);
  CUresult (*eventCreate)(void**, unsigned);
  CUresult (*eventDestroy)(void*);
  CUresult (*eventRecord)(void*, void*);
  CUresult (*streamWaitEvent)(void*, void*, unsigned);
  CUresult (*eventSynchronize)(void*);
  CUresult (*eventQuery)(void*);
  CUresult (*streamIsCapturing)(void*, int*);
  CUresult (*streamBeginCapture)(void*, int);
  CUresult (*streamEndCapture)(void*, void**);
  CUresult (*graphInstantiate)(void**, void*, unsigned long long);
  CUresult (*graphLaunch)(void*, void*);
  CUresult (*graphExecDestroy)(void*);
  CUresult (*graphDestroy)(void*);
  CUresult (*streamGetCaptureInfo)(void*, int*, uint64_t*, void**, const void* const**,
                                   const void**, size_t*);
  CUresult (*threadExchangeStreamCaptureMode)(int*);
  CUresult (*userObjectCreate)(void**, void*, CUhostFn, unsigned, unsigned);
  CUresult (*userObjectRetain)(void*, unsigned);
  CUresult (*userObjectRelease)(void*, unsigned);
  CUresult (*graphRetainUserObject)(void*, void*, unsigned, unsigned);
  CUresult (*graphReleaseUserObject)(void*, void*, unsigned);
  CUresult (*memGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr);
  CUresult (*ipcGetMemHandle)(IpcHandle*, CUdeviceptr);
  CUresult (*ipcOpenMemHandle)(CUdeviceptr*, IpcHandle, unsigned);
  CUresult (*ipcCloseMemHandle)(CUdeviceptr);
  CUresult (*ipcGetEventHandle)(IpcHandle*, void*);
  CUresult (*ipcOpenEventHandle)(void**, IpcHandle);
};

template <typename Fn>
bool bind(void* lib, Fn*& fn, const char* name) {
  fn = reinterpret_cast<Fn*>(dlsym(lib, name));
  return fn != nullptr;
}

// Empty when bound, else the missing symbol or why the library did not load.
std::string bindDriver(Driver& d, StandInHooks& hooks) {
  std::string why = hooks.open(LOOM_STAND_IN_CUDA_PATH, RTLD_NOW);
  if (!why.empty()) return why;
  if (!hooks.bindStreams()) return "the stand-in lacks its stream hooks";
  void* lib = hooks.handle;
  struct Entry {
    bool ok;
    const char* name;
  };
  const Entry entries[] = {
      {bind(lib, d.getErrorString, "cuGetErrorString"), "cuGetErrorString"},
      {bind(lib, d.pointerGetAttributes, "cuPointerGetAttributes"), "cuPointerGetAttributes"},
      {bind(lib, d.memAlloc, "cuMemAlloc_v2"), "cuMemAlloc_v2"},
      {bind(lib, d.memFree, "cuMemFree_v2"), "cuMemFree_v2"},
      {bind(lib, d.memHostAlloc, "cuMemHostAlloc"), "cuMemHostAlloc"},
      {bind(lib, d.memAllocHost, "cuMemAllocHost_v2"), "cuMemAllocHost_v2"},
      {bind(lib, d.memFreeHost, "cuMemFreeHost"), "cuMemFreeHost"},
      {bind(lib, d.memHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"),
       "cuMemHostGetDevicePointer_v2"},
      {bind(lib, d.memcpy, "cuMemcpy"), "cuMemcpy"},
      {bind(lib, d.memcpyAsync, "cuMemcpyAsync"), "cuMemcpyAsync"},
      {bind(lib, d.memcpyHtoD, "cuMemcpyHtoD_v2"), "cuMemcpyHtoD_v2"},
      {bind(lib, d.memcpyDtoH, "cuMemcpyDtoH_v2"), "cuMemcpyDtoH_v2"},
      {bind(lib, d.memsetD8, "cuMemsetD8_v2"), "cuMemsetD8_v2"},
      {bind(lib, d.streamCreate, "cuStreamCreate"), "cuStreamCreate"},
      {bind(lib, d.streamDestroy, "cuStreamDestroy_v2"), "cuStreamDestroy_v2"},
      {bind(lib, d.streamSynchronize, "cuStreamSynchronize"), "cuStreamSynchronize"},
      {bind(lib, d.streamQuery, "cuStreamQuery"), "cuStreamQuery"},
      {bind(lib, d.ctxSynchronize, "cuCtxSynchronize"), "cuCtxSynchronize"},
      {bind(lib, d.launchHostFunc, "cuLaunchHostFunc"), "cuLaunchHostFunc"},
      {bind(lib, d.streamWaitValue32, "cuStreamWaitValue32_v2"), "cuStreamWaitValue32_v2"},
      {bind(lib, d.streamWriteValue32, "cuStreamWriteValue32_v2"), "cuStreamWriteValue32_v2"},
      {bind(lib, d.eventCreate, "cuEventCreate"), "cuEventCreate"},
      {bind(lib, d.eventDestroy, "cuEventDestroy_v2"), "cuEventDestroy_v2"},
      {bind(lib, d.eventRecord, "cuEventRecord"), "cuEventRecord"},
      {bind(lib, d.streamWaitEvent, "cuStreamWaitEvent"), "cuStreamWaitEvent"},
      {bind(lib, d.eventSynchronize, "cuEventSynchronize"), "cuEventSynchronize"},
      {bind(lib, d.eventQuery, "cuEventQuery"), "cuEventQuery"},
      {bind(lib, d.streamIsCapturing, "cuStreamIsCapturing"), "cuStreamIsCapturing"},
      {bind(lib, d.streamBeginCapture, "cuStreamBeginCapture_v2"), "cuStreamBeginCapture_v2"},
      {bind(lib, d.streamEndCapture, "cuStreamEndCapture"), "cuStreamEndCapture"},
      {bind(lib, d.graphInstantiate, "cuGraphInstantiateWithFlags"),
       "cuGraphInstantiateWithFlags"},
      {bind(lib, d.graphLaunch, "cuGraphLaunch"), "cuGraphLaunch"},
      {bind(lib, d.graphExecDestroy, "cuGraphExecDestroy"), "cuGraphExecDestroy"},
      {bind(lib, d.graphDestroy, "cuGraphDestroy"), "cuGraphDestroy"},
      {bind(lib, d.streamGetCaptureInfo, "cuStreamGetCaptureInfo_v3"),
       "cuStreamGetCaptureInfo_v3"},
      {bind(lib, d.threadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode"),
       "cuThreadExchangeStreamCaptureMode"},
      {bind(lib, d.userObjectCreate, "cuUserObjectCreate"), "cuUserObjectCreate"},
      {bind(lib, d.userObjectRetain, "cuUserObjectRetain"), "cuUserObjectRetain"},
      {bind(lib, d.userObjectRelease, "cuUserObjectRelease"), "cuUserObjectRelease"},
      {bind(lib, d.graphRetainUserObject, "cuGraphRetainUserObject"),
       "cuGraphRetainUserObject"},
      {bind(lib, d.graphReleaseUserObject, "cuGraphReleaseUserObject"),
       "cuGraphReleaseUserObject"},
      {bind(lib, d.memGetAddressRange, "cuMemGetAddressRange_v2"), "cuMemGetAddressRange_v2"},
      {bind(lib, d.ipcGetMemHandle, "cuIpcGetMemHandle"), "cuIpcGetMemHandle"},
      {bind(lib, d.ipcOpenMemHandle, "cuIpcOpenMemHandle_v2"), "cuIpcOpenMemHandle_v2"},
      {bind(lib, d.ipcCloseMemHandle, "cuIpcCloseMemHandle"), "cuIpcCloseMemHandle"},
      {bind(lib, d.ipcGetEventHandle, "cuIpcGetEventHandle"), "cuIpcGetEventHandle"},
      {bind(lib, d.ipcOpenEventHandle, "cuIpcOpenEventHandle"), "cuIpcOpenEventHandle"},
  };
  for (const Entry& e : entries)
    if (!e.ok) return std::string("the stand-in lacks ") + e.name;
  return "";
}

CUdeviceptr dptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

// Waits (up to 2 s) for something that must happen; false if it did not.
bool eventually(const std::function<bool()>& cond) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

// Whether something that must not happen still has not, a few milliseconds on. A correct
// stand-in never fails this; a broken one is caught unless it is slower than the window.
bool stillTrue(const std::function<bool()>& cond) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(3);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!cond()) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return cond();
}

// The permissions /proc/self/maps shows for the mapping holding p ("---s": PROT_NONE and
// shared, as the stand-in's device memory is).
std::string permsOf(CUdeviceptr p) {
  FILE* f = fopen("/proc/self/maps", "r");
  if (!f) return "";
  char line[512];
  std::string perms;
  while (fgets(line, sizeof line, f)) {
    unsigned long long lo = 0, hi = 0;
    char p4[5] = {};
    if (sscanf(line, "%llx-%llx %4s", &lo, &hi, p4) == 3 && p >= lo && p < hi) perms = p4;
  }
  fclose(f);
  return perms;
}

// What host functions leave behind, in the order the workers called them.
struct Log {
  std::mutex mu;
  std::vector<int> entries;
  void add(int v) {
    std::lock_guard<std::mutex> lock(mu);
    entries.push_back(v);
  }
  std::vector<int> get() {
    std::lock_guard<std::mutex> lock(mu);
    return entries;
  }
};

struct Tagged {
  Log* log;
  int tag;
};
void logTag(void* p) {
  auto* t = static_cast<Tagged*>(p);
  t->log->add(t->tag);
}

void bump(void* p) { static_cast<std::atomic<int>*>(p)->fetch_add(1); }

// A host function that holds its stream until the test opens the gate.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool isOpen = false;
  std::atomic<bool> entered{false};
  void open() {
    std::lock_guard<std::mutex> lock(mu);
    isOpen = true;
    cv.notify_all();
  }
};
void passGate(void* p) {
  auto* g = static_cast<Gate*>(p);
  g->entered = true;
  std::unique_lock<std::mutex> lock(g->mu);
  g->cv.wait(lock, [&] { return g->isOpen; });
}

// At scope exit, lets go of whatever a failed assertion left held and waits for all
// streams, so that no queued host function outlives the locals it uses and the fixture's
// teardown (which waits for each stream's work) cannot hang.
struct OnExit {
  std::function<void()> release;
  CUresult (*syncAll)();
  ~OnExit() {
    release();
    syncAll();
  }
};

uint32_t loadWord(const uint32_t* w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }
void storeWord(uint32_t* w, uint32_t v) { __atomic_store_n(w, v, __ATOMIC_RELEASE); }

class StandInStreams : public testing::Test {
 protected:
  static void SetUpTestSuite() { why_ = bindDriver(d_, hooks_); }
  void SetUp() override {
    ASSERT_EQ(why_, "");
    hooks_.setCurrentDevice(0);
  }
  void TearDown() override {
    hooks_.setCurrentDevice(0);
    for (void* s : streams_) EXPECT_EQ(d_.streamDestroy(s), 0);
    for (void* e : events_) EXPECT_EQ(d_.eventDestroy(e), 0);
    for (void* p : pinned_) EXPECT_EQ(d_.memFreeHost(p), 0);
    for (CUdeviceptr p : device_) EXPECT_EQ(d_.memFree(p), 0);
  }

  void* stream(unsigned flags = 0) {
    void* s = nullptr;
    EXPECT_EQ(d_.streamCreate(&s, flags), 0);
    streams_.push_back(s);
    return s;
  }
  void* event() {
    void* e = nullptr;
    EXPECT_EQ(d_.eventCreate(&e, 0), 0);
    events_.push_back(e);
    return e;
  }
  void* ipcEvent() {  // CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS
    void* e = nullptr;
    EXPECT_EQ(d_.eventCreate(&e, kEventDisableTiming | kEventInterprocess), 0);
    events_.push_back(e);
    return e;
  }
  void* pinned(size_t bytes) {
    void* p = nullptr;
    constexpr unsigned kPortable = 0x1, kDeviceMap = 0x2;
    EXPECT_EQ(d_.memHostAlloc(&p, bytes, kPortable | kDeviceMap), 0);
    memset(p, 0, bytes);
    pinned_.push_back(p);
    return p;
  }
  CUdeviceptr device(size_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_EQ(d_.memAlloc(&p, bytes), 0);
    device_.push_back(p);
    return p;
  }
  long ops(void* s) { return hooks_.streamOps(s); }

  static inline Driver d_{};
  static inline StandInHooks hooks_;
  static inline std::string why_;
  std::vector<void*> streams_, events_, pinned_;
  std::vector<CUdeviceptr> device_;
};

TEST_F(StandInStreams, CopiesRoundTripThroughProtectedDeviceMemory) {
  constexpr size_t n = 3 * 4096 + 123;
  std::vector<uint8_t> in(n), out(n);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<uint8_t>(i * 7 + 3);
  CUdeviceptr a = device(n), b = device(n);
  EXPECT_EQ(permsOf(a), "---s") << "device memory must fault on any host access";

  ASSERT_EQ(d_.memcpyHtoD(a, in.data(), n), 0);
  ASSERT_EQ(d_.memcpy(b, a, n), 0);  // device to device
  ASSERT_EQ(d_.memsetD8(a, 0xAB, n), 0);
  ASSERT_EQ(d_.memcpyDtoH(out.data(), a, n), 0);
  EXPECT_EQ(out, std::vector<uint8_t>(n, 0xAB));

  // The staged path: device -> pinned staging -> device, in order on one stream.
  void* staging = pinned(n);
  CUdeviceptr mapped = 0;
  ASSERT_EQ(d_.memHostGetDevicePointer(&mapped, staging, 0), 0);
  EXPECT_EQ(mapped, dptr(staging));
  void* s = stream();
  ASSERT_EQ(d_.memcpyAsync(mapped, b, n, s), 0);
  ASSERT_EQ(d_.memcpyAsync(a, mapped, n, s), 0);
  ASSERT_EQ(d_.streamSynchronize(s), 0);
  EXPECT_EQ(memcmp(staging, in.data(), n), 0);
  ASSERT_EQ(d_.memcpyDtoH(out.data(), a, n), 0);
  EXPECT_EQ(out, in);
  EXPECT_EQ(permsOf(a), "---s");

  // The driver reports its own allocations, whatever tests registered or cleared.
  hooks_.clear();
  int attrs[] = {2, 9};  // memory type, device ordinal
  unsigned type = 0;
  int ordinal = -1;
  void* data[] = {&type, &ordinal};
  ASSERT_EQ(d_.pointerGetAttributes(2, attrs, data, a + 5), 0);
  EXPECT_EQ(type, 2u);
  EXPECT_EQ(ordinal, 0);
  ASSERT_EQ(d_.pointerGetAttributes(2, attrs, data, mapped), 0);
  EXPECT_EQ(type, 1u);
}

TEST_F(StandInStreams, CopiesAndWaitsReachMemoryOfEveryKind) {
  // A device word: written by one stream, waited for by another, through the stand-in's
  // alias of the memory.
  CUdeviceptr flag = device(4096);
  ASSERT_EQ(d_.memsetD8(flag, 0, 4096), 0);
  void* waiter = stream();
  void* writer = stream(0x1);  // non-blocking
  std::atomic<int> after{0};
  ASSERT_EQ(d_.streamWaitValue32(waiter, flag + 8, 5, kWaitEq | kWaitFlush), 0);
  ASSERT_EQ(d_.launchHostFunc(waiter, bump, &after), 0);
  EXPECT_TRUE(stillTrue([&] { return after == 0; }));
  ASSERT_EQ(d_.streamWriteValue32(writer, flag + 8, 5, 0), 0);
  ASSERT_EQ(d_.streamSynchronize(waiter), 0);
  EXPECT_EQ(after, 1);
  uint32_t word = 0;
  ASSERT_EQ(d_.memcpyDtoH(&word, flag + 8, 4), 0);
  EXPECT_EQ(word, 5u);

  // Plain host memory copies as it is; a large copy survives chunking by the kernel.
  constexpr size_t n = (1 << 20) + 3;
  std::vector<uint8_t> src(n, 0x5A), dst(n, 0);
  CUdeviceptr big = device(n);
  ASSERT_EQ(d_.memcpyAsync(big, dptr(src.data()), n, waiter), 0);
  ASSERT_EQ(d_.memcpyAsync(dptr(dst.data()), big, n, waiter), 0);
  ASSERT_EQ(d_.streamSynchronize(waiter), 0);
  EXPECT_EQ(dst, src);
}

// Ranges a test registers as device memory are its own PROT_NONE pages, not memfd-backed:
// the stand-in reaches them through /proc/self/mem, and copies, fills and 32-bit waits and
// writes work there as on cuMemAlloc's memory, also between the two kinds.
TEST_F(StandInStreams, CopiesAndWaitsReachDeviceRangesATestRegistered) {
  constexpr size_t n = 2 * 4096;
  void* pages = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(pages, MAP_FAILED);
  OnExit unmap{[&] {
                 d_.ctxSynchronize();
                 hooks_.clear();
                 munmap(pages, n);
               },
               d_.ctxSynchronize};
  hooks_.addDeviceRange(pages, n, 1);
  const CUdeviceptr r = dptr(pages);
  EXPECT_EQ(permsOf(r), "---p");

  std::vector<uint8_t> in(n), out(n);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<uint8_t>(i * 5 + 1);
  CUdeviceptr a = device(n);
  ASSERT_EQ(d_.memcpyHtoD(r, in.data(), n), 0);
  ASSERT_EQ(d_.memcpy(a, r, n), 0);  // registered range -> memfd-backed memory
  ASSERT_EQ(d_.memsetD8(r + 4096, 0x3C, 4096), 0);
  ASSERT_EQ(d_.memcpyDtoH(out.data(), a, n), 0);
  EXPECT_EQ(out, in);
  ASSERT_EQ(d_.memcpy(a, r, n), 0);
  ASSERT_EQ(d_.memcpyDtoH(out.data(), a, n), 0);
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 4096, in.begin()));
  EXPECT_EQ(std::vector<uint8_t>(out.begin() + 4096, out.end()), std::vector<uint8_t>(4096, 0x3C));

  void* waiter = stream();
  void* writer = stream(0x1);
  std::atomic<int> after{0};
  ASSERT_EQ(d_.streamWaitValue32(waiter, r + 8, 7, kWaitEq), 0);
  ASSERT_EQ(d_.launchHostFunc(waiter, bump, &after), 0);
  EXPECT_TRUE(stillTrue([&] { return after == 0; }));
  ASSERT_EQ(d_.streamWriteValue32(writer, r + 8, 7, 0), 0);
  ASSERT_EQ(d_.streamSynchronize(waiter), 0);
  EXPECT_EQ(after, 1);

  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_EQ(d_.memGetAddressRange(&base, &size, r + 5000), 0);
  EXPECT_EQ(base, r);
  EXPECT_EQ(size, n);
  IpcHandle h{};
  EXPECT_EQ(d_.ipcGetMemHandle(&h, r), kInvalidValue) << "not cuMemAlloc's: not exportable";
}

// What cuda.h says of IPC memory handles that the exporting process can check alone: only
// the base of a cuMemAlloc allocation is exportable, each allocation has a handle of its
// own, and a process cannot open its own handles.
TEST_F(StandInStreams, IpcMemoryHandlesAreCheckedInTheExportingProcess) {
  constexpr size_t n = 4096 + 100;
  CUdeviceptr a = device(n), b = device(n);
  EXPECT_EQ(permsOf(a), "---s") << "shareable device memory: MAP_SHARED, PROT_NONE";
  IpcHandle ha{}, hb{}, again{};
  ASSERT_EQ(d_.ipcGetMemHandle(&ha, a), 0);
  ASSERT_EQ(d_.ipcGetMemHandle(&hb, b), 0);
  EXPECT_NE(memcmp(&ha, &hb, sizeof ha), 0);
  ASSERT_EQ(d_.ipcGetMemHandle(&again, a), 0);
  EXPECT_EQ(memcmp(&ha, &again, sizeof ha), 0) << "one allocation, one handle";

  // The next allocation may get a freed one's memfd number; its handle still differs.
  CUdeviceptr gone = 0, next = 0;
  IpcHandle hGone{}, hNext{};
  ASSERT_EQ(d_.memAlloc(&gone, n), 0);
  ASSERT_EQ(d_.ipcGetMemHandle(&hGone, gone), 0);
  ASSERT_EQ(d_.memFree(gone), 0);
  EXPECT_EQ(d_.ipcGetMemHandle(&again, gone), kInvalidValue) << "freed";
  next = device(n);
  ASSERT_EQ(d_.ipcGetMemHandle(&hNext, next), 0);
  EXPECT_NE(memcmp(&hGone, &hNext, sizeof hGone), 0);

  EXPECT_EQ(d_.ipcGetMemHandle(&again, a + 8), kInvalidValue) << "not the allocation's base";
  EXPECT_EQ(d_.ipcGetMemHandle(nullptr, a), kInvalidValue);
  EXPECT_EQ(d_.ipcGetMemHandle(&again, dptr(pinned(4096))), kInvalidValue);

  CUdeviceptr opened = 0;
  EXPECT_EQ(d_.ipcOpenMemHandle(&opened, ha, 0), kInvalidContext)
      << "CUDA refuses a handle of the calling process itself";
  EXPECT_EQ(d_.ipcOpenMemHandle(&opened, ha, kIpcMemLazyEnablePeerAccess), kInvalidContext);
  EXPECT_EQ(d_.ipcOpenMemHandle(&opened, ha, 0x2), kInvalidValue);
  EXPECT_EQ(d_.ipcOpenMemHandle(nullptr, ha, 0), kInvalidValue);
  IpcHandle zero{}, garbage;
  memset(&garbage, 0x5A, sizeof garbage);
  EXPECT_EQ(d_.ipcOpenMemHandle(&opened, zero, 0), kInvalidHandle);
  EXPECT_EQ(d_.ipcOpenMemHandle(&opened, garbage, 0), kInvalidHandle);
  EXPECT_EQ(opened, 0u);
  EXPECT_EQ(d_.ipcCloseMemHandle(a), kInvalidValue) << "not opened from a handle";
  EXPECT_EQ(d_.ipcCloseMemHandle(0), kInvalidValue);

  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_EQ(d_.memGetAddressRange(&base, &size, a + n - 1), 0);
  EXPECT_EQ(base, a);
  EXPECT_EQ(size, n);
  base = 0;
  ASSERT_EQ(d_.memGetAddressRange(&base, nullptr, b + 4096), 0);
  EXPECT_EQ(base, b);
  size = 0;
  ASSERT_EQ(d_.memGetAddressRange(nullptr, &size, b), 0);
  EXPECT_EQ(size, n);
  int local = 0;
  EXPECT_EQ(d_.memGetAddressRange(&base, &size, dptr(&local)), kNotFound);
  EXPECT_EQ(d_.memGetAddressRange(&base, &size, a + n), kNotFound) << "past the allocation";
  const char* text = nullptr;
  ASSERT_EQ(d_.getErrorString(kNotFound, &text), 0);
  EXPECT_STREQ(text, "named symbol not found");
}

// CU_EVENT_INTERPROCESS needs CU_EVENT_DISABLE_TIMING, as in CUDA; only interprocess events
// are exportable, and a process cannot open its own handles. The stand-in does not capture
// them: a record or a wait in a capturing stream fails and breaks the capture.
TEST_F(StandInStreams, InterprocessEventsAreCheckedAndNotCaptured) {
  void* e = nullptr;
  EXPECT_EQ(d_.eventCreate(&e, kEventInterprocess), kInvalidValue);
  EXPECT_EQ(d_.eventCreate(&e, kEventInterprocess | 0x1), kInvalidValue);
  EXPECT_EQ(e, nullptr);
  void* ev = ipcEvent();
  IpcHandle h{}, again{};
  EXPECT_EQ(d_.ipcGetEventHandle(&h, event()), kInvalidValue) << "not an interprocess event";
  EXPECT_EQ(d_.ipcGetEventHandle(&h, reinterpret_cast<void*>(0x1234)), kInvalidHandle);
  EXPECT_EQ(d_.ipcGetEventHandle(nullptr, ev), kInvalidValue);
  ASSERT_EQ(d_.ipcGetEventHandle(&h, ev), 0);
  ASSERT_EQ(d_.ipcGetEventHandle(&again, ipcEvent()), 0);
  EXPECT_NE(memcmp(&h, &again, sizeof h), 0);

  void* opened = nullptr;
  EXPECT_EQ(d_.ipcOpenEventHandle(&opened, h), kInvalidContext)
      << "a handle of the calling process itself";
  EXPECT_EQ(d_.ipcOpenEventHandle(nullptr, h), kInvalidValue);
  IpcHandle zero{}, memory{};
  EXPECT_EQ(d_.ipcOpenEventHandle(&opened, zero), kInvalidHandle);
  ASSERT_EQ(d_.ipcGetMemHandle(&memory, device(64)), 0);
  EXPECT_EQ(d_.ipcOpenEventHandle(&opened, memory), kInvalidHandle) << "a memory handle";
  EXPECT_EQ(opened, nullptr);

  EXPECT_EQ(d_.eventQuery(ev), 0) << "never recorded: nothing to wait for";
  EXPECT_EQ(d_.eventSynchronize(ev), 0);

  void* s = stream();
  void* graph = nullptr;
  ASSERT_EQ(d_.streamBeginCapture(s, kCaptureThreadLocal), 0);
  EXPECT_EQ(d_.eventRecord(ev, s), kCaptureUnsupported);
  EXPECT_EQ(d_.streamEndCapture(s, &graph), kCaptureInvalidated);
  ASSERT_EQ(d_.streamBeginCapture(s, kCaptureThreadLocal), 0);
  EXPECT_EQ(d_.streamWaitEvent(s, ev, 0), kCaptureUnsupported);
  EXPECT_EQ(d_.streamEndCapture(s, &graph), kCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);

  // Destroyed while its record is queued: the queued operation keeps the shared page.
  hooks_.pauseStream(s);
  OnExit resume{[&] { hooks_.resumeStream(s); }, d_.ctxSynchronize};
  void* doomed = nullptr;
  ASSERT_EQ(d_.eventCreate(&doomed, kEventDisableTiming | kEventInterprocess), 0);
  ASSERT_EQ(d_.eventRecord(doomed, s), 0);
  EXPECT_EQ(d_.eventQuery(doomed), kNotReady);
  ASSERT_EQ(d_.eventDestroy(doomed), 0);
  hooks_.resumeStream(s);
  EXPECT_EQ(d_.streamSynchronize(s), 0);
}

// A wait for an interprocess event is for the record that was the latest at the call, as
// cuda.h says of cuStreamWaitEvent: a wait before any record waits for nothing, and whichever
// of two records on different streams is done first, each wait ends with its own record,
// neither held by the other nor let go by it. (The same page serves every process holding
// the event; see the fork test below for two of them.)
TEST_F(StandInStreams, InterprocessEventWaitIsForTheLatestRecordAtTheCall) {
  void* ev = ipcEvent();
  void* early = stream(0x1);
  std::atomic<int> ranEarly{0};
  ASSERT_EQ(d_.streamWaitEvent(early, ev, 0), 0);  // nothing recorded yet
  ASSERT_EQ(d_.launchHostFunc(early, bump, &ranEarly), 0);
  ASSERT_EQ(d_.streamSynchronize(early), 0);
  EXPECT_EQ(ranEarly, 1);

  for (bool olderFirst : {true, false}) {
    SCOPED_TRACE(olderFirst ? "the older record is done first" : "the newer record is done first");
    auto* words = static_cast<uint32_t*>(pinned(4096));
    uint32_t* gate1 = words;
    uint32_t* gate2 = words + 1;
    OnExit release{[&] {
                     storeWord(gate1, 1);
                     storeWord(gate2, 1);
                   },
                   d_.ctxSynchronize};
    void* s1 = stream(0x1);
    void* s2 = stream(0x1);
    void* t1 = stream(0x1);
    void* t2 = stream(0x1);
    std::atomic<int> ran1{0}, ran2{0};
    ASSERT_EQ(d_.streamWaitValue32(s1, dptr(gate1), 1, kWaitGeq), 0);
    ASSERT_EQ(d_.eventRecord(ev, s1), 0);  // the older record, held by gate1
    ASSERT_EQ(d_.streamWaitEvent(t1, ev, 0), 0);
    ASSERT_EQ(d_.launchHostFunc(t1, bump, &ran1), 0);
    ASSERT_EQ(d_.streamWaitValue32(s2, dptr(gate2), 1, kWaitGeq), 0);
    ASSERT_EQ(d_.eventRecord(ev, s2), 0);  // the newer record, held by gate2
    ASSERT_EQ(d_.streamWaitEvent(t2, ev, 0), 0);
    ASSERT_EQ(d_.launchHostFunc(t2, bump, &ran2), 0);
    EXPECT_TRUE(stillTrue([&] { return ran1 == 0 && ran2 == 0; }));
    EXPECT_EQ(d_.eventQuery(ev), kNotReady);

    storeWord(olderFirst ? gate1 : gate2, 1);
    std::atomic<int>& ranFirst = olderFirst ? ran1 : ran2;
    std::atomic<int>& ranSecond = olderFirst ? ran2 : ran1;
    ASSERT_TRUE(eventually([&] { return ranFirst == 1; })) << "its record is done";
    EXPECT_TRUE(stillTrue([&] { return ranSecond == 0; })) << "its record is not";
    EXPECT_EQ(d_.eventQuery(ev), olderFirst ? kNotReady : 0) << "the query is for the newer";

    storeWord(olderFirst ? gate2 : gate1, 1);
    ASSERT_EQ(d_.eventSynchronize(ev), 0);
    EXPECT_EQ(d_.eventQuery(ev), 0);
    ASSERT_EQ(d_.streamSynchronize(t1), 0);
    ASSERT_EQ(d_.streamSynchronize(t2), 0);
    EXPECT_EQ(ran1, 1);
    EXPECT_EQ(ran2, 1);
  }
}

TEST_F(StandInStreams, OperationsRunInQueueOrder) {
  auto* word = static_cast<uint32_t*>(pinned(4096));
  uint32_t* copy = word + 1;
  struct Probe {
    uint32_t* at;
    std::vector<uint32_t>* seen;
  };
  std::vector<uint32_t> seen;  // only the worker touches it until the stream is synchronized
  Probe probeWord{word, &seen}, probeCopy{copy, &seen};
  auto record = [](void* p) {
    auto* probe = static_cast<Probe*>(p);
    probe->seen->push_back(loadWord(probe->at));
  };
  void* s = stream();
  hooks_.pauseStream(s);  // the fixture's teardown lets go of it should an assertion fail
  ASSERT_EQ(d_.streamWriteValue32(s, dptr(word), 1, 0), 0);
  ASSERT_EQ(d_.launchHostFunc(s, record, &probeWord), 0);
  ASSERT_EQ(d_.streamWriteValue32(s, dptr(word), 2, 0), 0);
  ASSERT_EQ(d_.launchHostFunc(s, record, &probeWord), 0);
  ASSERT_EQ(d_.memcpyAsync(dptr(copy), dptr(word), 4, s), 0);
  ASSERT_EQ(d_.launchHostFunc(s, record, &probeCopy), 0);
  ASSERT_EQ(d_.streamWriteValue32(s, dptr(word), 3, 0), 0);
  EXPECT_EQ(d_.streamQuery(s), kNotReady);
  EXPECT_EQ(ops(s), 0);
  EXPECT_EQ(loadWord(word), 0u);
  hooks_.resumeStream(s);
  ASSERT_EQ(d_.streamSynchronize(s), 0);
  EXPECT_EQ(seen, (std::vector<uint32_t>{1, 2, 2}));
  EXPECT_EQ(*word, 3u);
  EXPECT_EQ(ops(s), 7);
  EXPECT_EQ(d_.streamQuery(s), 0);
}

TEST_F(StandInStreams, PausedStreamStartsNothingUntilResumed) {
  void* s = stream();
  Gate gate;
  std::atomic<int> count{0};
  OnExit release{[&] { gate.open(); }, d_.ctxSynchronize};
  ASSERT_EQ(d_.launchHostFunc(s, passGate, &gate), 0);
  ASSERT_EQ(d_.launchHostFunc(s, bump, &count), 0);
  ASSERT_TRUE(eventually([&] { return gate.entered.load(); }));
  hooks_.pauseStream(s);
  gate.open();
  ASSERT_TRUE(eventually([&] { return ops(s) == 1; })) << "the running operation finishes";
  EXPECT_TRUE(stillTrue([&] { return count == 0 && ops(s) == 1; }));
  EXPECT_EQ(d_.streamQuery(s), kNotReady);
  hooks_.resumeStream(s);
  ASSERT_EQ(d_.streamSynchronize(s), 0);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(ops(s), 2);
}

TEST_F(StandInStreams, WaitValueHoldsTheStreamUntilAnotherThreadStores) {
  struct Case {
    const char* name;
    unsigned cond;
    uint32_t initial, value;
    std::vector<uint32_t> notYet;  // stores that must not release the wait
    uint32_t release;
  };
  const Case cases[] = {
      // GEQ compares modulo 2^32: 0xfffffff0 is "before" 0x10, and 0x2 "after" 0xffffffff.
      {"GEQ", kWaitGeq, 0xfffffff0u, 0x10, {0xffffffffu, 0xf}, 0x11},
      {"GEQ across the wrap", kWaitGeq, 0xfffffff0u, 0xffffffffu, {0xfffffffeu}, 0x2},
      {"EQ", kWaitEq, 0, 7, {6, 8}, 7},
      {"AND", kWaitAnd, 0, 0x4, {0x3, 0x8}, 0xc},
      {"NOR", kWaitNor, 0xffffffffu, 0xffff0000u, {0x0000ffffu}, 0x0000fffeu},
  };
  auto* word = static_cast<uint32_t*>(pinned(4096));
  void* s = stream();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    storeWord(word, c.initial);
    std::atomic<int> released{0};
    // Should an assertion fail: c.value meets every condition, whichever the compare.
    OnExit release{[&] { storeWord(word, c.value); }, d_.ctxSynchronize};
    ASSERT_EQ(d_.streamWaitValue32(s, dptr(word), c.value, c.cond), 0);
    ASSERT_EQ(d_.launchHostFunc(s, bump, &released), 0);
    for (uint32_t v : c.notYet) {
      std::thread([&] { storeWord(word, v); }).join();
      EXPECT_TRUE(stillTrue([&] { return released == 0; })) << std::hex << v;
      EXPECT_EQ(d_.streamQuery(s), kNotReady);
    }
    std::thread([&] { storeWord(word, c.release); }).join();
    ASSERT_TRUE(eventually([&] { return released == 1; }));
    EXPECT_EQ(d_.streamSynchronize(s), 0);
  }
}

// With CUDA_DEVICE_MAX_CONNECTIONS=1 (its CTest entry sets it) every stream shares one GPU
// work queue: a wait at its head holds the other streams' later work too, as a GPU with
// more streams than queues may; earlier work of other streams still runs.
TEST_F(StandInStreams, OneWorkQueueHoldsEveryStreamBehindAWait) {
  const char* v = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  if (!v || std::string(v) != "1") GTEST_SKIP() << "runs with CUDA_DEVICE_MAX_CONNECTIONS=1";
  auto* word = static_cast<uint32_t*>(pinned(4096));
  storeWord(word, 0);
  void* a = stream();
  void* b = stream();
  std::atomic<int> before{0}, behind{0};
  OnExit release{[&] { storeWord(word, 1); }, d_.ctxSynchronize};
  ASSERT_EQ(d_.launchHostFunc(b, bump, &before), 0);  // pushed before the wait: runs
  ASSERT_EQ(d_.streamWaitValue32(a, dptr(word), 1, kWaitEq), 0);
  ASSERT_EQ(d_.launchHostFunc(b, bump, &behind), 0);  // another stream, pushed after it
  ASSERT_TRUE(eventually([&] { return before == 1; }));
  EXPECT_TRUE(stillTrue([&] { return behind == 0; })) << "stream b's work passed a's wait";
  std::thread([&] { storeWord(word, 1); }).join();
  ASSERT_TRUE(eventually([&] { return behind == 1; }));
  EXPECT_EQ(d_.streamSynchronize(b), 0);
}

TEST_F(StandInStreams, EventJoinsStreamsAtThePointItWasRecorded) {
  void* a = stream();
  void* b = stream();
  void* e = event();
  Log log;
  Tagged a1{&log, 1}, b1{&log, 2};
  Gate gate;
  OnExit release{[&] {
    gate.open();
    hooks_.resumeStream(a);
  }, d_.ctxSynchronize};
  hooks_.pauseStream(a);
  ASSERT_EQ(d_.launchHostFunc(a, logTag, &a1), 0);
  ASSERT_EQ(d_.eventRecord(e, a), 0);
  ASSERT_EQ(d_.streamWaitEvent(b, e, 0), 0);
  ASSERT_EQ(d_.launchHostFunc(b, logTag, &b1), 0);
  // Recording again moves the event behind a gate; B keeps waiting for the earlier point.
  ASSERT_EQ(d_.launchHostFunc(a, passGate, &gate), 0);
  ASSERT_EQ(d_.eventRecord(e, a), 0);

  EXPECT_TRUE(stillTrue([&] { return ops(b) == 0 && log.get().empty(); }));
  EXPECT_EQ(d_.streamQuery(b), kNotReady);
  EXPECT_EQ(d_.eventQuery(e), kNotReady);
  hooks_.resumeStream(a);
  ASSERT_TRUE(eventually([&] { return d_.streamQuery(b) == 0; }));
  EXPECT_EQ(log.get(), (std::vector<int>{1, 2}));
  ASSERT_TRUE(eventually([&] { return gate.entered.load(); }));
  EXPECT_EQ(d_.eventQuery(e), kNotReady) << "the second record is still behind the gate";
  gate.open();
  EXPECT_EQ(d_.eventSynchronize(e), 0);
  EXPECT_EQ(d_.eventQuery(e), 0);

  // An event never recorded stands for no work.
  void* fresh = event();
  EXPECT_EQ(d_.eventQuery(fresh), 0);
  ASSERT_EQ(d_.streamWaitEvent(b, fresh, 0), 0);
  EXPECT_EQ(d_.streamSynchronize(b), 0);
}

TEST_F(StandInStreams, LegacyStreamAndBlockingStreamsWaitForEachOther) {
  void* blocking = stream();
  void* nonBlocking = stream(0x1);
  Log log;
  Tagged t1{&log, 1}, t2{&log, 2}, t3{&log, 3}, t4{&log, 4}, t9{&log, 9};
  OnExit release{[&] {
    for (void* s : {blocking, nonBlocking, kLegacy}) hooks_.resumeStream(s);
  }, d_.ctxSynchronize};
  hooks_.pauseStream(blocking);
  hooks_.pauseStream(nonBlocking);
  ASSERT_EQ(d_.launchHostFunc(blocking, logTag, &t1), 0);
  ASSERT_EQ(d_.launchHostFunc(nonBlocking, logTag, &t9), 0);
  ASSERT_EQ(d_.launchHostFunc(nullptr, logTag, &t2), 0);  // the legacy stream
  EXPECT_TRUE(stillTrue([&] { return log.get().empty(); }));
  EXPECT_EQ(d_.streamQuery(kLegacy), kNotReady);
  hooks_.resumeStream(blocking);
  ASSERT_EQ(d_.streamSynchronize(nullptr), 0);  // the paused non-blocking stream is not waited for
  EXPECT_EQ(log.get(), (std::vector<int>{1, 2}));

  hooks_.pauseStream(kLegacy);
  ASSERT_EQ(d_.launchHostFunc(kLegacy, logTag, &t3), 0);
  ASSERT_EQ(d_.launchHostFunc(blocking, logTag, &t4), 0);
  EXPECT_TRUE(stillTrue([&] { return log.get().size() == 2; }));
  hooks_.resumeStream(kLegacy);
  ASSERT_EQ(d_.streamSynchronize(blocking), 0);
  EXPECT_EQ(log.get(), (std::vector<int>{1, 2, 3, 4}));
  hooks_.resumeStream(nonBlocking);
  ASSERT_EQ(d_.ctxSynchronize(), 0);
  EXPECT_EQ(log.get(), (std::vector<int>{1, 2, 3, 4, 9}));
}

TEST_F(StandInStreams, PerThreadStreamsBelongToTheirThreads) {
  std::atomic<int> mine{0}, theirs{0};
  OnExit release{[&] { hooks_.resumeStream(kPerThread); }, d_.ctxSynchronize};
  hooks_.pauseStream(kPerThread);
  ASSERT_EQ(d_.launchHostFunc(kPerThread, bump, &mine), 0);
  std::thread([&] {
    EXPECT_EQ(d_.launchHostFunc(kPerThread, bump, &theirs), 0);
    EXPECT_EQ(d_.streamSynchronize(kPerThread), 0);
  }).join();
  EXPECT_EQ(theirs, 1);
  EXPECT_EQ(mine, 0);
  hooks_.resumeStream(kPerThread);
  ASSERT_EQ(d_.streamSynchronize(kPerThread), 0);
  EXPECT_EQ(mine, 1);
}

TEST_F(StandInStreams, CaptureRecordsInsteadOfRunningAndAGraphReplays) {
  auto* word = static_cast<uint32_t*>(pinned(4096));
  uint32_t* copy = word + 1;
  std::atomic<int> calls{0};
  void* s = stream();
  int status = -1;
  ASSERT_EQ(d_.streamBeginCapture(s, kCaptureGlobal), 0);
  ASSERT_EQ(d_.streamIsCapturing(s, &status), 0);
  EXPECT_EQ(status, kStatusActive);
  EXPECT_EQ(d_.streamIsCapturing(nullptr, &status), kCaptureImplicit)
      << "the legacy stream would wait for the capturing blocking stream";
  ASSERT_EQ(d_.launchHostFunc(s, bump, &calls), 0);
  ASSERT_EQ(d_.streamWriteValue32(s, dptr(word), 7, 0), 0);
  ASSERT_EQ(d_.memcpyAsync(dptr(copy), dptr(word), 4, s), 0);
  EXPECT_TRUE(stillTrue([&] { return calls == 0 && loadWord(word) == 0; }));
  EXPECT_EQ(ops(s), 0);
  void* graph = nullptr;
  ASSERT_EQ(d_.streamEndCapture(s, &graph), 0);
  ASSERT_NE(graph, nullptr);
  ASSERT_EQ(d_.streamIsCapturing(s, &status), 0);
  EXPECT_EQ(status, kStatusNone);
  EXPECT_EQ(calls, 0);

  void* exec = nullptr;
  ASSERT_EQ(d_.graphInstantiate(&exec, graph, 0), 0);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(d_.graphLaunch(exec, s), 0);
  ASSERT_EQ(d_.streamSynchronize(s), 0);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(*copy, 7u);
  EXPECT_EQ(ops(s), 9);

  void* other = stream();
  ASSERT_EQ(d_.graphLaunch(exec, other), 0);
  ASSERT_EQ(d_.streamSynchronize(other), 0);
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(d_.graphExecDestroy(exec), 0);
  EXPECT_EQ(d_.graphDestroy(graph), 0);
  EXPECT_EQ(d_.graphLaunch(exec, s), kInvalidHandle);
  EXPECT_EQ(d_.graphDestroy(graph), kInvalidHandle);
}

TEST_F(StandInStreams, CaptureForksIntoAStreamThatWaitsForACapturedEvent) {
  void* s = stream();
  void* t = stream();
  void* fork = event();
  void* join = event();
  Log log;
  Tagged t1{&log, 1}, t2{&log, 2}, t3{&log, 3};
  int status = -1;
  ASSERT_EQ(d_.streamBeginCapture(s, kCaptureGlobal), 0);
  ASSERT_EQ(d_.launchHostFunc(s, logTag, &t1), 0);
  ASSERT_EQ(d_.eventRecord(fork, s), 0);
  ASSERT_EQ(d_.streamWaitEvent(t, fork, 0), 0);
  ASSERT_EQ(d_.streamIsCapturing(t, &status), 0);
  EXPECT_EQ(status, kStatusActive);
  ASSERT_EQ(d_.launchHostFunc(t, logTag, &t2), 0);
  ASSERT_EQ(d_.eventRecord(join, t), 0);
  ASSERT_EQ(d_.streamWaitEvent(s, join, 0), 0);
  ASSERT_EQ(d_.launchHostFunc(s, logTag, &t3), 0);
  void* graph = nullptr;
  ASSERT_EQ(d_.streamEndCapture(s, &graph), 0);
  ASSERT_EQ(d_.streamIsCapturing(t, &status), 0);
  EXPECT_EQ(status, kStatusNone);
  EXPECT_EQ(d_.eventQuery(fork), kCapturedEvent);
  EXPECT_TRUE(log.get().empty());

  void* exec = nullptr;
  ASSERT_EQ(d_.graphInstantiate(&exec, graph, 0), 0);
  ASSERT_EQ(d_.graphLaunch(exec, s), 0);
  ASSERT_EQ(d_.graphLaunch(exec, s), 0);
  ASSERT_EQ(d_.streamSynchronize(s), 0);
  EXPECT_EQ(log.get(), (std::vector<int>{1, 2, 3, 1, 2, 3}));
  EXPECT_EQ(ops(t), 0);
  EXPECT_EQ(d_.graphExecDestroy(exec), 0);
  EXPECT_EQ(d_.graphDestroy(graph), 0);
}

TEST_F(StandInStreams, SynchronizingACaptureFailsAndBreaksIt) {
  void* s = stream();
  std::atomic<int> calls{0};
  int status = -1;
  void* graph = reinterpret_cast<void*>(0x99);

  ASSERT_EQ(d_.streamBeginCapture(s, kCaptureGlobal), 0);
  EXPECT_EQ(d_.streamSynchronize(s), kCaptureUnsupported);
  ASSERT_EQ(d_.streamIsCapturing(s, &status), 0);
  EXPECT_EQ(status, kStatusInvalidated);
  EXPECT_EQ(d_.launchHostFunc(s, bump, &calls), kCaptureInvalidated);
  EXPECT_EQ(d_.streamEndCapture(s, &graph), kCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  ASSERT_EQ(d_.streamIsCapturing(s, &status), 0);
  EXPECT_EQ(status, kStatusNone);

  // A synchronous copy while a capture in global mode runs.
  uint32_t from = 1, to = 0;
  ASSERT_EQ(d_.streamBeginCapture(s, kCaptureGlobal), 0);
  EXPECT_EQ(d_.memcpy(dptr(&to), dptr(&from), 4), kCaptureUnsupported);
  EXPECT_EQ(d_.streamEndCapture(s, &graph), kCaptureInvalidated);
  EXPECT_EQ(to, 0u);

  // Relaxed mode on a non-blocking stream: the copy is nobody's business.
  void* quiet = stream(0x1);
  ASSERT_EQ(d_.streamBeginCapture(quiet, kCaptureRelaxed), 0);
  EXPECT_EQ(d_.memcpy(dptr(&to), dptr(&from), 4), 0);
  EXPECT_EQ(to, 1u);
  ASSERT_EQ(d_.streamEndCapture(quiet, &graph), 0);
  EXPECT_EQ(d_.graphDestroy(graph), 0);

  // The stream works normally afterwards.
  ASSERT_EQ(d_.launchHostFunc(s, bump, &calls), 0);
  ASSERT_EQ(d_.streamSynchronize(s), 0);
  EXPECT_EQ(calls, 1);
}

TEST_F(StandInStreams, DestroyWaitsForQueuedWork) {
  void* s = nullptr;
  ASSERT_EQ(d_.streamCreate(&s, 0), 0);
  Gate gate;
  std::atomic<int> count{0};
  ASSERT_EQ(d_.launchHostFunc(s, passGate, &gate), 0);
  ASSERT_EQ(d_.launchHostFunc(s, bump, &count), 0);
  std::thread opener([&] {
    while (!gate.entered) std::this_thread::yield();
    gate.open();
  });
  EXPECT_EQ(d_.streamDestroy(s), 0);
  EXPECT_EQ(count, 1);
  opener.join();

  // A paused stream is let go rather than waited for forever.
  ASSERT_EQ(d_.streamCreate(&s, 0), 0);
  hooks_.pauseStream(s);
  ASSERT_EQ(d_.launchHostFunc(s, bump, &count), 0);
  EXPECT_EQ(d_.streamDestroy(s), 0);
  EXPECT_EQ(count, 2);
}

TEST_F(StandInStreams, BadHandlesAndArgumentsAreRefused) {
  void* bogus = reinterpret_cast<void*>(0x1234);  // only ever looked up, never followed
  std::atomic<int> calls{0};
  uint64_t scratch = 0;
  EXPECT_EQ(d_.streamSynchronize(bogus), kInvalidHandle);
  EXPECT_EQ(d_.streamQuery(bogus), kInvalidHandle);
  EXPECT_EQ(d_.launchHostFunc(bogus, bump, &calls), kInvalidHandle);
  EXPECT_EQ(d_.memcpyAsync(dptr(&scratch), dptr(&scratch), 4, bogus), kInvalidHandle);
  EXPECT_EQ(d_.streamDestroy(bogus), kInvalidHandle);
  EXPECT_EQ(d_.streamDestroy(nullptr), kInvalidHandle);
  EXPECT_EQ(d_.streamDestroy(kLegacy), kInvalidHandle);
  EXPECT_EQ(hooks_.streamOps(bogus), -1);

  void* gone = nullptr;
  ASSERT_EQ(d_.streamCreate(&gone, 0), 0);
  ASSERT_EQ(d_.streamDestroy(gone), 0);
  EXPECT_EQ(d_.streamSynchronize(gone), kInvalidHandle);
  EXPECT_EQ(d_.streamDestroy(gone), kInvalidHandle);

  void* s = stream();
  EXPECT_EQ(d_.eventRecord(bogus, s), kInvalidHandle);
  EXPECT_EQ(d_.eventQuery(bogus), kInvalidHandle);
  EXPECT_EQ(d_.eventSynchronize(bogus), kInvalidHandle);
  EXPECT_EQ(d_.streamWaitEvent(s, bogus, 0), kInvalidHandle);
  void* e = nullptr;
  ASSERT_EQ(d_.eventCreate(&e, 0), 0);
  ASSERT_EQ(d_.eventDestroy(e), 0);
  EXPECT_EQ(d_.eventDestroy(e), kInvalidHandle);
  EXPECT_EQ(d_.eventRecord(e, s), kInvalidHandle);

  void* exec = nullptr;
  EXPECT_EQ(d_.graphInstantiate(&exec, bogus, 0), kInvalidHandle);
  EXPECT_EQ(d_.graphLaunch(bogus, s), kInvalidHandle);
  EXPECT_EQ(d_.graphExecDestroy(bogus), kInvalidHandle);
  EXPECT_EQ(d_.graphDestroy(bogus), kInvalidHandle);
  int status = 0;
  void* graph = nullptr;
  EXPECT_EQ(d_.streamEndCapture(s, &graph), 401) << "not capturing: CUDA_ERROR_ILLEGAL_STATE";
  EXPECT_EQ(d_.streamIsCapturing(bogus, &status), kInvalidHandle);

  // Waits and writes need pinned host or device memory, aligned.
  auto* word = static_cast<uint32_t*>(pinned(4096));
  EXPECT_EQ(d_.streamWaitValue32(s, dptr(&scratch), 0, kWaitGeq), kInvalidValue);
  EXPECT_EQ(d_.streamWriteValue32(s, dptr(&scratch), 0, 0), kInvalidValue);
  EXPECT_EQ(d_.streamWaitValue32(s, dptr(word) + 2, 0, kWaitGeq), kInvalidValue);
  EXPECT_EQ(d_.streamWaitValue32(s, dptr(word), 0, 7), kInvalidValue);
  CUdeviceptr mapped = 0;
  EXPECT_EQ(d_.memHostGetDevicePointer(&mapped, &scratch, 0), kInvalidValue);
  ASSERT_EQ(d_.memHostGetDevicePointer(&mapped, word + 3, 0), 0);
  EXPECT_EQ(mapped, dptr(word + 3));
  EXPECT_EQ(d_.launchHostFunc(s, nullptr, nullptr), kInvalidValue);
  EXPECT_EQ(d_.memFreeHost(&scratch), kInvalidValue);

  // The default streams and new objects need a current context.
  hooks_.setCurrentDevice(-1);
  void* none = nullptr;
  EXPECT_EQ(d_.streamCreate(&none, 0), kInvalidContext);
  EXPECT_EQ(d_.launchHostFunc(nullptr, bump, &calls), kInvalidContext);
  EXPECT_EQ(d_.launchHostFunc(s, bump, &calls), 0) << "a stream carries its own context";
  hooks_.setCurrentDevice(0);
  ASSERT_EQ(d_.streamSynchronize(s), 0);
  EXPECT_EQ(calls, 1);

  for (int code : {400, 600, 900}) {
    const char* text = nullptr;
    EXPECT_EQ(d_.getErrorString(code, &text), 0) << code;
    EXPECT_NE(text, nullptr) << code;
  }
  const char* text = nullptr;
  ASSERT_EQ(d_.getErrorString(kNotReady, &text), 0);
  EXPECT_STREQ(text, "device not ready");
}

// What a user object's destroy callback saw: how often it ran and with which pointer.
struct Destroyed {
  std::atomic<int> calls{0};
  std::atomic<void*> ptr{nullptr};
};
void noteDestroyed(void* p) {
  auto* d = static_cast<Destroyed*>(p);
  d->ptr = p;
  d->calls.fetch_add(1);
}

// Sets the calling thread's capture interaction mode for a scope, as cuda.h suggests.
class CaptureMode {
 public:
  CaptureMode(CUresult (*exchange)(int*), int mode) : exchange_(exchange), mode_(mode) {
    ok_ = exchange_(&mode_) == 0;
  }
  ~CaptureMode() {
    if (ok_) exchange_(&mode_);
  }
  bool ok() const { return ok_; }

 private:
  CUresult (*exchange_)(int*);
  int mode_;
  bool ok_ = false;
};

TEST_F(StandInStreams, CaptureInfoReportsTheGraphAndAFreshIdPerCapture) {
  void* s = stream();
  void* t = stream();
  void* fork = event();
  void* join = event();
  std::atomic<int> calls{0};
  int status = -1;
  uint64_t id = 99;
  void* graph = reinterpret_cast<void*>(0x99);
  const void* const* deps = reinterpret_cast<const void* const*>(0x99);
  const void* edges = reinterpret_cast<const void*>(0x99);
  size_t numDeps = 99;
  ASSERT_EQ(d_.streamGetCaptureInfo(s, &status, &id, &graph, &deps, &edges, &numDeps), 0);
  EXPECT_EQ(status, kStatusNone);

  std::vector<uint64_t> ids;
  std::vector<void*> graphs;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    ASSERT_EQ(d_.streamBeginCapture(s, kCaptureGlobal), 0);
    ASSERT_EQ(d_.streamGetCaptureInfo(s, &status, &id, &graph, &deps, &edges, &numDeps), 0);
    EXPECT_EQ(status, kStatusActive);
    EXPECT_NE(id, 0u);
    ASSERT_NE(graph, nullptr);
    EXPECT_EQ(deps, nullptr);
    EXPECT_EQ(edges, nullptr);
    EXPECT_EQ(numDeps, 0u);
    // Only the status is required; a stream that joined by event is in the same capture.
    ASSERT_EQ(d_.streamGetCaptureInfo(s, &status, nullptr, nullptr, nullptr, nullptr, nullptr),
              0);
    EXPECT_EQ(status, kStatusActive);
    ASSERT_EQ(d_.launchHostFunc(s, bump, &calls), 0);
    ASSERT_EQ(d_.eventRecord(fork, s), 0);
    ASSERT_EQ(d_.streamWaitEvent(t, fork, 0), 0);
    uint64_t forkId = 0;
    void* forkGraph = nullptr;
    ASSERT_EQ(d_.streamGetCaptureInfo(t, &status, &forkId, &forkGraph, nullptr, nullptr,
                                      nullptr),
              0);
    EXPECT_EQ(forkId, id);
    EXPECT_EQ(forkGraph, graph);
    ASSERT_EQ(d_.eventRecord(join, t), 0);
    ASSERT_EQ(d_.streamWaitEvent(s, join, 0), 0);
    EXPECT_EQ(d_.graphDestroy(graph), 401) << "a graph being captured into stays";
    void* ended = nullptr;
    ASSERT_EQ(d_.streamEndCapture(s, &ended), 0);
    EXPECT_EQ(ended, graph) << "the graph captured into is the one the capture returns";
    ids.push_back(id);
    graphs.push_back(ended);
  }
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_NE(graphs[0], graphs[1]);

  // Arguments cuda.h refuses; a broken capture reports its status only.
  EXPECT_EQ(d_.streamGetCaptureInfo(s, nullptr, &id, nullptr, nullptr, nullptr, nullptr),
            kInvalidValue);
  EXPECT_EQ(d_.streamGetCaptureInfo(s, &status, nullptr, nullptr, nullptr, &edges, nullptr),
            kInvalidValue);
  ASSERT_EQ(d_.streamBeginCapture(s, kCaptureGlobal), 0);
  EXPECT_EQ(d_.streamSynchronize(s), kCaptureUnsupported);
  ASSERT_EQ(d_.streamGetCaptureInfo(s, &status, &id, nullptr, nullptr, nullptr, nullptr), 0);
  EXPECT_EQ(status, kStatusInvalidated);
  void* broken = nullptr;
  EXPECT_EQ(d_.streamEndCapture(s, &broken), kCaptureInvalidated);

  void* exec = nullptr;
  ASSERT_EQ(d_.graphInstantiate(&exec, graphs[1], 0), 0);
  ASSERT_EQ(d_.graphLaunch(exec, s), 0);
  ASSERT_EQ(d_.streamSynchronize(s), 0);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(d_.graphExecDestroy(exec), 0);
  for (void* g : graphs) EXPECT_EQ(d_.graphDestroy(g), 0);
}

TEST_F(StandInStreams, CaptureModeExchangeRoundTripsPerThread) {
  int mode = kCaptureRelaxed;
  ASSERT_EQ(d_.threadExchangeStreamCaptureMode(&mode), 0);
  EXPECT_EQ(mode, kCaptureGlobal) << "the default";
  mode = kCaptureThreadLocal;
  ASSERT_EQ(d_.threadExchangeStreamCaptureMode(&mode), 0);
  EXPECT_EQ(mode, kCaptureRelaxed);
  std::thread([&] {
    int theirs = kCaptureRelaxed;
    EXPECT_EQ(d_.threadExchangeStreamCaptureMode(&theirs), 0);
    EXPECT_EQ(theirs, kCaptureGlobal) << "another thread's mode is its own";
    EXPECT_EQ(d_.threadExchangeStreamCaptureMode(&theirs), 0);
    EXPECT_EQ(theirs, kCaptureRelaxed);
  }).join();
  int bad = 3;
  EXPECT_EQ(d_.threadExchangeStreamCaptureMode(&bad), kInvalidValue);
  EXPECT_EQ(bad, 3);
  EXPECT_EQ(d_.threadExchangeStreamCaptureMode(nullptr), kInvalidValue);
  mode = kCaptureGlobal;
  ASSERT_EQ(d_.threadExchangeStreamCaptureMode(&mode), 0);
  EXPECT_EQ(mode, kCaptureThreadLocal) << "unchanged by the other thread and the refusals";
}

TEST_F(StandInStreams, UnsafeCallsDuringAGlobalCaptureFailUnlessTheThreadIsRelaxed) {
  // Potentially unsafe calls, each undone when it succeeds. The capture is on a
  // non-blocking stream, so that a synchronous copy does not meet the legacy stream's
  // implicit ordering instead.
  uint32_t from = 1, to = 0;
  const std::pair<const char*, std::function<CUresult()>> calls[] = {
      {"cuMemHostAlloc", [&] {
         void* p = nullptr;
         CUresult r = d_.memHostAlloc(&p, 64, 0);
         if (r == 0) {
           EXPECT_EQ(d_.memFreeHost(p), 0);
         }
         return r;
       }},
      {"cuMemAllocHost_v2", [&] {
         void* p = nullptr;
         CUresult r = d_.memAllocHost(&p, 64);
         if (r == 0) {
           EXPECT_EQ(d_.memFreeHost(p), 0);
         }
         return r;
       }},
      {"cuMemAlloc_v2", [&] {
         CUdeviceptr p = 0;
         CUresult r = d_.memAlloc(&p, 64);
         if (r == 0) {
           EXPECT_EQ(d_.memFree(p), 0);
         }
         return r;
       }},
      {"cuEventCreate", [&] {
         void* e = nullptr;
         CUresult r = d_.eventCreate(&e, 0);
         if (r == 0) {
           EXPECT_EQ(d_.eventDestroy(e), 0);
         }
         return r;
       }},
      {"cuMemcpy", [&] { return d_.memcpy(dptr(&to), dptr(&from), 4); }},
  };
  void* s = stream(0x1);
  std::atomic<int> bumps{0};
  int status = -1;
  void* graph = nullptr;
  for (const auto& [name, call] : calls) {
    SCOPED_TRACE(name);
    // The thread's own global capture forbids the call, which breaks it.
    ASSERT_EQ(d_.streamBeginCapture(s, kCaptureGlobal), 0);
    EXPECT_EQ(call(), kCaptureUnsupported);
    ASSERT_EQ(d_.streamIsCapturing(s, &status), 0);
    EXPECT_EQ(status, kStatusInvalidated);
    EXPECT_EQ(d_.streamEndCapture(s, &graph), kCaptureInvalidated);
    EXPECT_EQ(graph, nullptr);

    // A thread that exchanged RELAXED may: the capture stays valid.
    ASSERT_EQ(d_.streamBeginCapture(s, kCaptureGlobal), 0);
    {
      CaptureMode relaxed(d_.threadExchangeStreamCaptureMode, kCaptureRelaxed);
      ASSERT_TRUE(relaxed.ok());
      EXPECT_EQ(call(), 0);
    }
    ASSERT_EQ(d_.streamIsCapturing(s, &status), 0);
    EXPECT_EQ(status, kStatusActive);
    ASSERT_EQ(d_.launchHostFunc(s, bump, &bumps), 0);
    ASSERT_EQ(d_.streamEndCapture(s, &graph), 0);
    void* exec = nullptr;
    ASSERT_EQ(d_.graphInstantiate(&exec, graph, 0), 0);
    ASSERT_EQ(d_.graphLaunch(exec, s), 0);
    ASSERT_EQ(d_.streamSynchronize(s), 0);
    EXPECT_EQ(d_.graphExecDestroy(exec), 0);
    EXPECT_EQ(d_.graphDestroy(graph), 0);
  }
  EXPECT_EQ(bumps, 5);
  EXPECT_EQ(to, 1u);

  // Another thread's global capture: it forbids this thread's calls in GLOBAL mode, not in
  // THREAD_LOCAL mode, which only minds this thread's own captures.
  for (int mode : {kCaptureThreadLocal, kCaptureGlobal}) {
    SCOPED_TRACE(mode);
    Gate begun, done;
    CUresult ended = -1;
    std::thread capturer([&] {
      void* g = nullptr;
      EXPECT_EQ(d_.streamBeginCapture(s, kCaptureGlobal), 0);
      begun.open();
      std::unique_lock<std::mutex> lock(done.mu);
      done.cv.wait(lock, [&] { return done.isOpen; });
      ended = d_.streamEndCapture(s, &g);
      if (g) {
        EXPECT_EQ(d_.graphDestroy(g), 0);
      }
    });
    {
      std::unique_lock<std::mutex> lock(begun.mu);
      begun.cv.wait(lock, [&] { return begun.isOpen; });
    }
    CUresult got = -1;
    {
      CaptureMode m(d_.threadExchangeStreamCaptureMode, mode);
      got = std::get<1>(calls[3])();  // cuEventCreate
    }
    done.open();
    capturer.join();
    if (mode == kCaptureThreadLocal) {
      EXPECT_EQ(got, 0);
      EXPECT_EQ(ended, 0);
    } else {
      EXPECT_EQ(got, kCaptureUnsupported);
      EXPECT_EQ(ended, kCaptureInvalidated);
    }
  }

  // In THREAD_LOCAL mode the thread's own capture (not begun RELAXED) still forbids.
  {
    CaptureMode local(d_.threadExchangeStreamCaptureMode, kCaptureThreadLocal);
    ASSERT_TRUE(local.ok());
    ASSERT_EQ(d_.streamBeginCapture(s, kCaptureThreadLocal), 0);
    EXPECT_EQ(std::get<1>(calls[3])(), kCaptureUnsupported);
    EXPECT_EQ(d_.streamEndCapture(s, &graph), kCaptureInvalidated);
  }
}

TEST_F(StandInStreams, UserObjectMovedIntoACapturedGraphLivesUntilItsLastExecIsDestroyed) {
  const long live = hooks_.liveUserObjects();
  void* s = stream();
  std::atomic<int> bumps{0};
  Destroyed rec;
  ASSERT_EQ(d_.streamBeginCapture(s, kCaptureGlobal), 0);
  ASSERT_EQ(d_.launchHostFunc(s, bump, &bumps), 0);
  int status = -1;
  void* graph = nullptr;
  ASSERT_EQ(d_.streamGetCaptureInfo(s, &status, nullptr, &graph, nullptr, nullptr, nullptr), 0);
  void* obj = nullptr;
  ASSERT_EQ(d_.userObjectCreate(&obj, &rec, noteDestroyed, 1, kUserObjectNoDestructorSync), 0);
  EXPECT_EQ(hooks_.liveUserObjects(), live + 1);
  ASSERT_EQ(d_.graphRetainUserObject(graph, obj, 1, kGraphUserObjectMove), 0);
  void* ended = nullptr;
  ASSERT_EQ(d_.streamEndCapture(s, &ended), 0);
  ASSERT_EQ(ended, graph);

  void* exec = nullptr;
  ASSERT_EQ(d_.graphInstantiate(&exec, graph, 0), 0);
  ASSERT_EQ(d_.graphDestroy(graph), 0);
  EXPECT_TRUE(stillTrue([&] { return rec.calls == 0; })) << "the exec holds it";
  EXPECT_EQ(hooks_.liveUserObjects(), live + 1);
  ASSERT_EQ(d_.graphLaunch(exec, s), 0);
  ASSERT_EQ(d_.streamSynchronize(s), 0);
  EXPECT_EQ(bumps, 1);
  EXPECT_TRUE(stillTrue([&] { return rec.calls == 0; }));
  ASSERT_EQ(d_.graphExecDestroy(exec), 0);
  ASSERT_TRUE(eventually([&] { return rec.calls == 1; }));
  EXPECT_EQ(rec.ptr.load(), &rec);
  ASSERT_TRUE(eventually([&] { return hooks_.liveUserObjects() == live; }));
  EXPECT_TRUE(stillTrue([&] { return rec.calls == 1; })) << "exactly once";

  // The graph of a capture that broke is dropped with the references it was given.
  Destroyed lost;
  ASSERT_EQ(d_.streamBeginCapture(s, kCaptureGlobal), 0);
  ASSERT_EQ(d_.streamGetCaptureInfo(s, &status, nullptr, &graph, nullptr, nullptr, nullptr), 0);
  ASSERT_EQ(d_.userObjectCreate(&obj, &lost, noteDestroyed, 1, kUserObjectNoDestructorSync), 0);
  ASSERT_EQ(d_.graphRetainUserObject(graph, obj, 1, kGraphUserObjectMove), 0);
  EXPECT_EQ(d_.streamSynchronize(s), kCaptureUnsupported);
  EXPECT_TRUE(stillTrue([&] { return lost.calls == 0; })) << "until the capture ends";
  EXPECT_EQ(d_.streamEndCapture(s, &ended), kCaptureInvalidated);
  ASSERT_TRUE(eventually([&] { return lost.calls == 1; }));
  ASSERT_TRUE(eventually([&] { return hooks_.liveUserObjects() == live; }));
}

TEST_F(StandInStreams, UserObjectReferencesAreCountedAcrossCallersGraphsAndExecs) {
  const long live = hooks_.liveUserObjects();
  void* s = stream();
  Destroyed rec;
  void* obj = nullptr;
  ASSERT_EQ(d_.userObjectCreate(&obj, &rec, noteDestroyed, 2, kUserObjectNoDestructorSync), 0);
  ASSERT_EQ(d_.userObjectRetain(obj, 3), 0);  // the caller holds 5
  ASSERT_EQ(d_.streamBeginCapture(s, kCaptureGlobal), 0);
  void* graph = nullptr;
  ASSERT_EQ(d_.streamEndCapture(s, &graph), 0);
  ASSERT_EQ(d_.graphRetainUserObject(graph, obj, 2, 0), 0);  // new: 7 in all
  ASSERT_EQ(d_.graphRetainUserObject(graph, obj, 1, kGraphUserObjectMove), 0);  // still 7
  EXPECT_EQ(d_.graphReleaseUserObject(graph, obj, 4), kInvalidValue) << "the graph holds 3";
  ASSERT_EQ(d_.graphReleaseUserObject(graph, obj, 1), 0);  // 6: the caller 4, the graph 2
  void* exec = nullptr;
  ASSERT_EQ(d_.graphInstantiate(&exec, graph, 0), 0);  // and the exec 1
  ASSERT_EQ(d_.userObjectRelease(obj, 4), 0);
  ASSERT_EQ(d_.graphExecDestroy(exec), 0);
  EXPECT_TRUE(stillTrue([&] { return rec.calls == 0; })) << "the graph still holds 2";
  ASSERT_EQ(d_.graphReleaseUserObject(graph, obj, 2), 0);
  ASSERT_TRUE(eventually([&] { return rec.calls == 1; }));
  EXPECT_EQ(rec.ptr.load(), &rec);
  ASSERT_TRUE(eventually([&] { return hooks_.liveUserObjects() == live; }));
  EXPECT_EQ(d_.graphDestroy(graph), 0);
  EXPECT_TRUE(stillTrue([&] { return rec.calls == 1; }));

  // Arguments cuda.h refuses.
  EXPECT_EQ(d_.userObjectCreate(&obj, &rec, noteDestroyed, 1, 0), kInvalidValue)
      << "CU_USER_OBJECT_NO_DESTRUCTOR_SYNC is required";
  EXPECT_EQ(d_.userObjectCreate(&obj, &rec, noteDestroyed, 0, kUserObjectNoDestructorSync),
            kInvalidValue);
  EXPECT_EQ(d_.userObjectCreate(&obj, &rec, nullptr, 1, kUserObjectNoDestructorSync),
            kInvalidValue);
  ASSERT_EQ(d_.userObjectCreate(&obj, &rec, noteDestroyed, 1, kUserObjectNoDestructorSync), 0);
  EXPECT_EQ(d_.userObjectRetain(obj, 0), kInvalidValue);
  EXPECT_EQ(d_.userObjectRelease(obj, 2), kInvalidValue) << "only 1 is held";
  void* bogus = reinterpret_cast<void*>(0x1234);
  EXPECT_EQ(d_.graphRetainUserObject(bogus, obj, 1, 0), kInvalidValue);
  EXPECT_EQ(d_.userObjectRetain(bogus, 1), kInvalidValue);
  ASSERT_EQ(d_.userObjectRelease(obj, 1), 0);
  ASSERT_TRUE(eventually([&] { return rec.calls == 2; }));
  ASSERT_TRUE(eventually([&] { return hooks_.liveUserObjects() == live; }));
}

TEST_F(StandInStreams, ExecDestroyedWhileItsLaunchIsQueuedKeepsItsObjectsUntilItRan) {
  const long live = hooks_.liveUserObjects();
  void* s = stream();
  std::atomic<int> bumps{0};
  Destroyed rec;
  OnExit release{[&] { hooks_.resumeStream(s); }, d_.ctxSynchronize};
  ASSERT_EQ(d_.streamBeginCapture(s, kCaptureGlobal), 0);
  ASSERT_EQ(d_.launchHostFunc(s, bump, &bumps), 0);
  ASSERT_EQ(d_.launchHostFunc(s, bump, &bumps), 0);
  int status = -1;
  void* graph = nullptr;
  ASSERT_EQ(d_.streamGetCaptureInfo(s, &status, nullptr, &graph, nullptr, nullptr, nullptr), 0);
  void* obj = nullptr;
  ASSERT_EQ(d_.userObjectCreate(&obj, &rec, noteDestroyed, 1, kUserObjectNoDestructorSync), 0);
  ASSERT_EQ(d_.graphRetainUserObject(graph, obj, 1, kGraphUserObjectMove), 0);
  ASSERT_EQ(d_.streamEndCapture(s, &graph), 0);
  void* exec = nullptr;
  ASSERT_EQ(d_.graphInstantiate(&exec, graph, 0), 0);
  ASSERT_EQ(d_.graphDestroy(graph), 0);

  hooks_.pauseStream(s);
  ASSERT_EQ(d_.graphLaunch(exec, s), 0);
  ASSERT_EQ(d_.graphExecDestroy(exec), 0);
  EXPECT_EQ(d_.graphLaunch(exec, s), kInvalidHandle);
  EXPECT_TRUE(stillTrue([&] { return bumps == 0 && rec.calls == 0; }))
      << "the queued launch holds the exec's objects";
  EXPECT_EQ(hooks_.liveUserObjects(), live + 1);
  hooks_.resumeStream(s);
  ASSERT_EQ(d_.streamSynchronize(s), 0);
  EXPECT_EQ(bumps, 2);
  ASSERT_TRUE(eventually([&] { return rec.calls == 1; }));
  EXPECT_EQ(rec.ptr.load(), &rec);
  ASSERT_TRUE(eventually([&] { return hooks_.liveUserObjects() == live; }));
}

#if defined(__SANITIZE_THREAD__)
#define LOOM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LOOM_TSAN 1
#endif
#endif

// Device memory is a shared memfd, and /proc/self/mem opened before a fork still reaches the
// parent: a child's copies must reach neither the parent's allocations nor a range the test
// registered. The child starts with a copy of what the parent's memory held.
TEST_F(StandInStreams, ForkedChildCopiesIntoItsOwnMemory) {
#ifdef LOOM_TSAN
  GTEST_SKIP() << "ThreadSanitizer ends a forked child of a threaded process that starts threads";
#else
  CUdeviceptr a = device(4096);
  void* pages = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(pages, MAP_FAILED);
  OnExit unmap{[&] {
                 hooks_.clear();
                 munmap(pages, 4096);
               },
               d_.ctxSynchronize};
  hooks_.addDeviceRange(pages, 4096, 0);
  const CUdeviceptr r = dptr(pages);
  const uint32_t parentValue = 0x11111111, childValue = 0x22222222;
  ASSERT_EQ(d_.memcpyHtoD(a, &parentValue, 4), 0);
  ASSERT_EQ(d_.memcpyHtoD(r, &parentValue, 4), 0);  // /proc/self/mem is open from here on
  ASSERT_EQ(d_.ctxSynchronize(), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(5);  // a wedged child must not hang the suite
    void* s = nullptr;
    uint32_t before = 0, back = 0, backR = 0;
    bool ok = d_.streamCreate(&s, 0x1) == 0 && d_.memcpyAsync(dptr(&before), a, 4, s) == 0 &&
              d_.memcpyAsync(a, dptr(&childValue), 4, s) == 0 &&
              d_.memcpyAsync(r, dptr(&childValue), 4, s) == 0 &&
              d_.memcpyAsync(dptr(&back), a, 4, s) == 0 &&
              d_.memcpyAsync(dptr(&backR), r, 4, s) == 0 && d_.streamSynchronize(s) == 0 &&
              before == parentValue && back == childValue && backR == childValue;
    _exit(ok ? 0 : 1);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  uint32_t now = 0;
  ASSERT_EQ(d_.memcpyDtoH(&now, a, 4), 0);
  EXPECT_EQ(now, parentValue);
  ASSERT_EQ(d_.memcpyDtoH(&now, r, 4), 0);
  EXPECT_EQ(now, parentValue);
#endif
}

// An allocation exported with cuIpcGetMemHandle and opened in another process is the same
// memory: the child reads what the parent wrote and the parent then sees what the child
// wrote. A handle of an allocation since freed cannot be opened, even where its memfd
// number was reused; a second open of a handle maps the memory a second time.
TEST_F(StandInStreams, IpcMemoryOpenedInAnotherProcessIsTheSameMemory) {
#ifdef LOOM_TSAN
  GTEST_SKIP() << "ThreadSanitizer ends a forked child of a threaded process that starts threads";
#else
  constexpr size_t n = 2 * 4096 + 40;
  CUdeviceptr gone = 0;
  IpcHandle hGone{}, h{};
  ASSERT_EQ(d_.memAlloc(&gone, n), 0);
  ASSERT_EQ(d_.ipcGetMemHandle(&hGone, gone), 0);
  ASSERT_EQ(d_.memFree(gone), 0);
  CUdeviceptr a = device(n);
  std::vector<uint8_t> parentData(n), childData(n);
  for (size_t i = 0; i < n; ++i) {
    parentData[i] = static_cast<uint8_t>(i * 3 + 1);
    childData[i] = static_cast<uint8_t>(i * 11 + 7);
  }
  ASSERT_EQ(d_.memcpyHtoD(a, parentData.data(), n), 0);
  ASSERT_EQ(d_.ipcGetMemHandle(&h, a), 0);
  ASSERT_EQ(d_.ctxSynchronize(), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(5);  // a wedged child must not hang the suite
    // The exit status names the first check that failed. Only streams of its own: the
    // parent's have no workers here.
    auto check = [](bool ok, int code) {
      if (!ok) _exit(code);
    };
    CUdeviceptr m = 0, m2 = 0, base = 0;
    size_t size = 0;
    check(d_.ipcOpenMemHandle(&m, hGone, 0) == kInvalidHandle, 2);
    check(d_.ipcOpenMemHandle(&m, h, kIpcMemLazyEnablePeerAccess) == 0 && m != 0, 3);
    check(permsOf(m) == "---s", 4);
    check(d_.memGetAddressRange(&base, &size, m + n - 1) == 0 && base == m && size == n, 5);
    int attrs[] = {2, 9};  // memory type, device ordinal
    unsigned type = 0;
    int ordinal = -1;
    void* data[] = {&type, &ordinal};
    check(d_.pointerGetAttributes(2, attrs, data, m + 1) == 0 && type == 2 && ordinal == 0, 6);
    IpcHandle again{};
    check(d_.ipcGetMemHandle(&again, m) == kInvalidValue, 7);  // not this process's allocation
    check(d_.memFree(m) == kInvalidValue, 8);                  // cuIpcCloseMemHandle's
    void* s = nullptr;
    std::vector<uint8_t> back(n);
    check(d_.streamCreate(&s, 0x1) == 0 && d_.memcpyAsync(dptr(back.data()), m, n, s) == 0 &&
              d_.memcpyAsync(m, dptr(childData.data()), n, s) == 0 &&
              d_.streamSynchronize(s) == 0,
          9);
    check(back == parentData, 10);
    check(d_.ipcOpenMemHandle(&m2, h, 0) == 0 && m2 != 0 && m2 != m, 11);
    uint32_t word = 0;
    check(d_.memcpyAsync(dptr(&word), m2 + 4096, 4, s) == 0 && d_.streamSynchronize(s) == 0 &&
              memcmp(&word, &childData[4096], 4) == 0,
          12);
    check(d_.ipcCloseMemHandle(m2) == 0 && d_.ipcCloseMemHandle(m) == 0, 13);
    check(d_.ipcCloseMemHandle(m) == kInvalidValue, 14);
    check(d_.streamDestroy(s) == 0, 15);
    _exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
      << "child status " << wstatus << " (exit code: the failed check)";
  std::vector<uint8_t> now(n);
  ASSERT_EQ(d_.memcpyDtoH(now.data(), a, n), 0);
  EXPECT_EQ(now, childData);
#endif
}

// An interprocess event orders work across processes: the child records the parent's event
// (opened from its handle) after a copy into the parent's memory, on a stream it holds; the
// parent's stream waiting for the event must not run until the child lets its stream go, and
// then sees the child's data.
TEST_F(StandInStreams, IpcEventOrdersWorkAcrossProcesses) {
#ifdef LOOM_TSAN
  GTEST_SKIP() << "ThreadSanitizer ends a forked child of a threaded process that starts threads";
#else
  constexpr size_t n = 4096;
  CUdeviceptr a = device(n);
  ASSERT_EQ(d_.memsetD8(a, 0, n), 0);
  void* ev = ipcEvent();
  IpcHandle hMem{}, hEvent{};
  ASSERT_EQ(d_.ipcGetMemHandle(&hMem, a), 0);
  ASSERT_EQ(d_.ipcGetEventHandle(&hEvent, ev), 0);
  std::vector<uint8_t> childData(n);
  for (size_t i = 0; i < n; ++i) childData[i] = static_cast<uint8_t>(i * 13 + 5);
  int toParent[2], toChild[2];
  ASSERT_EQ(pipe(toParent), 0);
  ASSERT_EQ(pipe(toChild), 0);
  ASSERT_EQ(d_.ctxSynchronize(), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(10);  // a wedged child must not hang the suite
    close(toParent[0]);
    close(toChild[1]);
    auto check = [](bool ok, int code) {  // the exit status names the failed check
      if (!ok) _exit(code);
    };
    CUdeviceptr m = 0;
    void* opened = nullptr;
    void* gate = nullptr;
    void* s = nullptr;
    check(d_.ipcOpenMemHandle(&m, hMem, 0) == 0, 2);
    check(d_.ipcOpenEventHandle(&opened, hEvent) == 0 && opened != nullptr, 3);
    check(d_.memHostAlloc(&gate, 4096, 0x3) == 0, 4);  // zeroed pages
    check(d_.streamCreate(&s, 0x1) == 0, 5);
    // Held until the parent has looked: the copy and the record stay queued behind it.
    check(d_.streamWaitValue32(s, dptr(gate), 1, kWaitGeq) == 0, 6);
    check(d_.memcpyAsync(m, dptr(childData.data()), n, s) == 0, 7);
    check(d_.eventRecord(opened, s) == 0, 8);
    check(d_.eventQuery(opened) == kNotReady, 9);
    char c = 'r';
    check(write(toParent[1], &c, 1) == 1, 10);
    check(read(toChild[0], &c, 1) == 1, 11);
    storeWord(static_cast<uint32_t*>(gate), 1);
    check(d_.streamSynchronize(s) == 0 && d_.eventQuery(opened) == 0, 12);
    check(d_.eventDestroy(opened) == 0 && d_.ipcCloseMemHandle(m) == 0, 13);
    _exit(0);
  }
  close(toParent[1]);
  close(toChild[0]);
  char c = 0;
  const bool recorded = read(toParent[0], &c, 1) == 1;
  void* t = stream(0x1);
  std::vector<uint8_t> out(n, 0xFF);
  // Whatever fails below: the child is let go and reaped, and a wait the child's record will
  // never end is ended by a record of the parent's (a later record completes it too).
  bool released = false;
  auto letGo = [&] {
    if (released) return;
    released = true;
    (void)!write(toChild[1], "g", 1);
    close(toChild[1]);
  };
  OnExit cleanup{[&] {
                   letGo();
                   if (!eventually([&] { return d_.streamQuery(t) == 0; }))
                     d_.eventRecord(ev, stream(0x1));
                 },
                 d_.ctxSynchronize};
  if (recorded) {
    // The parent's own event, which the child recorded through its handle: this waits for
    // that record.
    ASSERT_EQ(d_.streamWaitEvent(t, ev, 0), 0);
    ASSERT_EQ(d_.memcpyAsync(dptr(out.data()), a, n, t), 0);
    EXPECT_TRUE(stillTrue([&] {
      return d_.streamQuery(t) == kNotReady && d_.eventQuery(ev) == kNotReady;
    })) << "the child's stream is held: its record is not done";
  }
  letGo();
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  close(toParent[0]);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
      << "child status " << wstatus << " (exit code: the failed check)";
  ASSERT_TRUE(recorded) << "the child did not get to record";
  ASSERT_TRUE(eventually([&] { return d_.streamQuery(t) == 0; }));
  EXPECT_EQ(d_.eventQuery(ev), 0);
  EXPECT_EQ(out, childData);
#endif
}

}  // namespace
}  // namespace loomtest
