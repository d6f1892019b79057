// NCCL 2.29/2.30's calls about a communicator's GPU memory: ncclCommMemStats,
// ncclCommSuspend and ncclCommResume. Programs built against a newer NCCL import them
// (torch 2.15, built with NCCL 2.30.7, imports 11 calls newer than 2.28.9, the API Loom
// implements), and Loom exports every such call so that under LD_PRELOAD none binds to a
// stock libnccl.so.2 loaded beside it, which would be handed Loom's communicators. These
// are stock NCCL's where it serves the communicator's device memory, else fail with
// ncclInvalidUsage naming the call and why; a communicator Loom did not make is not touched
// (it may be another library's). The others: windows (registration.cc, signals.cc) and
// growing a communicator (grow.cc).
#include <nccl.h>

#include <cstdint>

#include "api/comm.h"
#include "api/guard.h"
#include "api/stock_route.h"
#include "base/error.h"

namespace {

ncclResult_t newer(const char* fn, const char* what) {
  return loom::api::guard(fn, nullptr, [&]() -> ncclResult_t {
    LOOM_CHECK_USAGE(false, "%s (%s) came with NCCL 2.29/2.30; Loom implements NCCL 2.28.9's "
                     "API, where it does not exist", fn, what);
    return ncclSuccess;
  });
}

}  // namespace

// About stock NCCL's GPU memory: its own where a shadow communicator serves the
// communicator's device memory and its version has the call. A communicator Loom did not
// make is not touched (it may be another library's).
namespace {

template <class F, class... Args>
ncclResult_t onStockOrNewer(const char* fn, const char* what, ncclComm_t comm, bool argsOk,
                            F loom::dispatch::StockApi::*member, Args... args) {
  if (!comm || !loom::api::isLiveComm(comm)) return newer(fn, what);
  return loom::api::guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    LOOM_CHECK_ARG(argsOk, "%s: an output pointer is NULL", fn);
    F f = comm->shadow ? comm->shadow->lib().api().*member : nullptr;
    LOOM_CHECK_USAGE(f != nullptr,
                     "%s (%s) came with NCCL 2.29/2.30; Loom implements NCCL 2.28.9's API and "
                     "hands it only to a stock NCCL that has it and serves the communicator's "
                     "device memory, which here is served by %s",
                     fn, what, comm->deviceServer.c_str());
    loom::api::checkStock(comm, f(comm->shadow->stockComm(), args...), fn);
    return ncclSuccess;
  });
}

}  // namespace

LOOM_NCCL_API ncclResult_t ncclCommMemStats(ncclComm_t comm, int stat, uint64_t* value) {
  return onStockOrNewer("ncclCommMemStats", "GPU memory statistics", comm, value != nullptr,
                        &loom::dispatch::StockApi::commMemStats, stat, value);
}
LOOM_NCCL_API ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  return onStockOrNewer("ncclCommSuspend", "releasing a communicator's GPU memory", comm, true,
                        &loom::dispatch::StockApi::commSuspend, flags);
}
LOOM_NCCL_API ncclResult_t ncclCommResume(ncclComm_t comm) {
  return onStockOrNewer("ncclCommResume", "restoring a suspended communicator", comm, true,
                        &loom::dispatch::StockApi::commResume);
}

LOOM_NCCL_PROFILING_ALIAS(ncclCommMemStats);
LOOM_NCCL_PROFILING_ALIAS(ncclCommSuspend);
LOOM_NCCL_PROFILING_ALIAS(ncclCommResume);
