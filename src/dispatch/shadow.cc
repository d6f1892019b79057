#include "dispatch/shadow.h"

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/cuda_driver.h"
#include "base/error.h"
#include "base/log.h"

namespace loom::dispatch {
namespace {

IntKnob kInitTimeout("LOOM_NCCL_FALLBACK_INIT_TIMEOUT", "", 90,
                     "Seconds a rank waits for stock NCCL to create its shadow communicator "
                     "before the fallback is given up");

// Rank 0's stock unique id, or why it has none. Exchanged as bytes.
struct IdMessage {
  int32_t rc;
  char id[NCCL_UNIQUE_ID_BYTES];
  char msg[252];
};
// Each rank's outcome of creating its stock communicator.
struct InitOutcome {
  int32_t rc;
  char msg[252];
};

void copyText(char* dst, size_t cap, const std::string& s) {
  size_t n = std::min(cap - 1, s.size());
  memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

// This rank's description. The mode is read here: a malformed one is described, not
// thrown, so that every rank learns of it. The rank's device is made current on this
// thread (`device`) for stock NCCL's init; a rank that cannot is described as having none.
RankFallbackInfo localInfo(int cudaDev, uint64_t hostHash, cuda::ScopedDevice* device) {
  RankFallbackInfo info;
  info.hostHash = hostHash;
  FallbackMode mode = FallbackMode::kOff;
  try {
    mode = fallbackMode();
    info.mode = static_cast<uint8_t>(mode);
  } catch (const Error& e) {
    LOOM_WARN("%s", e.what());
    info.mode = kInvalidMode;
  }
  // No driver (ncclCommInitAll names devices without one), no device, or the fallback
  // off: stock NCCL could serve nothing here, and is not even opened.
  info.cudaDev = cuda::driver() ? cudaDev : -1;
  const bool wanted = info.mode == static_cast<uint8_t>(FallbackMode::kAuto) ||
                      info.mode == static_cast<uint8_t>(FallbackMode::kForce);
  if (info.cudaDev < 0 || !wanted) return info;
  std::string why;
  if (!device->set(cudaDev, &why)) {
    LOOM_WARN("the fallback cannot make CUDA device %d current: %s", cudaDev, why.c_str());
    info.cudaDev = -1;
    return info;
  }
  if (const StockNccl* lib = processStockNccl(&why)) info.stockVersion = lib->version();
  else LOOM_INFO(kLogInit, "no stock NCCL for the fallback: %s", why.c_str());
  if (cuda::deviceUuid(cudaDev, info.uuid)) info.hasUuid = 1;
  return info;
}

using Clock = std::chrono::steady_clock;

}  // namespace

struct ShadowFactory {
  // This rank's part of creating the shadows (its device already current); the outcome
  // says how it went, whatever happens, so that the ranks can compare outcomes.
  static std::unique_ptr<Shadow> create(const StockNccl& lib, const IdMessage& id, int rank,
                                        int nranks, const std::atomic<bool>* abortFlag,
                                        const std::atomic<bool>* revoked,
                                        const ncclConfig_t* userConfig, InitOutcome* out) {
    out->rc = ncclSuccess;
    out->msg[0] = '\0';
    try {
      return createOrSay(lib, id, rank, nranks, abortFlag, revoked, userConfig, out);
    } catch (const std::exception& e) {
      out->rc = ncclInternalError;
      copyText(out->msg, sizeof(out->msg), e.what());
      return nullptr;
    }
  }

  static std::unique_ptr<Shadow> createOrSay(const StockNccl& lib, const IdMessage& id,
                                             int rank, int nranks,
                                             const std::atomic<bool>* abortFlag,
                                             const std::atomic<bool>* revoked,
                                             const ncclConfig_t* userConfig, InitOutcome* out) {
    if (id.rc != ncclSuccess) {
      out->rc = id.rc;
      copyText(out->msg, sizeof(out->msg), std::string("rank 0: ") + id.msg);
      return nullptr;
    }
    ncclUniqueId uid;
    memcpy(uid.internal, id.id, sizeof(uid.internal));
    // The caller's config as given, every byte (a newer stock NCCL reads fields Loom does
    // not know), non-blocking so that an abort or the deadline can end the wait.
    const ncclConfig_t defaults = NCCL_CONFIG_INITIALIZER;
    const ncclConfig_t* from = userConfig ? userConfig : &defaults;
    std::vector<unsigned char> bytes(std::max(from->size, sizeof(ncclConfig_t)));
    memcpy(bytes.data(), from, from->size);
    auto* config = reinterpret_cast<ncclConfig_t*>(bytes.data());
    config->blocking = 0;
    // Before NCCL 2.14 a config had no `blocking`, and stock NCCL would ignore it.
    config->version = std::max(config->version, static_cast<unsigned>(NCCL_VERSION(2, 14, 0)));
    ncclComm_t comm = nullptr;
    ncclResult_t rc = lib.api().commInitRankConfig(&comm, nranks, uid, rank, config);
    std::unique_ptr<Shadow> s;
    if (comm) s.reset(new Shadow(lib, comm, abortFlag, revoked));
    const auto deadline = Clock::now() + std::chrono::seconds(kInitTimeout.get());
    while (rc == ncclInProgress && s) {
      if (s->stopped()) {
        out->rc = ncclInvalidUsage;
        copyText(out->msg, sizeof(out->msg), "the communicator was aborted or revoked");
        s->abort();
        return nullptr;
      }
      if (Clock::now() > deadline) {
        out->rc = ncclSystemError;
        copyText(out->msg, sizeof(out->msg),
                 strprintf("stock ncclCommInitRankConfig did not finish within "
                           "LOOM_NCCL_FALLBACK_INIT_TIMEOUT=%lld s",
                           static_cast<long long>(kInitTimeout.get())));
        s->abort();
        return nullptr;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      rc = s->asyncError();
    }
    if (rc != ncclSuccess) {
      out->rc = rc;
      copyText(out->msg, sizeof(out->msg), lib.errorText(rc, s ? s->comm_ : nullptr));
      if (s) s->abort();
      return nullptr;
    }
    return s;
  }
};

Shadow::~Shadow() {
  if (aborted_) return;
  // Finalizes first when that was not done (stock NCCL does it inside), then frees: the
  // handle is gone afterwards, so an "in progress" answer is not polled.
  ncclResult_t rc = lib_.api().commDestroy(comm_);
  if (rc != ncclSuccess && rc != ncclInProgress)
    LOOM_WARN("stock ncclCommDestroy of shadow communicator %p: %s",
              static_cast<void*>(comm_), lib_.errorText(rc, nullptr).c_str());
}

ncclResult_t Shadow::settle(ncclResult_t rc) {
  while (rc == ncclInProgress) {
    if (stopped()) return ncclInvalidUsage;
    std::this_thread::yield();
    rc = asyncError();
  }
  return rc;
}

ncclResult_t Shadow::asyncError() {
  ncclResult_t e = ncclSuccess;
  ncclResult_t rc = lib_.api().commGetAsyncError(comm_, &e);
  return rc != ncclSuccess ? rc : e;
}

void Shadow::abort() {
  if (aborted_) return;
  aborted_ = true;
  lib_.api().commAbort(comm_);
}

ncclResult_t Shadow::finalize(std::string* msg) {
  if (!lib_.api().commFinalize) return ncclSuccess;  // older stock: destroy flushes
  ncclResult_t rc = settle(lib_.api().commFinalize(comm_));
  if (rc != ncclSuccess) *msg = lib_.errorText(rc, comm_);
  return rc;
}

ncclResult_t Shadow::run(const StockCall& c, std::string* msg) {
  const StockApi& a = lib_.api();
  ncclResult_t rc;
  if (c.isSend) {
    rc = a.send(c.sendbuff, c.count, c.dtype, c.root, comm_, c.stream);
  } else if (c.isRecv) {
    rc = a.recv(c.recvbuff, c.count, c.dtype, c.root, comm_, c.stream);
  } else {
    switch (c.coll) {
      case Collective::kAllReduce:
        rc = a.allReduce(c.sendbuff, c.recvbuff, c.count, c.dtype, c.op, comm_, c.stream);
        break;
      case Collective::kBroadcast:
        rc = a.broadcast(c.sendbuff, c.recvbuff, c.count, c.dtype, c.root, comm_, c.stream);
        break;
      case Collective::kReduce:
        rc = a.reduce(c.sendbuff, c.recvbuff, c.count, c.dtype, c.op, c.root, comm_, c.stream);
        break;
      case Collective::kAllGather:
        rc = a.allGather(c.sendbuff, c.recvbuff, c.count, c.dtype, comm_, c.stream);
        break;
      case Collective::kReduceScatter:
        rc = a.reduceScatter(c.sendbuff, c.recvbuff, c.count, c.dtype, c.op, comm_, c.stream);
        break;
      default:  // all-to-all, gather and scatter arrive as their sends and receives
        *msg = strprintf("collective %d has no stock NCCL call", static_cast<int>(c.coll));
        return ncclInternalError;
    }
  }
  rc = settle(rc);
  if (rc != ncclSuccess) *msg = lib_.errorText(rc, comm_);
  return rc;
}

FallbackSetup setUpFallback(Bootstrap& bs, int cudaDev, uint64_t hostHash,
                            const std::atomic<bool>* abortFlag, const std::atomic<bool>* revoked,
                            bool wantsKernel, const ncclConfig_t* userConfig) {
  const int rank = bs.rank(), nranks = bs.nranks();
  FallbackSetup out;
  cuda::ScopedDevice device;  // this thread's device is put back on return
  std::vector<RankFallbackInfo> infos(nranks);
  infos[rank] = localInfo(cudaDev, hostHash, &device);
  infos[rank].wantsKernel = wantsKernel ? 1 : 0;
  bs.allGather(infos.data(), sizeof(RankFallbackInfo));
  out.decision = decideFallback(infos);
  out.ranks = infos;
  if (out.decision.fail)
    throw Error(out.decision.badKnob ? Code::kInvalidArgument : Code::kInvalidUsage,
                out.decision.why);
  if (!out.decision.useStock) return out;
  const auto mode = static_cast<FallbackMode>(infos[0].mode);

  const StockNccl& lib = *processStockNccl(nullptr);  // every rank has one: decided above
  std::vector<IdMessage> ids(nranks);
  if (rank == 0) {
    ncclUniqueId uid;
    IdMessage& m = ids[0];
    const ncclResult_t rc = lib.api().getUniqueId(&uid);
    m.rc = rc;
    memcpy(m.id, uid.internal, sizeof(m.id));
    copyText(m.msg, sizeof(m.msg),
             rc == ncclSuccess ? "" : "stock ncclGetUniqueId: " + lib.errorText(rc, nullptr));
  }
  bs.allGather(ids.data(), sizeof(IdMessage));
  std::vector<InitOutcome> outcomes(nranks);
  std::unique_ptr<Shadow> shadow =
      ShadowFactory::create(lib, ids[0], rank, nranks, abortFlag, revoked, userConfig,
                            &outcomes[rank]);
  bs.allGather(outcomes.data(), sizeof(InitOutcome));
  for (int r = 0; r < nranks; ++r) {
    if (outcomes[r].rc == ncclSuccess) continue;
    if (shadow) shadow->abort();  // a peer has none: nobody keeps one
    std::string why = strprintf("stock NCCL (%s) could not create its communicator on rank %d: "
                                "%s", lib.path().c_str(), r, outcomes[r].msg);
    if (mode == FallbackMode::kForce)
      throw Error(static_cast<Code>(outcomes[r].rc), "LOOM_NCCL_FALLBACK=force, but " + why);
    out.decision.useStock = false;
    out.decision.why = "LOOM_NCCL_FALLBACK=auto, but " + why;
    LOOM_WARN("%s; device buffers are not served on this communicator",
              out.decision.why.c_str());
    return out;
  }
  out.shadow = std::move(shadow);
  return out;
}

}  // namespace loom::dispatch
