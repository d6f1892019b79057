// Library-level entry points that need no communicator: versions, error strings, debug
// re-initialisation, and Loom's feature query (ncclMemAlloc: mem_alloc.cc).
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
// NCCL marks ncclResetDebugInit deprecated; Loom still exports it (and its alias).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
LOOM_NCCL_PROFILING_ALIAS(ncclResetDebugInit);
#pragma GCC diagnostic pop
