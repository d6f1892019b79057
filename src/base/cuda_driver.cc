#include "base/cuda_driver.h"

#include <pthread.h>

#include <mutex>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"

namespace loom::cuda {
namespace {

StringKnob kDriverLibrary("LOOM_CUDA_DRIVER_LIBRARY", "", "libcuda.so.1",
                          "CUDA driver library to dlopen (path or soname), read once per "
                          "process; if it is absent or cuInit fails, every buffer is host memory");

std::once_flag gOnce;
std::string* gAbsence = nullptr;  // why there is no driver; set once under gOnce
std::atomic<bool> gForked{false};

void markForked() { gForked.store(true, std::memory_order_relaxed); }

// Loads and initializes the driver; nullptr with `why` set when it cannot be used.
Driver* probe(std::string* why) {
  std::string name = kDriverLibrary.get();
  std::string err;
  DynLib lib = DynLib::open({name}, &err);
  if (!lib.loaded()) {
    *why = "the CUDA driver library is not loadable: " + err;
    return nullptr;
  }
  auto* d = new Driver{std::move(lib), {}, {}, false, false, {}, false, {}, false, 0};
  const char* missing = nullptr;
  auto need = [&](auto*& fn, const char* sym) {
    if (!missing && !d->lib.bind(fn, sym)) missing = sym;
  };
  need(d->api.init, "cuInit");
  need(d->api.pointerGetAttributes, "cuPointerGetAttributes");
  need(d->api.ctxGetDevice, "cuCtxGetDevice");
  need(d->api.getErrorString, "cuGetErrorString");
  need(d->api.driverGetVersion, "cuDriverGetVersion");
  d->lib.bind(d->api.deviceGet, "cuDeviceGet");
  if (!d->lib.bind(d->api.deviceGetUuid, "cuDeviceGetUuid_v2"))
    d->lib.bind(d->api.deviceGetUuid, "cuDeviceGetUuid");
  d->lib.bind(d->api.primaryCtxRetain, "cuDevicePrimaryCtxRetain");
  d->lib.bind(d->api.ctxSetCurrent, "cuCtxSetCurrent");
  d->lib.bind(d->api.ctxGetCurrent, "cuCtxGetCurrent");
  d->lib.bind(d->api.memAlloc, "cuMemAlloc_v2");
  d->lib.bind(d->api.memFree, "cuMemFree_v2");
  StreamApi& st = d->streams;
  d->hasStreams = d->lib.bind(st.memcpyAsync, "cuMemcpyAsync") &&
                  d->lib.bind(st.launchHostFunc, "cuLaunchHostFunc") &&
                  d->lib.bind(st.streamWaitValue32, "cuStreamWaitValue32_v2") &&
                  d->lib.bind(st.memHostAlloc, "cuMemHostAlloc") &&
                  d->lib.bind(st.memFreeHost, "cuMemFreeHost") &&
                  d->lib.bind(st.memHostGetDevicePointer, "cuMemHostGetDevicePointer_v2") &&
                  d->lib.bind(st.eventCreate, "cuEventCreate") &&
                  d->lib.bind(st.eventRecord, "cuEventRecord") &&
                  d->lib.bind(st.streamWaitEvent, "cuStreamWaitEvent") &&
                  d->lib.bind(st.streamIsCapturing, "cuStreamIsCapturing") &&
                  d->api.primaryCtxRetain && d->api.ctxSetCurrent && d->api.ctxGetCurrent;
  d->lib.bind(st.eventDestroy, "cuEventDestroy_v2");
  d->hasCapture = d->hasStreams &&
                  d->lib.bind(st.streamGetCaptureInfo, "cuStreamGetCaptureInfo_v3") &&
                  d->lib.bind(st.userObjectCreate, "cuUserObjectCreate") &&
                  d->lib.bind(st.graphRetainUserObject, "cuGraphRetainUserObject") &&
                  d->lib.bind(st.threadExchangeStreamCaptureMode,
                              "cuThreadExchangeStreamCaptureMode");
  IpcApi& ipc = d->ipc;
  d->hasIpc = d->hasStreams && st.eventDestroy &&
              d->lib.bind(ipc.memGetAddressRange, "cuMemGetAddressRange_v2") &&
              d->lib.bind(ipc.ipcGetMemHandle, "cuIpcGetMemHandle") &&
              d->lib.bind(ipc.ipcOpenMemHandle, "cuIpcOpenMemHandle_v2") &&
              d->lib.bind(ipc.ipcCloseMemHandle, "cuIpcCloseMemHandle") &&
              d->lib.bind(ipc.ipcGetEventHandle, "cuIpcGetEventHandle") &&
              d->lib.bind(ipc.ipcOpenEventHandle, "cuIpcOpenEventHandle") &&
              d->lib.bind(ipc.ctxSynchronize, "cuCtxSynchronize");
  KernelApi& k = d->kernel;
  d->hasKernel = d->hasIpc && d->api.memAlloc && d->api.memFree && d->lib.bind(k.streamCreate, "cuStreamCreate") &&
                 d->lib.bind(k.streamSynchronize, "cuStreamSynchronize") &&
                 d->lib.bind(k.eventQuery, "cuEventQuery");
  d->lib.bind(k.streamDestroy, "cuStreamDestroy_v2");
  d->lib.bind(k.deviceCanAccessPeer, "cuDeviceCanAccessPeer");
  d->lib.bind(k.ctxEnablePeerAccess, "cuCtxEnablePeerAccess");
  d->lib.bind(k.memGetHandleForAddressRange, "cuMemGetHandleForAddressRange");
  if (missing) {
    *why = d->lib.path() + " lacks " + missing + ", so it is not a usable CUDA driver";
    delete d;
    return nullptr;
  }
  if (CuResult r = d->api.init(0); r != kCudaSuccess) {
    *why = strprintf("cuInit(0) from %s failed: %s", d->lib.path().c_str(),
                     d->errorText(r).c_str());
    delete d;
    return nullptr;
  }
  if (d->api.driverGetVersion(&d->version) != kCudaSuccess) d->version = 0;
  pthread_atfork(nullptr, nullptr, markForked);
  return d;
}

}  // namespace

namespace detail {
std::atomic<int> gDriverState{kUnprobed};
const Driver* gDriver = nullptr;
}  // namespace detail

std::string Driver::errorText(CuResult r) const {
  const char* text = nullptr;
  if (api.getErrorString && api.getErrorString(r, &text) == kCudaSuccess && text)
    return strprintf("%s (%d)", text, r);
  return strprintf("CUDA error %d", r);
}

const Driver* loadDriver() {
  std::call_once(gOnce, [] {
    std::string why;
    const Driver* d = probe(&why);
    detail::gDriver = d;
    if (d) {
      LOOM_INFO(kLogInit, "CUDA driver %d.%d loaded from %s: device buffers are recognized",
                d->version / 1000, d->version % 1000 / 10, d->lib.path().c_str());
    } else {
      gAbsence = new std::string(why);
      LOOM_INFO(kLogInit, "no CUDA driver (%s): every buffer is treated as host memory",
                why.c_str());
    }
    detail::gDriverState.store(d ? detail::kPresent : detail::kAbsent, std::memory_order_release);
  });
  return detail::gDriver;
}

std::string driverAbsenceReason() {
  return driver() ? std::string() : *gAbsence;
}

bool driverLibraryChosen() { return kDriverLibrary.isSet(); }

bool forkedSinceLoad() { return gForked.load(std::memory_order_relaxed); }

int currentDevice() {
  const Driver* d = driver();
  if (!d) return -1;
  CuDevice dev = -1;
  // No current context (CUDA_ERROR_INVALID_CONTEXT) is the common "host-only" answer.
  return d->api.ctxGetDevice(&dev) == kCudaSuccess ? dev : -1;
}

namespace {

bool deviceHandle(const Driver* d, int ordinal, CuDevice* dev) {
  if (!d->api.deviceGet) {
    *dev = ordinal;  // the handle is the ordinal in every driver so far
    return true;
  }
  return d->api.deviceGet(dev, ordinal) == kCudaSuccess;
}

}  // namespace

bool deviceUuid(int ordinal, unsigned char uuid[16]) {
  const Driver* d = driver();
  CuDevice dev;
  return d && d->api.deviceGetUuid && deviceHandle(d, ordinal, &dev) &&
         d->api.deviceGetUuid(uuid, dev) == kCudaSuccess;
}

bool ScopedDevice::set(int ordinal, std::string* why) {
  const Driver* d = driver();
  if (!d) {
    *why = "no CUDA driver";
    return false;
  }
  if (currentDevice() == ordinal) return true;
  if (!d->api.primaryCtxRetain || !d->api.ctxSetCurrent || !d->api.ctxGetCurrent) {
    *why = d->lib.path() + " lacks cuDevicePrimaryCtxRetain/cuCtxSetCurrent/cuCtxGetCurrent";
    return false;
  }
  CuDevice dev;
  if (!deviceHandle(d, ordinal, &dev)) {
    *why = strprintf("cuDeviceGet(%d) failed", ordinal);
    return false;
  }
  // The primary context stays retained for the process's life, as the runtime keeps it.
  void* ctx = nullptr;
  if (CuResult r = d->api.primaryCtxRetain(&ctx, dev); r != kCudaSuccess) {
    *why = strprintf("cuDevicePrimaryCtxRetain(%d): %s", ordinal, d->errorText(r).c_str());
    return false;
  }
  void* previous = nullptr;
  if (d->api.ctxGetCurrent(&previous) != kCudaSuccess) previous = nullptr;
  if (CuResult r = d->api.ctxSetCurrent(ctx); r != kCudaSuccess) {
    *why = strprintf("cuCtxSetCurrent(device %d): %s", ordinal, d->errorText(r).c_str());
    return false;
  }
  changed_ = true;
  previous_ = previous;
  return true;
}

ScopedDevice::~ScopedDevice() {
  if (changed_) driver()->api.ctxSetCurrent(previous_);
}

}  // namespace loom::cuda
