// Buffer registration and symmetric memory windows (ncclCommRegister, ncclCommWindowRegister
// and their undoing), and the window lookups NCCL 2.29/2.30 added.
//
// Loom's own collectives need no registration: host buffers, and device buffers that Loom
// serves, are accepted as a no-op. Where a shadow communicator serves the communicator's
// device memory (stock NCCL, LOOM_NCCL_FALLBACK), device buffers are registered with stock
// NCCL, which serves every call on them, and windows are stock NCCL's: its zero-copy and
// symmetric kernels then run as they would without Loom in the process.
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

// Runs a collective registration call now, or at the group's end inside a group (as NCCL
// does: one thread registering for every rank it drives must not wait on itself).
ncclResult_t nowOrAtGroupEnd(ncclComm_t comm, const char* fn, std::function<ncclResult_t()> run) {
  if (!loom::api::inGroup()) return run();
  loom::api::deferCall(comm, fn, std::move(run));
  return ncclSuccess;
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
    // library without the call serves it unregistered, as Loom does).
    const StockApi* stock = comm->shadow ? &comm->shadow->lib().api() : nullptr;
    if (stock && stock->commRegister && stock->commDeregister && buff &&
        loom::classifyPointer(buff).kind == loom::MemKind::kDevice) {
      void* h = nullptr;
      loom::api::checkStock(comm, stock->commRegister(comm->shadow->stockComm(), buff, size, &h),
                            fn);
      std::lock_guard<std::mutex> lock(comm->opsMu);
      comm->stockRegistrations.push_back(h);
      *handle = h;
      return ncclSuccess;
    }
    // Loom's own: the handle is the buffer address (1 for an empty one), never stock's.
    *handle = buff ? buff : reinterpret_cast<void*>(1);
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  const char* fn = "ncclCommDeregister";
  return guard(fn, comm, [&] {
    loom::api::checkCommForManagement(comm, fn);
    LOOM_CHECK_ARG(handle != nullptr, "%s: handle is NULL", fn);
    bool stocks = false;
    {
      std::lock_guard<std::mutex> lock(comm->opsMu);
      auto& regs = comm->stockRegistrations;
      auto it = std::find(regs.begin(), regs.end(), handle);
      if (it != regs.end()) {
        regs.erase(it);
        stocks = true;
      }
    }
    if (stocks)
      loom::api::checkStock(
          comm, comm->shadow->lib().api().commDeregister(comm->shadow->stockComm(), handle), fn);
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                                  ncclWindow_t* win, int winFlags) {
  const char* fn = "ncclCommWindowRegister";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    LOOM_CHECK_ARG(win != nullptr, "%s: win is NULL", fn);
    LOOM_CHECK_ARG(buff != nullptr || size == 0, "%s: buff is NULL", fn);
    LOOM_CHECK_USAGE(comm->shadow != nullptr,
                     "%s: symmetric memory windows are stock NCCL's (CUDA memory mapped across "
                     "the ranks' GPUs), and this communicator's device memory is served by %s",
                     fn, comm->deviceServer.c_str());
    auto reg = loom::api::stockEntry(comm->shadow->lib(), &StockApi::commWindowRegister,
                                     "ncclCommWindowRegister", fn);
    return nowOrAtGroupEnd(comm, fn, [=] {
      ncclWindow_t w = nullptr;
      loom::api::checkStock(comm, reg(comm->shadow->stockComm(), buff, size, &w, winFlags), fn);
      loom::api::noteStockWindow(w, comm);
      *win = w;
      return ncclSuccess;
    });
  });
}

LOOM_NCCL_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  const char* fn = "ncclCommWindowDeregister";
  return guard(fn, comm, [&] {
    loom::api::checkCommForManagement(comm, fn);
    LOOM_CHECK_ARG(win != nullptr, "%s: win is NULL", fn);
    LOOM_CHECK_ARG(comm->shadow && loom::api::stockWindowComm(win) == comm,
                   "%s: %p is not a window of this communicator (not registered on it, or "
                   "deregistered already)",
                   fn, static_cast<void*>(win));
    auto dereg = loom::api::stockEntry(comm->shadow->lib(), &StockApi::commWindowDeregister,
                                       "ncclCommWindowDeregister", fn);
    return nowOrAtGroupEnd(comm, fn, [=] {
      LOOM_CHECK_ARG(loom::api::takeStockWindow(win, comm),
                     "%s: %p is not a window of this communicator", fn, static_cast<void*>(win));
      loom::api::checkStock(comm, dereg(comm->shadow->stockComm(), win), fn);
      return ncclSuccess;
    });
  });
}

// ---- NCCL 2.29/2.30's window lookups: stock NCCL answers for its windows, if it has them.

namespace {

const loom::dispatch::StockNccl& stockOfWindow(ncclWindow_t win, const char* fn) {
  LOOM_CHECK_USAGE(win && loom::api::stockWindowComm(win) != nullptr,
                   "%s: window %p is not stock NCCL's: windows exist only on communicators whose "
                   "device memory stock NCCL serves (ncclCommWindowRegister)",
                   fn, static_cast<void*>(win));
  const loom::dispatch::StockNccl* lib = loom::dispatch::processStockNccl(nullptr);
  LOOM_CHECK_USAGE(lib != nullptr, "%s: no stock NCCL in this process", fn);  // made the window
  return *lib;
}

}  // namespace

LOOM_NCCL_API ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win,
                                             void** outUserPtr) {
  const char* fn = "ncclWinGetUserPtr";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    LOOM_CHECK_ARG(outUserPtr != nullptr, "%s: outUserPtr is NULL", fn);
    LOOM_CHECK_ARG(comm->shadow && loom::api::stockWindowComm(win) == comm,
                   "%s: %p is not a window of this communicator", fn, static_cast<void*>(win));
    auto get = loom::api::stockEntry(comm->shadow->lib(), &StockApi::winGetUserPtr,
                                     "ncclWinGetUserPtr", fn);
    loom::api::checkStock(comm, get(comm->shadow->stockComm(), win, outUserPtr), fn);
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t win, size_t offset,
                                                           void** outPtr) {
  const char* fn = "ncclGetLsaMultimemDevicePointer";
  return guard(fn, nullptr, [&] {
    LOOM_CHECK_ARG(outPtr != nullptr, "%s: outPtr is NULL", fn);
    const auto& lib = stockOfWindow(win, fn);
    auto get = loom::api::stockEntry(lib, &StockApi::getLsaMultimemDevicePointer, fn, fn);
    if (ncclResult_t rc = get(win, offset, outPtr); rc != ncclSuccess)
      loom::throwError(static_cast<loom::Code>(rc), "%s (served by stock NCCL): %s", fn,
                       lib.errorText(rc, nullptr).c_str());
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t win, size_t offset, int peer,
                                                    void** outPtr) {
  const char* fn = "ncclGetPeerDevicePointer";
  return guard(fn, nullptr, [&] {
    LOOM_CHECK_ARG(outPtr != nullptr, "%s: outPtr is NULL", fn);
    const auto& lib = stockOfWindow(win, fn);
    auto get = loom::api::stockEntry(lib, &StockApi::getPeerDevicePointer, fn, fn);
    if (ncclResult_t rc = get(win, offset, peer, outPtr); rc != ncclSuccess)
      loom::throwError(static_cast<loom::Code>(rc), "%s (served by stock NCCL): %s", fn,
                       lib.errorText(rc, nullptr).c_str());
    return ncclSuccess;
  });
}

// The pncclX profiling names (nccl.h declares both for 2.28.9's; NCCL exports both).
LOOM_NCCL_PROFILING_ALIAS(ncclCommRegister);
LOOM_NCCL_PROFILING_ALIAS(ncclCommDeregister);
LOOM_NCCL_PROFILING_ALIAS(ncclCommWindowRegister);
LOOM_NCCL_PROFILING_ALIAS(ncclCommWindowDeregister);
LOOM_NCCL_PROFILING_ALIAS(ncclWinGetUserPtr);
LOOM_NCCL_PROFILING_ALIAS(ncclGetLsaMultimemDevicePointer);
LOOM_NCCL_PROFILING_ALIAS(ncclGetPeerDevicePointer);
