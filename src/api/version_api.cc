// Library-level entry points that need no communicator: versions, error strings, memory
// allocation, debug re-initialisation, and Loom's feature query.
#include <nccl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "api/guard.h"
#include "base/config.h"
#include "base/dl.h"
#include "base/error.h"
#include "base/log.h"
#include "base/mem_kind.h"
#include "dispatch/stock_nccl.h"
#include "loom/loom.h"
#include "transports/net/ucx_api.h"

namespace {

bool canLoad(const std::vector<std::string>& names) {
  return loom::DynLib::open(names).loaded();
}

unsigned probeAvailable() {
  unsigned avail = loomFeatureHostMemory;
  if (canLoad({"libcudart.so.13", "libcudart.so.12", "libcudart.so"})) avail |= loomFeatureCuda;
  if (canLoad({"libnvidia-ml.so.1"})) avail |= loomFeatureNvml;
  if (canLoad({"libibverbs.so.1"})) avail |= loomFeatureIbverbs;
  if (canLoad({"libucp.so.0"})) avail |= loomFeatureUcx;
  // Looked up afresh (LOOM_NCCL_LIBRARY may have changed); closed again unless in use.
  if (loom::dispatch::findStockNccl() != nullptr) avail |= loomFeatureNcclFallback;
  return avail;
}

// What this build contains: host memory, the fallback to stock NCCL (except in sanitizer
// builds, which cannot open it), the UCX network backend where UCX's headers were there
// to build it. The CUDA executor, NVML topology and the verbs backend are not built yet;
// each adds its bit here when it lands.
unsigned compiledFeatures() {
  unsigned bits = loomFeatureHostMemory;
  if (loom::dispatch::stockNcclSupportedInThisBuild()) bits |= loomFeatureNcclFallback;
  if (loom::ucxBuiltIn()) bits |= loomFeatureUcx;
  return bits;
}

}  // namespace

using loom::api::guard;

extern "C" void ncclResetDebugInitInternal();

LOOM_NCCL_API ncclResult_t ncclGetVersion(int* version) {
  return guard("ncclGetVersion", nullptr, [&] {
    LOOM_CHECK_ARG(version != nullptr, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
  });
}

// The strings are NCCL's, word for word: scripts and log scrapers match on them.
LOOM_NCCL_API const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

// NCCL allocates device memory on the caller's current device (nccl-tests fills its
// buffers with cudaMemset). So does Loom, through cuMemAlloc, when the calling thread has
// a current CUDA context; without one (no driver, no GPU, or none made current) it hands
// out page-aligned host memory, on which every Loom collective runs (page alignment is
// what registration and windows need: NCCL_WIN_REQUIRED_ALIGNMENT is 4096).
LOOM_NCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  return guard("ncclMemAlloc", nullptr, [&] {
    LOOM_CHECK_ARG(ptr != nullptr, "ncclMemAlloc: ptr is NULL");
    LOOM_CHECK_ARG(size > 0, "ncclMemAlloc: size is 0");
    const loom::cuda::Driver* drv = loom::cuda::driver();
    if (drv && drv->api.memAlloc && drv->api.memFree && loom::cuda::currentDevice() >= 0) {
      loom::cuda::CuDevicePtr d = 0;
      if (loom::cuda::CuResult r = drv->api.memAlloc(&d, size); r != loom::cuda::kCudaSuccess)
        LOOM_THROW(kUnhandledCudaError, "ncclMemAlloc: cuMemAlloc of %zu bytes on device %d failed: %s",
                   size, loom::cuda::currentDevice(), drv->errorText(r).c_str());
      *ptr = reinterpret_cast<void*>(d);
      return ncclSuccess;
    }
    long page = sysconf(_SC_PAGESIZE);
    size_t align = page > 0 ? static_cast<size_t>(page) : 4096;
    if (align < NCCL_WIN_REQUIRED_ALIGNMENT) align = NCCL_WIN_REQUIRED_ALIGNMENT;
    void* p = nullptr;
    if (int rc = posix_memalign(&p, align, size); rc != 0) {
      LOOM_THROW(kSystemError, "ncclMemAlloc: cannot allocate %zu bytes of host memory (%s)",
                 size, rc == ENOMEM ? "out of memory" : "posix_memalign failed");
    }
    *ptr = p;
    return ncclSuccess;
  });
}

// Device memory goes back through cuMemFree, which (as cudaFree) waits for the device's
// streams first; host memory through free(). NULL is a no-op, as for free().
LOOM_NCCL_API ncclResult_t ncclMemFree(void* ptr) {
  return guard("ncclMemFree", nullptr, [&] {
    if (!ptr) return ncclSuccess;
    const loom::cuda::Driver* drv = loom::cuda::driver();
    const loom::MemInfo where = drv && drv->api.memFree ? loom::classifyPointer(ptr) : loom::MemInfo{};
    if (where.kind == loom::MemKind::kDevice) {
      // In its device's context, whichever the calling thread has (or none).
      loom::cuda::ScopedDevice sd;
      std::string why;
      if (where.device >= 0 && !sd.set(where.device, &why))
        LOOM_THROW(kUnhandledCudaError, "ncclMemFree(%p): %s", ptr, why.c_str());
      if (loom::cuda::CuResult r = drv->api.memFree(reinterpret_cast<loom::cuda::CuDevicePtr>(ptr));
          r != loom::cuda::kCudaSuccess)
        LOOM_THROW(kUnhandledCudaError, "ncclMemFree: cuMemFree(%p) failed: %s", ptr,
                   drv->errorText(r).c_str());
      return ncclSuccess;
    }
    free(ptr);
    return ncclSuccess;
  });
}

// Deprecated in nccl.h; still exported because NCCL exports it.
LOOM_NCCL_API void ncclResetDebugInit(void) { ncclResetDebugInitInternal(); }

// NCCL's non-deprecated spelling (used by its own tests); there is no pnccl variant.
extern "C" __attribute__((visibility("default"))) void ncclResetDebugInitInternal() {
  (void)guard("ncclResetDebugInit", nullptr, [] {
    loom::logReset();
    return ncclSuccess;
  });
}

extern "C" __attribute__((visibility("default"))) const char* loomGetVersionString(void) {
  return LOOM_VERSION_STRING;
}

extern "C" __attribute__((visibility("default"))) ncclResult_t loomGetFeatures(unsigned* compiled,
                                                                              unsigned* available) {
  return guard("loomGetFeatures", nullptr, [&] {
    LOOM_CHECK_ARG(compiled != nullptr || available != nullptr,
                   "loomGetFeatures: compiled and available are both NULL");
    if (compiled) *compiled = compiledFeatures();
    if (available) *available = probeAvailable();
    return ncclSuccess;
  });
}

// The pncclX profiling names (nccl.h declares both; NCCL exports both).
LOOM_NCCL_PROFILING_ALIAS(ncclGetVersion);
LOOM_NCCL_PROFILING_ALIAS(ncclGetErrorString);
LOOM_NCCL_PROFILING_ALIAS(ncclMemAlloc);
LOOM_NCCL_PROFILING_ALIAS(ncclMemFree);
// NCCL marks ncclResetDebugInit deprecated; Loom still exports it (and its alias).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
LOOM_NCCL_PROFILING_ALIAS(ncclResetDebugInit);
#pragma GCC diagnostic pop
