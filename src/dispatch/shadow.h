// A shadow communicator: stock NCCL's communicator beside Loom's, over the same ranks,
// serving the calls that the routing rule hands to stock NCCL (device memory, when the
// fallback decision says so).
//
// Created collectively over Loom's bootstrap: the ranks exchange what they have, decide
// alike (fallback.h), rank 0 takes stock NCCL's unique id and hands it to the others, every
// rank creates its stock communicator (non-blocking, so an abort or a deadline ends the
// wait), and the ranks exchange the outcome: either every rank has a shadow or none does.
#pragma once

#include <nccl.h>

#include <atomic>
#include <memory>
#include <string>

#include "algo/collective.h"
#include "bootstrap/bootstrap.h"
#include "dispatch/fallback.h"
#include "dispatch/stock_nccl.h"

namespace loom::dispatch {

// One call, with the arguments of its NCCL entry point.
struct StockCall {
  Collective coll;
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  ncclDataType_t dtype;
  ncclRedOp_t op;  // stock NCCL's operator (a user operator already translated)
  int root;        // root, or peer for send/recv
  bool isSend;
  bool isRecv;
  cudaStream_t stream;
};

class Shadow {
 public:
  ~Shadow();  // ncclCommDestroy, unless abort() ran
  Shadow(const Shadow&) = delete;
  Shadow& operator=(const Shadow&) = delete;

  const StockNccl& lib() const { return lib_; }
  ncclComm_t stockComm() const { return comm_; }

  // Issues one call on stock NCCL; its result, with stock's message in `msg` on failure.
  ncclResult_t run(const StockCall& c, std::string* msg);
  ncclResult_t finalize(std::string* msg);
  void abort();                // ncclCommAbort: for Loom's abort; no peer is waited for
  ncclResult_t asyncError();   // stock's ncclCommGetAsyncError

  // Waits while stock answers ncclInProgress (its non-blocking communicators do), until it
  // settles or the communicator is aborted or revoked.
  ncclResult_t settle(ncclResult_t rc);

 private:
  friend struct ShadowFactory;
  Shadow(const StockNccl& lib, ncclComm_t comm, const std::atomic<bool>* abortFlag,
         const std::atomic<bool>* revoked)
      : lib_(lib), comm_(comm), abort_(abortFlag), revoked_(revoked) {}
  bool stopped() const {
    return (abort_ && abort_->load()) || (revoked_ && revoked_->load());
  }
  const StockNccl& lib_;
  ncclComm_t comm_;
  const std::atomic<bool>* abort_;
  const std::atomic<bool>* revoked_;
  bool aborted_ = false;
};

struct FallbackSetup {
  FallbackDecision decision;       // what the ranks decided, and why
  std::unique_ptr<Shadow> shadow;  // set on every rank or on none
  std::vector<RankFallbackInfo> ranks;  // what every rank said of its device
};

// Collective: every rank of `bs` calls it after Loom's own init. `cudaDev` is this rank's
// device (-1: none), `hostHash` its host; `abortFlag` and `revoked` are the communicator's;
// `wantsKernel` travels in this rank's RankFallbackInfo. `userConfig` (may be null) is the
// caller's ncclConfig_t, userConfig->size bytes of it (at least NCCL 2.28.9's): stock NCCL's
// communicator is made with it (CTA limits, CGA cluster size, network, traffic class, name,
// a newer NCCL's fields ...), non-blocking whatever it says.
// Throws on every rank alike when LOOM_NCCL_FALLBACK=force cannot be honoured or a rank's
// knob is malformed; with auto, a failed shadow leaves `shadow` null and says why in
// `decision.why`. The calling thread's current CUDA device is as it was on return.
FallbackSetup setUpFallback(Bootstrap& bs, int cudaDev, uint64_t hostHash,
                            const std::atomic<bool>* abortFlag, const std::atomic<bool>* revoked,
                            bool wantsKernel = false, const ncclConfig_t* userConfig = nullptr);

}  // namespace loom::dispatch
