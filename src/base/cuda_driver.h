// The CUDA driver API, reached only through dlopen (DESIGN.md decision 3: libloom loads and
// runs without any driver). The library is `libcuda.so.1` unless LOOM_CUDA_DRIVER_LIBRARY
// names another (tests select a stand-in driver this way). It is loaded, and cuInit(0)
// called, once per process on first use; a missing library, a missing symbol or a failing
// cuInit all mean "no driver", and then every buffer is host memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "base/dl.h"

namespace loom::cuda {

// The few driver types and values Loom uses, as cuda.h declares them (no CUDA header is
// included anywhere in the library).
using CuResult = int;       // CUresult
using CuDevice = int;       // CUdevice
using CuDevicePtr = unsigned long long;  // CUdeviceptr on 64-bit hosts
constexpr CuResult kCudaSuccess = 0;

enum CuPointerAttribute : int {  // CUpointer_attribute
  kPointerAttrMemoryType = 2,
  kPointerAttrIsManaged = 8,
  kPointerAttrDeviceOrdinal = 9,
};

enum CuMemoryType : unsigned {  // CUmemorytype; 0 = not known to the driver
  kMemoryTypeHost = 1,
  kMemoryTypeDevice = 2,
  kMemoryTypeArray = 3,
  kMemoryTypeUnified = 4,
};

struct DriverApi {
  CuResult (*init)(unsigned flags) = nullptr;
  CuResult (*pointerGetAttributes)(unsigned count, CuPointerAttribute* attrs, void** data,
                                   CuDevicePtr ptr) = nullptr;
  CuResult (*ctxGetDevice)(CuDevice* device) = nullptr;
  CuResult (*getErrorString)(CuResult error, const char** text) = nullptr;
  CuResult (*driverGetVersion)(int* version) = nullptr;
  // Optional (nullptr when the library lacks them): a device's identity, and making a
  // device current on a thread (what cudaSetDevice does, through the primary context).
  CuResult (*deviceGet)(CuDevice* device, int ordinal) = nullptr;
  CuResult (*deviceGetUuid)(unsigned char* uuid16, CuDevice device) = nullptr;  // CUuuid
  CuResult (*primaryCtxRetain)(void** ctx, CuDevice device) = nullptr;
  CuResult (*ctxSetCurrent)(void* ctx) = nullptr;
  CuResult (*ctxGetCurrent)(void** ctx) = nullptr;
  // Optional: device memory for ncclMemAlloc / ncclMemFree.
  CuResult (*memAlloc)(CuDevicePtr* p, size_t bytes) = nullptr;
  CuResult (*memFree)(CuDevicePtr p) = nullptr;
};

// The stream API of the staged path (engine/staged.h): copies, host functions and waits
// queued on the caller's stream. Bound together: a driver lacking any of them has none.
using CuStream = void*;   // CUstream
using CuEvent = void*;    // CUevent
using CuHostFn = void (*)(void* userData);
constexpr unsigned kMemHostAllocPortable = 0x01;   // CU_MEMHOSTALLOC_PORTABLE
constexpr unsigned kMemHostAllocDeviceMap = 0x02;  // CU_MEMHOSTALLOC_DEVICEMAP
constexpr unsigned kStreamWaitValueEq = 0x1;       // CU_STREAM_WAIT_VALUE_EQ
constexpr unsigned kEventDisableTiming = 0x2;      // CU_EVENT_DISABLE_TIMING
constexpr int kStreamCaptureStatusNone = 0;        // CU_STREAM_CAPTURE_STATUS_NONE

struct StreamApi {
  CuResult (*memcpyAsync)(CuDevicePtr dst, CuDevicePtr src, size_t bytes, CuStream s) = nullptr;
  CuResult (*launchHostFunc)(CuStream s, CuHostFn fn, void* userData) = nullptr;
  CuResult (*streamWaitValue32)(CuStream s, CuDevicePtr addr, uint32_t value,
                                unsigned flags) = nullptr;
  CuResult (*memHostAlloc)(void** p, size_t bytes, unsigned flags) = nullptr;
  CuResult (*memFreeHost)(void* p) = nullptr;
  CuResult (*memHostGetDevicePointer)(CuDevicePtr* d, void* p, unsigned flags) = nullptr;
  CuResult (*eventCreate)(CuEvent* e, unsigned flags) = nullptr;
  CuResult (*eventRecord)(CuEvent e, CuStream s) = nullptr;
  CuResult (*streamWaitEvent)(CuStream s, CuEvent e, unsigned flags) = nullptr;
  CuResult (*streamIsCapturing)(CuStream s, int* status) = nullptr;
  // Capture (optional: `hasCapture` when all are bound): the graph a stream is being
  // captured into, user objects that keep a launch's resources alive for the graph's life,
  // and the calling thread's capture mode (allocations during a capture need RELAXED).
  CuResult (*streamGetCaptureInfo)(CuStream s, int* status, unsigned long long* id, void** graph,
                                   const void** deps, const void** edgeData,
                                   size_t* numDeps) = nullptr;
  CuResult (*userObjectCreate)(void** obj, void* ptr, CuHostFn destroy, unsigned refs,
                               unsigned flags) = nullptr;
  CuResult (*graphRetainUserObject)(void* graph, void* obj, unsigned count,
                                    unsigned flags) = nullptr;
  CuResult (*threadExchangeStreamCaptureMode)(int* mode) = nullptr;
  CuResult (*eventDestroy)(CuEvent e) = nullptr;  // optional: null, events are kept
};
constexpr int kStreamCaptureStatusActive = 1;   // CU_STREAM_CAPTURE_STATUS_ACTIVE
constexpr int kStreamCaptureModeRelaxed = 2;    // CU_STREAM_CAPTURE_MODE_RELAXED
constexpr unsigned kUserObjectNoDestructorSync = 1;  // CU_USER_OBJECT_NO_DESTRUCTOR_SYNC
constexpr unsigned kGraphUserObjectMove = 1;         // CU_GRAPH_USER_OBJECT_MOVE

// CUDA IPC (optional: `hasIpc` when all are bound): device memory and events of one process
// opened in another, for ranks that are processes on one GPU (engine/device_board.h).
// Allocations while a stream captures must not invalidate the capture (CUDA prohibits
// "unsafe" calls during a global-mode capture): the calling thread goes RELAXED meanwhile.
class RelaxedCapture {
 public:
  RelaxedCapture(const StreamApi& st, bool on) : st_(on ? &st : nullptr) {
    if (st_ && st_->threadExchangeStreamCaptureMode(&mode_) != kCudaSuccess) st_ = nullptr;
  }
  ~RelaxedCapture() {
    if (st_) st_->threadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  const StreamApi* st_;
  int mode_ = kStreamCaptureModeRelaxed;
};

struct CuIpcHandle {  // CUipcMemHandle and CUipcEventHandle alike
  char reserved[64];
};
constexpr unsigned kEventInterprocess = 0x4;           // CU_EVENT_INTERPROCESS
constexpr unsigned kIpcMemLazyEnablePeerAccess = 0x1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
struct IpcApi {
  CuResult (*memGetAddressRange)(CuDevicePtr* base, size_t* size, CuDevicePtr p) = nullptr;
  CuResult (*ipcGetMemHandle)(CuIpcHandle* h, CuDevicePtr p) = nullptr;
  CuResult (*ipcOpenMemHandle)(CuDevicePtr* p, CuIpcHandle h, unsigned flags) = nullptr;
  CuResult (*ipcCloseMemHandle)(CuDevicePtr p) = nullptr;
  CuResult (*ipcGetEventHandle)(CuIpcHandle* h, CuEvent e) = nullptr;
  CuResult (*ipcOpenEventHandle)(CuEvent* e, CuIpcHandle h) = nullptr;
  CuResult (*ctxSynchronize)() = nullptr;  // before mappings are closed
};

// Plain data, created once and never freed (a driver must outlive every static
// destructor that might still classify a buffer during exit).
// What the device executor (engine/device_exec.h) needs beyond streams and IPC: a stream of
// its own to fill its FIFOs and plans in device memory and wait for that (never the device or
// a caller's stream), and peer access between the GPUs of one process.
struct KernelApi {
  CuResult (*streamCreate)(CuStream* s, unsigned flags) = nullptr;
  CuResult (*streamSynchronize)(CuStream s) = nullptr;
  CuResult (*streamDestroy)(CuStream s) = nullptr;  // optional: null, the stream is kept
  CuResult (*eventQuery)(CuEvent e) = nullptr;       // kCudaSuccess once the event has passed
  // Optional (a driver without them: ranks of one process must share a device).
  CuResult (*deviceCanAccessPeer)(int* can, CuDevice dev, CuDevice peer) = nullptr;
  CuResult (*ctxEnablePeerAccess)(void* peerCtx, unsigned flags) = nullptr;
  // Optional: a DMA-BUF file descriptor of device memory (GPUDirect RDMA through DMA-BUF).
  CuResult (*memGetHandleForAddressRange)(void* handle, CuDevicePtr p, size_t bytes, int type,
                                          unsigned long long flags) = nullptr;
};
constexpr int kMemRangeHandleTypeDmaBufFd = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
constexpr unsigned kStreamNonBlocking = 0x1;         // CU_STREAM_NON_BLOCKING
constexpr CuResult kPeerAccessAlreadyEnabled = 704;  // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED

struct Driver {
  DynLib lib;
  DriverApi api;
  StreamApi streams;
  bool hasStreams = false;  // every StreamApi entry up to streamIsCapturing is bound
  bool hasCapture = false;  // ... and the capture entries
  IpcApi ipc;
  bool hasIpc = false;      // every IpcApi entry is bound (and the stream API)
  KernelApi kernel;
  bool hasKernel = false;   // streamCreate, streamSynchronize, eventQuery are bound (and IPC)
  int version = 0;  // 1000 * major + 10 * minor, as cuDriverGetVersion reports it
  // "CUDA error text (code)", for messages.
  std::string errorText(CuResult r) const;
};

namespace detail {
enum : int { kUnprobed = 0, kAbsent = 1, kPresent = 2 };
extern std::atomic<int> gDriverState;
extern const Driver* gDriver;
}  // namespace detail

// The slow path of driver(): probes once (thread-safe), logs at INFO why there is no
// driver when there is none.
const Driver* loadDriver();

// Whether LOOM_CUDA_DRIVER_LIBRARY names a driver library other than the system's (a
// stand-in): code built on the CUDA runtime, which always opens libcuda.so.1, does not fit it.
bool driverLibraryChosen();

// The process's driver, or nullptr when there is none. After the first call this is one
// load and a predictable branch, with no lock and no getenv.
inline const Driver* driver() {
  int s = detail::gDriverState.load(std::memory_order_acquire);
  if (s == detail::kPresent) return detail::gDriver;
  if (s == detail::kAbsent) return nullptr;
  return loadDriver();
}

// Why there is no driver ("" when there is one); probes if not yet done. For loom-info and
// diagnostics.
std::string driverAbsenceReason();

// Whether this process was forked after the driver was loaded. CUDA does not survive a
// fork: in such a child the driver may fail every call.
bool forkedSinceLoad();

// The device of the calling thread's current context, or -1 when there is no driver or no
// current context.
int currentDevice();

// The 16-byte UUID of device `ordinal`; false when the driver cannot say.
bool deviceUuid(int ordinal, unsigned char uuid[16]);

// Makes device `ordinal` current on the calling thread (its primary context), as
// cudaSetDevice does, unless it already is, and puts the thread's previous context back
// when it goes (so an init on the caller's thread leaves its device as it was).
class ScopedDevice {
 public:
  ScopedDevice() = default;
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  // False with `why` set when the device cannot be made current.
  bool set(int ordinal, std::string* why);

 private:
  bool changed_ = false;
  void* previous_ = nullptr;
};

}  // namespace loom::cuda
