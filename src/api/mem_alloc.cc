// ncclMemAlloc / ncclMemFree.
//
// NCCL allocates device memory on the caller's current device (nccl-tests fills its buffers
// with cudaMemset), with the cuMem (virtual memory) API: memory that its symmetric windows
// and NVLS registration require. Loom does the same where stock NCCL may serve that device's
// memory: it hands the allocation to stock NCCL's ncclMemAlloc when a stock library is
// found, LOOM_NCCL_FALLBACK is not off, and no communicator of this process whose device
// memory Loom serves is on the device. Otherwise (or when stock's allocation fails) it uses
// cuMemAlloc, whose memory CUDA IPC can share between processes on one GPU, as Loom's direct
// path for them needs (cuMem memory cannot be shared so). Without a current CUDA context (no
// driver, no GPU, or none made current) it hands out page-aligned host memory, on which every
// Loom collective runs (page alignment is what registration and windows need:
// NCCL_WIN_REQUIRED_ALIGNMENT is 4096).
#include <nccl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "api/guard.h"
#include "api/stock_route.h"
#include "base/cuda_driver.h"
#include "base/error.h"
#include "base/log.h"
#include "base/mem_kind.h"
#include "dispatch/fallback.h"
#include "dispatch/stock_nccl.h"

using loom::api::guard;

namespace {

// Stock NCCL's allocation of `size` bytes on the current device `dev`, where it is the one
// to make it (see above); false to leave it to Loom.
bool stockAllocates(void** ptr, size_t size, int dev) {
  try {
    if (loom::dispatch::fallbackMode() == loom::dispatch::FallbackMode::kOff) return false;
  } catch (const loom::Error&) {
    return false;  // a malformed knob: each communicator's init reports it
  }
  if (loom::api::loomServesDevice(dev)) return false;
  const loom::dispatch::StockNccl* lib = loom::dispatch::processStockNccl(nullptr);
  if (!lib || !lib->api().memAlloc || !lib->api().memFree) return false;
  void* p = nullptr;
  if (ncclResult_t rc = lib->api().memAlloc(&p, size); rc != ncclSuccess) {
    LOOM_INFO(loom::kLogAlloc, "ncclMemAlloc: stock NCCL's (%s) failed on device %d: %s; "
              "allocating with cuMemAlloc instead", lib->path().c_str(), dev,
              lib->errorText(rc, nullptr).c_str());
    return false;
  }
  loom::api::noteStockAllocation(p);
  *ptr = p;
  return true;
}

}  // namespace

LOOM_NCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  return guard("ncclMemAlloc", nullptr, [&] {
    LOOM_CHECK_ARG(ptr != nullptr, "ncclMemAlloc: ptr is NULL");
    LOOM_CHECK_ARG(size > 0, "ncclMemAlloc: size is 0");
    const loom::cuda::Driver* drv = loom::cuda::driver();
    const int dev = drv ? loom::cuda::currentDevice() : -1;
    if (drv && drv->api.memAlloc && drv->api.memFree && dev >= 0) {
      if (stockAllocates(ptr, size, dev)) return ncclSuccess;
      loom::cuda::CuDevicePtr d = 0;
      if (loom::cuda::CuResult r = drv->api.memAlloc(&d, size); r != loom::cuda::kCudaSuccess)
        LOOM_THROW(kUnhandledCudaError, "ncclMemAlloc: cuMemAlloc of %zu bytes on device %d failed: %s",
                   size, dev, drv->errorText(r).c_str());
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

// Stock NCCL's allocations go back to it; other device memory through cuMemFree, which (as
// cudaFree) waits for the device's streams first; host memory through free(). NULL is a
// no-op, as for free().
LOOM_NCCL_API ncclResult_t ncclMemFree(void* ptr) {
  return guard("ncclMemFree", nullptr, [&] {
    if (!ptr) return ncclSuccess;
    if (loom::api::takeStockAllocation(ptr)) {
      const loom::dispatch::StockNccl* lib = loom::dispatch::processStockNccl(nullptr);
      if (ncclResult_t rc = lib->api().memFree(ptr); rc != ncclSuccess)
        loom::throwError(static_cast<loom::Code>(rc), "ncclMemFree(%p), allocated by stock NCCL: %s",
                         ptr, lib->errorText(rc, nullptr).c_str());
      return ncclSuccess;
    }
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

LOOM_NCCL_PROFILING_ALIAS(ncclMemAlloc);
LOOM_NCCL_PROFILING_ALIAS(ncclMemFree);
