// Communicator creation and teardown entry points.
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "api/comm.h"
#include "api/group.h"
#include "api/guard.h"
#include "api/init.h"
#include "api/kept_config.h"
#include "api/mgmt_job.h"
#include "base/config.h"
#include "base/cuda_driver.h"
#include "base/log.h"
#include "bootstrap/root.h"
#include "loom/version_gen.h"

using loom::api::callerDevice;
using loom::api::checkInitArgs;
using loom::api::guard;
using loom::api::startInit;

namespace {

constexpr uint32_t kTagSplit = 0x30000000u;
constexpr uint32_t kTagShrink = 0x30000001u;

void logVersionOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    LOOM_LOG(kVersion, loom::kLogInit, "NCCL version %d.%d.%d+loom%s", NCCL_MAJOR, NCCL_MINOR,
             NCCL_PATCH, LOOM_VERSION_STRING);
    // NCCL tuning a job carries over that Loom's own paths ignore: said once, so that a
    // setting that does nothing is not mistaken for one that does.
    // (environ is walked only when the line would be logged: another thread's setenv may
    // reallocate it meanwhile.)
    if (!loom::logEnabled(loom::LogLevel::kInfo, loom::kLogInit | loom::kLogEnv)) return;
    std::string unread;
    for (const std::string& v : loom::unreadNcclVariables()) unread += (unread.empty() ? "" : ", ") + v;
    if (!unread.empty())
      LOOM_INFO(loom::kLogInit | loom::kLogEnv,
                "not read by Loom: %s (NCCL's; a stock NCCL serving device buffers reads them; "
                "`loom-info` lists what Loom reads)", unread.c_str());
  });
}

// Applies a user config onto comm, by NCCL's rules for its size/magic/version header: a
// config from older headers is shorter (the fields it lacks keep their defaults), one from
// newer headers longer (the fields after NCCL 2.28.9's are not read, as an older NCCL does
// not read them). The whole config is kept for stock NCCL's shadow (api/kept_config.h).
void applyConfig(ncclComm_t comm, const ncclConfig_t* config, const char* fn) {
  if (!config) return;
  loom::api::KeptConfig kept(config, fn);
  const ncclConfig_t c = kept.fields();
  if (c.blocking != NCCL_CONFIG_UNDEF_INT) comm->blocking = c.blocking == 1;
  if (c.commName) comm->commName = c.commName;
  // They bound the channels as NCCL_MIN_CTAS / NCCL_MAX_CTAS do, which override them
  // (algo/select.h); checked when kept.
  comm->configMinCtas = kept.minCtas();
  comm->configMaxCtas = kept.maxCtas();
  comm->config = kept;
}

// With NCCL_COMM_ID, rank 0 runs the root at the given address.
void maybeStartEnvRoot(loom::JobId& job, int rank) {
  loom::JobId env;
  if (rank == 0 && loom::commIdFromEnv(&env) && env.root.str() == job.root.str())
    loom::startRoot(job);
}

}  // namespace

namespace loom::api {

ncclResult_t startInit(ncclComm_t* out, int nranks, const JobId& job, int rank,
                       const ncclConfig_t* config, const char* fn, int cudaDev) {
  auto comm = std::make_unique<ncclComm>();
  comm->rank = rank;
  comm->nranks = nranks;
  comm->job = job;
  comm->cudaDev = cudaDev;
  applyConfig(comm.get(), config, fn);
  comm->asyncError.store(ncclInProgress);
  ncclComm_t c = comm.release();
  loom::api::registerComm(c);
  // From here on this is a call of c: once the handle is published, another thread may
  // ncclCommAbort it, and the abort frees c only after this thread is done with it (for a
  // non-blocking init, once the init thread is set, which the abort then joins).
  std::optional<loom::api::CallScope> scope;
  scope.emplace(c);
  const bool blocking = c->blocking;
  // Atomically: another thread may watch *out for the handle, to abort a blocking init.
  std::atomic_ref<ncclComm_t>(*out).store(c, std::memory_order_release);
  if (loom::api::inGroup()) {
    loom::api::deferInit(c);
    return ncclSuccess;
  }
  // A non-blocking parent's job (api/mgmt_job.h) runs its new communicator's init itself,
  // as one with it: ended by an abort of the parent too.
  ncclComm_t jobParent = loom::api::jobParentOfThisThread();
  if (!blocking && !jobParent) {
    c->initThread = std::thread([c] { c->runInit(); });
    return ncclInProgress;
  }
  if (jobParent) {
    std::lock_guard<std::mutex> lock(jobParent->initMu);
    jobParent->childInInit = c;
    if (jobParent->abortFlag.load()) c->abortFlag.store(true);
  }
  c->runInit();
  if (jobParent) {
    std::lock_guard<std::mutex> lock(jobParent->initMu);
    jobParent->childInInit = nullptr;
  }
  const auto rc = static_cast<ncclResult_t>(c->asyncError.load());
  std::string msg;
  bool mine = false;
  if (rc != ncclSuccess) {
    std::lock_guard<std::mutex> lock(c->errMu);
    msg = c->lastError;
    mine = !c->teardown.exchange(true);  // else an abort is freeing it
  }
  scope.reset();
  if (rc != ncclSuccess) {
    if (mine) loom::api::destroyComm(c);
    std::atomic_ref<ncclComm_t>(*out).store(nullptr, std::memory_order_release);
    throw loom::Error(static_cast<loom::Code>(rc), msg);
  }
  return ncclSuccess;
}

int callerDevice() { return loom::cuda::currentDevice(); }

void checkInitArgs(ncclComm_t* comm, int nranks, int rank, const char* fn) {
  LOOM_CHECK_ARG(comm != nullptr, "%s: comm (output pointer) is NULL", fn);
  std::atomic_ref<ncclComm_t>(*comm).store(nullptr, std::memory_order_release);
  LOOM_CHECK_ARG(nranks >= 1, "%s: nranks=%d must be at least 1", fn, nranks);
  LOOM_CHECK_ARG(rank >= 0 && rank < nranks, "%s: rank=%d is out of range [0, %d)", fn, rank,
                 nranks);
}

}  // namespace loom::api

LOOM_NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  return guard("ncclGetUniqueId", nullptr, [&] {
    LOOM_CHECK_ARG(uniqueId != nullptr, "ncclGetUniqueId: uniqueId is NULL");
    logVersionOnce();
    bool fixed = false;
    loom::JobId job = loom::newJobId(&fixed);
    if (!fixed) loom::startRoot(job);
    job.encode(uniqueId->internal);
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                                  int rank, ncclConfig_t* config) {
  return guard("ncclCommInitRankConfig", nullptr, [&] {
    checkInitArgs(comm, nranks, rank, "ncclCommInitRankConfig");
    logVersionOnce();
    loom::JobId job = loom::JobId::decode(commId.internal);
    maybeStartEnvRoot(job, rank);
    return startInit(comm, nranks, job, rank, config, "ncclCommInitRankConfig", callerDevice());
  });
}

LOOM_NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                            int rank) {
  return guard("ncclCommInitRank", nullptr, [&] {
    checkInitArgs(comm, nranks, rank, "ncclCommInitRank");
    logVersionOnce();
    loom::JobId job = loom::JobId::decode(commId.internal);
    maybeStartEnvRoot(job, rank);
    return startInit(comm, nranks, job, rank, nullptr, "ncclCommInitRank", callerDevice());
  });
}

LOOM_NCCL_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank,
                                                    int nId, ncclUniqueId* commIds,
                                                    ncclConfig_t* config) {
  return guard("ncclCommInitRankScalable", nullptr, [&] {
    checkInitArgs(newcomm, nranks, myrank, "ncclCommInitRankScalable");
    LOOM_CHECK_ARG(nId >= 1 && nId <= nranks,
                   "ncclCommInitRankScalable: nId=%d must be in [1, nranks=%d]", nId, nranks);
    LOOM_CHECK_ARG(commIds != nullptr, "ncclCommInitRankScalable: commIds is NULL");
    logVersionOnce();
    // Every rank holds the same ordered list; the first id's root serves the rendezvous.
    // (Loom's root handles thousands of ranks; the extra ids are accepted and unused.)
    loom::JobId job = loom::JobId::decode(commIds[0].internal);
    maybeStartEnvRoot(job, myrank);
    return startInit(newcomm, nranks, job, myrank, config, "ncclCommInitRankScalable",
                     callerDevice());
  });
}

LOOM_NCCL_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return guard("ncclCommInitAll", nullptr, [&] {
    LOOM_CHECK_ARG(comms != nullptr, "ncclCommInitAll: comms is NULL");
    LOOM_CHECK_ARG(ndev >= 1, "ncclCommInitAll: ndev=%d must be at least 1", ndev);
    logVersionOnce();
    bool fixed = false;
    loom::JobId job = loom::newJobId(&fixed);
    loom::startRoot(job);
    std::vector<ncclComm_t> made(ndev, nullptr);
    for (int i = 0; i < ndev; ++i) {
      auto comm = std::make_unique<ncclComm>();
      comm->rank = i;
      comm->nranks = ndev;
      comm->job = job;
      comm->cudaDev = devlist ? devlist[i] : i;
      comm->asyncError.store(ncclInProgress);
      made[i] = comm.release();
      loom::api::registerComm(made[i]);
    }
    std::vector<std::thread> threads;
    for (int i = 0; i < ndev; ++i) threads.emplace_back([c = made[i]] { c->runInit(); });
    for (auto& t : threads) t.join();
    ncclResult_t rc = ncclSuccess;
    std::string msg;
    for (int i = 0; i < ndev; ++i) {
      if (made[i]->asyncError.load() != ncclSuccess && rc == ncclSuccess) {
        rc = static_cast<ncclResult_t>(made[i]->asyncError.load());
        msg = made[i]->lastError;
      }
    }
    if (rc != ncclSuccess) {
      for (auto c : made) loom::api::destroyComm(c);
      throw loom::Error(static_cast<loom::Code>(rc), msg);
    }
    for (int i = 0; i < ndev; ++i) comms[i] = made[i];
    return ncclSuccess;
  });
}

namespace loom::api {

JobId newJobFrom(ncclComm_t parent) {
  bool fixed = false;
  JobId job = newJobId(&fixed);
  if (fixed) {
    job.root = parent->core->bootstrap().iface().addr;
    job.root.setPort(0);
  }
  startRoot(job);
  return job;
}

ncclResult_t startChild(ncclComm_t parent, ncclComm_t* newcomm, int nranks, int newRank,
                        const JobId& job, const ncclConfig_t* config, const char* fn) {
  if (config) return startInit(newcomm, nranks, job, newRank, config, fn, parent->cudaDev);
  const ncclConfig_t defaults = NCCL_CONFIG_INITIALIZER;
  KeptConfig inherited(parent->userConfig() ? parent->userConfig() : &defaults, fn);
  inherited.get()->blocking = parent->blocking ? 1 : 0;
  return startInit(newcomm, nranks, job, newRank, inherited.get(), fn, parent->cudaDev);
}

}  // namespace loom::api

namespace {

// The new communicator's job for `members` (parent ranks, in their new order): the first
// makes it and sends its id to the others point to point, so that ranks left out (dead
// ones, for a shrink) are never waited for.
loom::JobId childJob(ncclComm_t comm, const std::vector<int>& members, int newRank, uint32_t tag) {
  loom::Bootstrap& bs = comm->core->bootstrap();
  uint8_t idBytes[loom::kUniqueIdBytes];
  if (newRank == 0) {
    loom::api::newJobFrom(comm).encode(idBytes);
    for (size_t i = 1; i < members.size(); ++i) bs.send(members[i], tag, idBytes, sizeof(idBytes));
  } else {
    bs.recv(members[0], tag, idBytes, sizeof(idBytes));
  }
  return loom::JobId::decode(idBytes);
}

// The split itself, collective over the parent: colors all-gathered, then the child's job
// and init.
ncclResult_t splitNow(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                      const ncclConfig_t* config) {
  struct Entry { int color, key, rank; };
  std::vector<Entry> all(comm->nranks);
  all[comm->rank] = {color, key, comm->rank};
  comm->core->bootstrap().allGather(all.data(), sizeof(Entry));
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  std::vector<Entry> group;
  for (const Entry& e : all)
    if (e.color == color) group.push_back(e);
  std::stable_sort(group.begin(), group.end(), [](const Entry& a, const Entry& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  std::vector<int> members;
  for (const Entry& e : group) members.push_back(e.rank);
  const int newRank = static_cast<int>(std::find(members.begin(), members.end(), comm->rank) - members.begin());
  const loom::JobId job = childJob(comm, members, newRank, kTagSplit);
  return loom::api::startChild(comm, newcomm, static_cast<int>(members.size()), newRank, job,
                               config, "ncclCommSplit");
}

// The shrink: survivors only talk (point to point from the first), so excluded ranks are
// never waited for.
ncclResult_t shrinkNow(ncclComm_t comm, const std::vector<bool>& excluded, ncclComm_t* newcomm,
                       const ncclConfig_t* config, int shrinkFlags) {
  const char* fn = "ncclCommShrink";
  loom::api::waitInitOrThrow(comm, fn);
  LOOM_CHECK_USAGE(comm->core != nullptr, "%s: the communicator never finished initializing", fn);
  // NCCL_SHRINK_ABORT: operations still running on other threads stop first.
  if (shrinkFlags == NCCL_SHRINK_ABORT) comm->revoked.store(true);
  std::vector<int> survivors;
  for (int r = 0; r < comm->nranks; ++r)
    if (!excluded[r]) survivors.push_back(r);
  const int newRank = static_cast<int>(
      std::find(survivors.begin(), survivors.end(), comm->rank) - survivors.begin());
  const loom::JobId job = childJob(comm, survivors, newRank, kTagShrink);
  return loom::api::startChild(comm, newcomm, static_cast<int>(survivors.size()), newRank, job,
                               config, fn);
}

}  // namespace

LOOM_NCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                         ncclConfig_t* config) {
  return guard("ncclCommSplit", comm, [&] {
    LOOM_CHECK_ARG(newcomm != nullptr, "ncclCommSplit: newcomm is NULL");
    *newcomm = nullptr;
    LOOM_CHECK_ARG(color >= 0 || color == NCCL_SPLIT_NOCOLOR,
                   "ncclCommSplit: color=%d must be non-negative or NCCL_SPLIT_NOCOLOR", color);
    if (!loom::api::inGroup()) {
      // Allowed after ncclCommRevoke or a failure: splitting is how survivors carry on.
      loom::api::checkCommForManagement(comm, "ncclCommSplit");
      if (loom::api::runsAsJob(comm)) {
        loom::api::KeptConfig kept(config, "ncclCommSplit");  // the caller's may go
        return loom::api::startJob(comm, {{"ncclCommSplit", newcomm, [=, copy = kept](ncclComm_t* out) mutable {
          return splitNow(comm, color, key, out, copy.get());
        }, {}}});
      }
      return splitNow(comm, color, key, newcomm, config);
    }
    // Inside a group (one thread splitting the several ranks it drives, as XLA does): the
    // split runs at the group's end, beside the group's inits (its parent may be one of
    // them), each parent's calls in order on a thread of their own; *newcomm is set then.
    LOOM_CHECK_ARG(comm && loom::api::isLiveComm(comm),
                   "ncclCommSplit: comm %p is not a live communicator", static_cast<void*>(comm));
    loom::api::KeptConfig kept(config, "ncclCommSplit");  // checked now, kept for the end
    loom::api::deferCall(comm, "ncclCommSplit", newcomm, [=, copy = kept](ncclComm_t* out) mutable {
      loom::api::checkCommForManagement(comm, "ncclCommSplit");
      return splitNow(comm, color, key, out, copy.get());
    });
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList,
                                          int excludeRanksCount, ncclComm_t* newcomm,
                                          ncclConfig_t* config, int shrinkFlags) {
  const char* fn = "ncclCommShrink";
  return guard(fn, comm, [&] {
    LOOM_CHECK_ARG(newcomm != nullptr, "%s: newcomm is NULL", fn);
    *newcomm = nullptr;
    LOOM_CHECK_ARG(comm && loom::api::isLiveComm(comm), "%s: comm is not a live communicator",
                   fn);
    LOOM_CHECK_ARG(excludeRanksCount >= 0 && (excludeRanksCount == 0 || excludeRanksList),
                   "%s: bad exclude list (%d ranks at %p)", fn, excludeRanksCount,
                   static_cast<void*>(excludeRanksList));
    LOOM_CHECK_ARG(shrinkFlags == NCCL_SHRINK_DEFAULT || shrinkFlags == NCCL_SHRINK_ABORT,
                   "%s: shrinkFlags=%d (expected NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT)", fn,
                   shrinkFlags);
    std::vector<bool> excluded(comm->nranks, false);
    for (int i = 0; i < excludeRanksCount; ++i) {
      int r = excludeRanksList[i];
      LOOM_CHECK_ARG(r >= 0 && r < comm->nranks, "%s: excluded rank %d is out of range [0, %d)",
                     fn, r, comm->nranks);
      LOOM_CHECK_ARG(!excluded[r], "%s: rank %d is excluded twice", fn, r);
      excluded[r] = true;
    }
    LOOM_CHECK_USAGE(!excluded[comm->rank], "%s: rank %d excludes itself", fn, comm->rank);
    if (!loom::api::inGroup()) {
      if (!loom::api::runsAsJob(comm)) return shrinkNow(comm, excluded, newcomm, config, shrinkFlags);
      loom::api::checkCommForManagement(comm, fn);
      loom::api::KeptConfig kept(config, fn);  // the caller's may go
      return loom::api::startJob(comm, {{fn, newcomm, [=, copy = kept](ncclComm_t* out) mutable {
        return shrinkNow(comm, excluded, out, copy.get(), shrinkFlags);
      }, {}}});
    }
    // Inside a group, as a split: at the group's end, each parent's calls on a thread of
    // their own (the survivors one thread drives would otherwise wait on each other).
    loom::api::KeptConfig kept(config, fn);
    loom::api::deferCall(comm, fn, newcomm, [=, copy = kept](ncclComm_t* out) mutable {
      return shrinkNow(comm, excluded, out, copy.get(), shrinkFlags);
    });
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return guard("ncclCommFinalize", comm, [&] {
    loom::api::checkComm(comm, "ncclCommFinalize");
    // Host operations complete before their call returns: what is left to flush are the
    // staged device calls (their streams must reach them) and the calls stock NCCL serves.
    comm->core->drainStaged();
    if (comm->shadow) {
      std::string msg;
      ncclResult_t rc = comm->shadow->finalize(&msg);
      if (rc != ncclSuccess)
        loom::throwError(static_cast<loom::Code>(rc),
                         "ncclCommFinalize: stock NCCL's ncclCommFinalize failed: %s", msg.c_str());
    }
    comm->finalized = true;
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return guard("ncclCommDestroy", nullptr, [&] {
    if (!comm) return ncclSuccess;  // as NCCL: destroying NULL is a no-op
    LOOM_CHECK_ARG(loom::api::isLiveComm(comm),
                   "ncclCommDestroy: comm %p is not a live communicator (destroyed twice?)",
                   static_cast<void*>(comm));
    bool mine;
    {
      loom::api::CallScope hold(comm);
      mine = !comm->teardown.exchange(true);
    }
    LOOM_CHECK_USAGE(mine, "ncclCommDestroy: comm %p is already being destroyed or aborted",
                     static_cast<void*>(comm));
    loom::api::destroyComm(comm);
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return guard("ncclCommAbort", nullptr, [&] {
    if (!comm) return ncclSuccess;
    LOOM_CHECK_ARG(loom::api::isLiveComm(comm),
                   "ncclCommAbort: comm %p is not a live communicator",
                   static_cast<void*>(comm));
    bool mine;
    {
      loom::api::CallScope hold(comm);
      mine = !comm->teardown.exchange(true);
      {
        // Under initMu, so a thread about to wait for the init cannot miss the wake-up.
        std::lock_guard<std::mutex> lock(comm->initMu);
        comm->abortFlag.store(true);
        if (comm->childInInit) comm->childInInit->abortFlag.store(true);  // its job's
      }
      comm->initCv.notify_all();
    }
    // Otherwise a destroy, or the failing init itself, frees it once its calls are out.
    if (mine) loom::api::destroyComm(comm);
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return guard("ncclCommRevoke", comm, [&] {
    LOOM_CHECK_ARG(loom::api::isLiveComm(comm), "ncclCommRevoke: comm is not a live communicator");
    LOOM_CHECK_ARG(revokeFlags == NCCL_REVOKE_DEFAULT,
                   "ncclCommRevoke: revokeFlags=%d must be NCCL_REVOKE_DEFAULT (0)", revokeFlags);
    // In-flight operations on other threads see the flag within 100 ms and fail; the
    // bootstrap stays usable so the communicator can still be split or shrunk.
    comm->revoked.store(true);
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return guard("ncclCommGetAsyncError", comm, [&] {
    LOOM_CHECK_ARG(asyncError != nullptr, "ncclCommGetAsyncError: asyncError is NULL");
    LOOM_CHECK_ARG(loom::api::isLiveComm(comm),
                   "ncclCommGetAsyncError: comm %p is not a live communicator",
                   static_cast<void*>(comm));
    // A kernel's failed status reaches the error now (init over: core is set).
    if (comm->asyncError.load() != ncclInProgress && comm->core && comm->core->deviceExec())
      comm->core->deviceExec()->poll();
    // A split, shrink or grow running as a job (api/mgmt_job.h): its error lands first.
    if (comm->jobRunning.load()) {
      *asyncError = ncclInProgress;
      return ncclSuccess;
    }
    *asyncError = static_cast<ncclResult_t>(comm->asyncError.load());
    // The calls stock NCCL serves fail asynchronously on its side.
    if (*asyncError == ncclSuccess && comm->shadow && !comm->abortFlag.load())
      *asyncError = comm->shadow->asyncError();
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return guard("ncclCommCount", comm, [&] {
    LOOM_CHECK_ARG(count != nullptr, "ncclCommCount: count is NULL");
    LOOM_CHECK_ARG(loom::api::isLiveComm(comm), "ncclCommCount: comm is not a live communicator");
    *count = comm->nranks;
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return guard("ncclCommUserRank", comm, [&] {
    LOOM_CHECK_ARG(rank != nullptr, "ncclCommUserRank: rank is NULL");
    LOOM_CHECK_ARG(loom::api::isLiveComm(comm),
                   "ncclCommUserRank: comm is not a live communicator");
    *rank = comm->rank;
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return guard("ncclCommCuDevice", comm, [&] {
    LOOM_CHECK_ARG(device != nullptr, "ncclCommCuDevice: device is NULL");
    LOOM_CHECK_ARG(loom::api::isLiveComm(comm),
                   "ncclCommCuDevice: comm is not a live communicator");
    *device = comm->cudaDev;  // -1 for host-only communicators
    return ncclSuccess;
  });
}

LOOM_NCCL_API const char* ncclGetLastError(ncclComm_t comm) {
  // A copy of this thread's: the communicator's text may be rewritten (a staged failure)
  // or freed (an abort on another thread) once this returns.
  thread_local std::string copy;
  if (comm && loom::api::enterCall(comm)) {
    {
      std::lock_guard<std::mutex> lock(comm->errMu);
      copy = comm->lastError;
    }
    loom::api::leaveCall(comm);
    return copy.c_str();
  }
  return loom::api::threadLastError();
}

// The pncclX profiling names (nccl.h declares both; NCCL exports both).
LOOM_NCCL_PROFILING_ALIAS(ncclGetUniqueId);
LOOM_NCCL_PROFILING_ALIAS(ncclCommInitRankConfig);
LOOM_NCCL_PROFILING_ALIAS(ncclCommInitRank);
LOOM_NCCL_PROFILING_ALIAS(ncclCommInitRankScalable);
LOOM_NCCL_PROFILING_ALIAS(ncclCommInitAll);
LOOM_NCCL_PROFILING_ALIAS(ncclCommSplit);
LOOM_NCCL_PROFILING_ALIAS(ncclCommShrink);
LOOM_NCCL_PROFILING_ALIAS(ncclCommFinalize);
LOOM_NCCL_PROFILING_ALIAS(ncclCommDestroy);
LOOM_NCCL_PROFILING_ALIAS(ncclCommAbort);
LOOM_NCCL_PROFILING_ALIAS(ncclCommRevoke);
LOOM_NCCL_PROFILING_ALIAS(ncclCommGetAsyncError);
LOOM_NCCL_PROFILING_ALIAS(ncclCommCount);
LOOM_NCCL_PROFILING_ALIAS(ncclCommUserRank);
LOOM_NCCL_PROFILING_ALIAS(ncclCommCuDevice);
LOOM_NCCL_PROFILING_ALIAS(ncclGetLastError);
