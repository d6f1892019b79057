// Buffer registration and symmetric memory windows (ncclCommRegister, ncclCommWindowRegister
// and their undoing), and the window lookups NCCL 2.29/2.30 added.
//
// Loom's own collectives need no registration: host buffers, and device buffers that Loom
// serves, are registered as a no-op (the handle is remembered, so that a handle this
// communicator never gave out is refused, as NCCL refuses it). Where a shadow communicator
// serves the communicator's device memory (stock NCCL, LOOM_NCCL_FALLBACK), device buffers
// are registered with stock NCCL, which serves every call on them, and windows are stock
// NCCL's: its zero-copy and symmetric kernels then run as they would without Loom.
#include <nccl.h>

#include <algorithm>

#include "api/comm.h"
#include "api/group.h"
#include "api/guard.h"
#include "api/stock_route.h"
#include "base/mem_kind.h"
#include "dispatch/nccl_extra_abi.h"

using loom::api::guard;
using loom::dispatch::StockApi;

namespace {

bool take(std::vector<void*>& handles, void* h) {
  auto it = std::find(handles.begin(), handles.end(), h);
  if (it == handles.end()) return false;
  handles.erase(it);
  return true;
}

}  // namespace

LOOM_NCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size,
                                            void** handle) {
  const char* fn = "ncclCommRegister";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    LOOM_CHECK_ARG(handle != nullptr, "%s: handle is NULL", fn);
    LOOM_CHECK_ARG(buff != nullptr || size == 0, "%s: buff is NULL", fn);
    // Device memory that stock NCCL serves is registered there (an optimisation: a stock
    // library without the call serves it unregistered, as Loom does). Stock NCCL may give
    // NULL (registration off there): nothing to give back then.
    const StockApi* stock = comm->shadow ? &comm->shadow->lib().api() : nullptr;
    if (stock && stock->commRegister && stock->commDeregister && buff &&
        loom::classifyPointer(buff).kind == loom::MemKind::kDevice) {
      void* h = nullptr;
      loom::api::checkStock(comm, stock->commRegister(comm->shadow->stockComm(), buff, size, &h),
                            fn);
      std::lock_guard<std::mutex> lock(comm->opsMu);
      if (h) comm->stockRegistrations.push_back(h);
      *handle = h;
      return ncclSuccess;
    }
    // Loom's own: the handle is the buffer address (1 for an empty one).
    void* h = buff ? buff : reinterpret_cast<void*>(1);
    std::lock_guard<std::mutex> lock(comm->opsMu);
    comm->loomRegistrations.push_back(h);
    *handle = h;
    return ncclSuccess;
  });
}

// A NULL handle is a no-op, as in NCCL (its registration may have given NULL).
LOOM_NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  const char* fn = "ncclCommDeregister";
  return guard(fn, comm, [&] {
    loom::api::checkCommForManagement(comm, fn);
    if (!handle) return ncclSuccess;
    bool stocks = false;
    {
      std::lock_guard<std::mutex> lock(comm->opsMu);
      stocks = take(comm->stockRegistrations, handle);
      LOOM_CHECK_USAGE(stocks || take(comm->loomRegistrations, handle),
                       "%s: handle %p was not registered on this communicator (or was "
                       "deregistered already)", fn, handle);
    }
    if (stocks) loom::api::callStock(comm, fn, &StockApi::commDeregister, handle);
    return ncclSuccess;
  });
}

// Collective, as in NCCL: inside a group the registration joins a stock group that the
// group's end closes (one thread may register for every rank it drives), and *win is set
// then. Stock NCCL gives NULL where it has no symmetric memory for the communicator.
LOOM_NCCL_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                                  ncclWindow_t* win, int winFlags) {
  const char* fn = "ncclCommWindowRegister";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    LOOM_CHECK_ARG(win != nullptr, "%s: win is NULL", fn);
    LOOM_CHECK_ARG(buff != nullptr && size > 0, "%s: buff is NULL or size is 0", fn);
    LOOM_CHECK_USAGE(comm->shadow != nullptr,
                     "%s: symmetric memory windows are stock NCCL's (CUDA memory mapped across "
                     "the ranks' GPUs), and this communicator's device memory is served by %s",
                     fn, comm->deviceServer.c_str());
    auto reg = loom::api::stockEntry(comm->shadow->lib(), &StockApi::commWindowRegister, fn);
    if (loom::api::inGroup()) {
      const uint64_t serial = comm->serial;
      loom::api::joinStockGroup(comm, [comm, serial, win] {
        if (*win && loom::api::isLiveComm(comm, serial)) loom::api::noteStockWindow(*win, comm);
      });
      loom::api::checkStockQueued(comm, reg(comm->shadow->stockComm(), buff, size, win, winFlags),
                                  fn);
      return ncclSuccess;
    }
    ncclWindow_t w = nullptr;
    loom::api::checkStock(comm, reg(comm->shadow->stockComm(), buff, size, &w, winFlags), fn);
    if (w) loom::api::noteStockWindow(w, comm);
    *win = w;
    return ncclSuccess;
  });
}

// A NULL window is a no-op, as in NCCL.
LOOM_NCCL_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  const char* fn = "ncclCommWindowDeregister";
  return guard(fn, comm, [&] {
    loom::api::checkCommForManagement(comm, fn);
    if (!win) return ncclSuccess;
    LOOM_CHECK_ARG(comm->shadow && loom::api::takeStockWindow(win, comm),
                   "%s: %p is not a window of this communicator (not registered on it, or "
                   "deregistered already)",
                   fn, static_cast<void*>(win));
    loom::api::callStockOrJoinGroup(comm, fn, &StockApi::commWindowDeregister, win);
    return ncclSuccess;
  });
}

// ---- NCCL 2.29/2.30's window lookups: stock NCCL answers for its windows, if it has them.

namespace {

const loom::dispatch::StockNccl& stockOfWindow(ncclWindow_t win, const char* fn) {
  LOOM_CHECK_ARG(win != nullptr, "%s: window is NULL", fn);
  LOOM_CHECK_USAGE(loom::api::stockWindowComm(win) != nullptr,
                   "%s: window %p is not stock NCCL's: windows exist only on communicators whose "
                   "device memory stock NCCL serves (ncclCommWindowRegister)",
                   fn, static_cast<void*>(win));
  const loom::dispatch::StockNccl* lib = loom::dispatch::processStockNccl(nullptr);
  LOOM_CHECK_USAGE(lib != nullptr, "%s: no stock NCCL in this process", fn);  // made the window
  return *lib;
}

}  // namespace

// A NULL window's user pointer is NULL, as in NCCL.
LOOM_NCCL_API ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win,
                                             void** outUserPtr) {
  const char* fn = "ncclWinGetUserPtr";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    LOOM_CHECK_ARG(outUserPtr != nullptr, "%s: outUserPtr is NULL", fn);
    if (!win) {
      *outUserPtr = nullptr;
      return ncclSuccess;
    }
    LOOM_CHECK_ARG(comm->shadow && loom::api::stockWindowComm(win) == comm,
                   "%s: %p is not a window of this communicator", fn, static_cast<void*>(win));
    loom::api::callStock(comm, fn, &StockApi::winGetUserPtr, win, outUserPtr);
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t win, size_t offset,
                                                           void** outPtr) {
  const char* fn = "ncclGetLsaMultimemDevicePointer";
  return guard(fn, nullptr, [&] {
    LOOM_CHECK_ARG(outPtr != nullptr, "%s: outPtr is NULL", fn);
    loom::api::callStockCommless(stockOfWindow(win, fn), fn,
                                 &StockApi::getLsaMultimemDevicePointer, win, offset, outPtr);
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t win, size_t offset, int peer,
                                                    void** outPtr) {
  const char* fn = "ncclGetPeerDevicePointer";
  return guard(fn, nullptr, [&] {
    LOOM_CHECK_ARG(outPtr != nullptr, "%s: outPtr is NULL", fn);
    loom::api::callStockCommless(stockOfWindow(win, fn), fn, &StockApi::getPeerDevicePointer,
                                 win, offset, peer, outPtr);
    return ncclSuccess;
  });
}

// The pncclX profiling names (NCCL exports both: nccl.h declares them for its 2.28.9 calls,
// NCCL 2.29/2.30's headers for the lookups).
LOOM_NCCL_PROFILING_ALIAS(ncclCommRegister);
LOOM_NCCL_PROFILING_ALIAS(ncclCommDeregister);
LOOM_NCCL_PROFILING_ALIAS(ncclCommWindowRegister);
LOOM_NCCL_PROFILING_ALIAS(ncclCommWindowDeregister);
LOOM_NCCL_PROFILING_ALIAS(ncclWinGetUserPtr);
LOOM_NCCL_PROFILING_ALIAS(ncclGetLsaMultimemDevicePointer);
LOOM_NCCL_PROFILING_ALIAS(ncclGetPeerDevicePointer);
