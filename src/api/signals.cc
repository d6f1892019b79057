// NCCL 2.29/2.30's one-sided calls through symmetric memory windows: ncclPutSignal,
// ncclSignal, ncclWaitSignal. Windows are stock NCCL's (registration.cc), so these are too:
// where a shadow communicator serves the communicator's device memory and stock NCCL has
// them, they are handed to it with its communicator, on the caller's stream (inside a group
// in the stock group the group's end closes: stock_route.h's runOnStock). Elsewhere they
// are ncclInvalidUsage saying why.
#include <nccl.h>

#include "api/comm.h"
#include "api/group.h"
#include "api/guard.h"
#include "api/stock_route.h"
#include "dispatch/nccl_extra_abi.h"

using loom::api::guard;
using loom::dispatch::StockApi;

namespace {

const loom::dispatch::StockNccl& stockOf(ncclComm_t comm, const char* fn) {
  loom::api::checkComm(comm, fn);
  LOOM_CHECK_USAGE(comm->shadow != nullptr,
                   "%s: one-sided calls go through symmetric memory windows, which are stock "
                   "NCCL's, and this communicator's device memory is served by %s",
                   fn, comm->deviceServer.c_str());
  return comm->shadow->lib();
}

void checkPeer(ncclComm_t comm, int peer, const char* fn) {
  LOOM_CHECK_ARG(peer >= 0 && peer < comm->nranks, "%s: peer %d is not a rank of this %d-rank "
                 "communicator", fn, peer, comm->nranks);
}

}  // namespace

LOOM_NCCL_API ncclResult_t ncclPutSignal(const void* localbuff, size_t count,
                                         ncclDataType_t datatype, int peer, ncclWindow_t peerWin,
                                         size_t peerWinOffset, int sigIdx, int ctx,
                                         unsigned int flags, ncclComm_t comm,
                                         cudaStream_t stream) {
  const char* fn = "ncclPutSignal";
  return guard(fn, comm, [&] {
    const auto& lib = stockOf(comm, fn);
    checkPeer(comm, peer, fn);
    LOOM_CHECK_ARG(localbuff != nullptr || count == 0, "%s: localbuff is NULL", fn);
    LOOM_CHECK_ARG(peerWin != nullptr && loom::api::stockWindowComm(peerWin) == comm,
                   "%s: window %p is not a window of this communicator", fn,
                   static_cast<void*>(peerWin));
    auto put = loom::api::stockEntry(lib, &StockApi::putSignal, fn);
    loom::api::runOnStock(comm, fn, [&](ncclComm_t stock) {
      return put(localbuff, count, datatype, peer, peerWin, peerWinOffset, sigIdx, ctx, flags,
                 stock, stream);
    });
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags,
                                      ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclSignal";
  return guard(fn, comm, [&] {
    const auto& lib = stockOf(comm, fn);
    checkPeer(comm, peer, fn);
    auto sig = loom::api::stockEntry(lib, &StockApi::signal, fn);
    loom::api::runOnStock(comm, fn, [&](ncclComm_t stock) {
      return sig(peer, sigIdx, ctx, flags, stock, stream);
    });
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc* signalDescs,
                                          ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclWaitSignal";
  return guard(fn, comm, [&] {
    const auto& lib = stockOf(comm, fn);
    LOOM_CHECK_ARG(nDesc >= 0 && (nDesc == 0 || signalDescs != nullptr),
                   "%s: %d descriptors at %p", fn, nDesc, static_cast<void*>(signalDescs));
    auto wait = loom::api::stockEntry(lib, &StockApi::waitSignal, fn);
    loom::api::runOnStock(comm, fn, [&](ncclComm_t stock) {
      return wait(nDesc, signalDescs, stock, stream);
    });
    return ncclSuccess;
  });
}

LOOM_NCCL_PROFILING_ALIAS(ncclPutSignal);
LOOM_NCCL_PROFILING_ALIAS(ncclSignal);
LOOM_NCCL_PROFILING_ALIAS(ncclWaitSignal);
