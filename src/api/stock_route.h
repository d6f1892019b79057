// Calls beside the collectives that Loom hands to stock NCCL where a shadow communicator
// serves a communicator's device memory (dispatch/shadow.h): buffer registration, symmetric
// memory windows and the one-sided calls through them, the device API's host half, NCCL
// 2.30's memory calls, and ncclMemAlloc's memory. Stock NCCL's own
// handles (registrations, windows) are what the caller gets back; Loom remembers which they
// are, so that the calls that take them back go to the library that made them.
#pragma once

#include <nccl.h>

#include <string>

#include "api/comm.h"
#include "api/group.h"
#include "base/error.h"
#include "dispatch/stock_nccl.h"

namespace loom::api {

// Stock NCCL's entry point `member` for the call `fn` (its own name), or throws
// kInvalidUsage naming it: the stock library in use predates it.
template <class F>
F stockEntry(const dispatch::StockNccl& lib, F dispatch::StockApi::*member, const char* fn) {
  F f = lib.api().*member;
  if (!f)
    throwError(Code::kInvalidUsage,
               "%s: stock NCCL %d (%s), which serves this communicator's device memory, has no "
               "%s (too old for it)",
               fn, lib.version(), lib.path().c_str(), fn);
  return f;
}

// Throws stock's result `rc` of `fn` on `comm` (after a non-blocking shadow settles an
// ncclInProgress) with stock's own message; returns when it succeeded.
void checkStock(ncclComm_t comm, ncclResult_t rc, const char* fn);

// The same for a call that takes no communicator, on the process's stock library `lib`.
void checkStockCommless(const dispatch::StockNccl& lib, ncclResult_t rc, const char* fn);

// For a call made inside a group (joined to the stock group, api/group.h): success and
// ncclInProgress pass (stock NCCL finishes it at the group's end); a failure throws.
void checkStockQueued(ncclComm_t comm, ncclResult_t rc, const char* fn);

// `fn` on `comm`'s shadow communicator: stock's `member` called now with `args` after the
// communicator, its failure thrown with stock's message.
template <class F, class... Args>
void callStock(ncclComm_t comm, const char* fn, F dispatch::StockApi::*member, Args... args) {
  F f = stockEntry(comm->shadow->lib(), member, fn);
  checkStock(comm, f(comm->shadow->stockComm(), args...), fn);
}

// `call(stockComm)`, a stock call of `fn` on `comm`'s shadow communicator, made now; inside
// a group it joins the stock group that the group's end closes (api/group.h), as NCCL defers
// such calls to its group's end. Its failure thrown with stock's message.
template <class Call>
void runOnStock(ncclComm_t comm, const char* fn, Call call) {
  if (!inGroup()) return checkStock(comm, call(comm->shadow->stockComm()), fn);
  joinStockGroup(comm);
  checkStockQueued(comm, call(comm->shadow->stockComm()), fn);
}

// runOnStock of stock's `member`, which takes the communicator first and `args` after it.
template <class F, class... Args>
void callStockOrJoinGroup(ncclComm_t comm, const char* fn, F dispatch::StockApi::*member,
                          Args... args) {
  F f = stockEntry(comm->shadow->lib(), member, fn);
  runOnStock(comm, fn, [&](ncclComm_t stock) { return f(stock, args...); });
}

// `fn`, which takes no communicator, on the process's stock library `lib`.
template <class F, class... Args>
void callStockCommless(const dispatch::StockNccl& lib, const char* fn,
                       F dispatch::StockApi::*member, Args... args) {
  checkStockCommless(lib, stockEntry(lib, member, fn)(args...), fn);
}

// Symmetric memory windows that stock NCCL made for a Loom communicator.
void noteStockWindow(ncclWindow_t win, ncclComm_t comm);
// Forgets `win` if `comm` made it; false if it is not a window of `comm`.
bool takeStockWindow(ncclWindow_t win, ncclComm_t comm);
// The communicator whose stock NCCL window `win` is, or nullptr.
ncclComm_t stockWindowComm(ncclWindow_t win);
// At `comm`'s destruction (stock NCCL frees its windows with its communicator).
void forgetStockWindowsOf(ncclComm_t comm);

// What ncclMemAlloc allocated through stock NCCL (which must free it).
void noteStockAllocation(const void* ptr);
// Forgets `ptr`; false if stock NCCL did not allocate it.
bool takeStockAllocation(const void* ptr);

// Live communicators of this process whose device memory on CUDA device `dev` Loom serves
// (no shadow): ncclMemAlloc then keeps to cuMemAlloc, whose memory CUDA IPC can share
// between processes on one GPU (stock NCCL's cuMem memory cannot be).
void countLoomServedDevice(int dev, int delta);
bool loomServesDevice(int dev);

}  // namespace loom::api
