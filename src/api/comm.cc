#include "api/comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <unordered_set>

#include "api/guard.h"
#include "base/log.h"
#include "engine/staged.h"

namespace loom::api {
namespace {

struct Registry {
  std::mutex mu;
  std::unordered_set<ncclComm_t> live;
  // Advances whenever a communicator leaves the registry: a thread's memo of the last
  // communicator it found live holds while this stays the same.
  std::atomic<uint64_t> removals{0};
};
struct LiveMemo {
  ncclComm_t comm = nullptr;
  uint64_t removals = 0;
};
thread_local LiveMemo tlsLive;
Registry& registry() {
  static Registry* r = new Registry();  // outlives static destruction: apps destroy late
  return *r;
}

}  // namespace

void registerComm(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().live.insert(comm);
}

void unregisterComm(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().live.erase(comm);
  registry().removals.fetch_add(1, std::memory_order_release);
}

// Every call checks its communicator: a training loop calls with the same one again and
// again, so a thread remembers the last one it found live until any is destroyed.
bool isLiveComm(ncclComm_t comm) {
  Registry& r = registry();
  const uint64_t removals = r.removals.load(std::memory_order_acquire);
  if (comm != nullptr && comm == tlsLive.comm && removals == tlsLive.removals) return true;
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.live.count(comm) == 0) return false;
  tlsLive = {comm, r.removals.load(std::memory_order_relaxed)};
  return true;
}

void checkComm(ncclComm_t comm, const char* fn) {
  if (!comm) LOOM_THROW(kInvalidArgument, "%s: comm is NULL", fn);
  if (!isLiveComm(comm))
    LOOM_THROW(kInvalidArgument,
               "%s: comm %p is not a live communicator (already destroyed, or never created)",
               fn, static_cast<void*>(comm));
  comm->waitInit();
  int err = comm->asyncError.load();
  if (err != ncclSuccess) {
    std::string last;
    {
      std::lock_guard<std::mutex> lock(comm->errMu);
      last = comm->lastError;
    }
    throw Error(static_cast<Code>(err),
                strprintf("%s: communicator (rank %d) has failed earlier: %s", fn, comm->rank,
                          last.c_str()));
  }
  if (comm->abortFlag.load())
    LOOM_THROW(kInvalidUsage, "%s: communicator (rank %d) has been aborted", fn, comm->rank);
  if (comm->revoked.load())
    LOOM_THROW(kInvalidUsage, "%s: communicator (rank %d) has been revoked", fn, comm->rank);
  if (comm->finalized)
    LOOM_THROW(kInvalidUsage, "%s: communicator (rank %d) has been finalized", fn, comm->rank);
}

void checkCommForManagement(ncclComm_t comm, const char* fn) {
  if (!comm) LOOM_THROW(kInvalidArgument, "%s: comm is NULL", fn);
  if (!isLiveComm(comm))
    LOOM_THROW(kInvalidArgument, "%s: comm %p is not a live communicator", fn,
               static_cast<void*>(comm));
  comm->waitInit();
  LOOM_CHECK_USAGE(comm->core != nullptr, "%s: the communicator (rank %d) never initialized", fn,
                   comm->rank);
  LOOM_CHECK_USAGE(!comm->abortFlag.load(), "%s: communicator (rank %d) has been aborted", fn,
                   comm->rank);
}

void destroyComm(ncclComm_t comm) {
  unregisterComm(comm);
  if (comm->initThread.joinable()) comm->initThread.join();
  // Another thread may still be inside a call that noticed the abort: let it leave.
  while (comm->activeCalls.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Stock NCCL's abort for an aborted communicator; its destroy (with the object) otherwise.
  if (comm->shadow && comm->abortFlag.load()) comm->shadow->abort();
  if (comm->core && comm->abortFlag.load()) comm->core->recorder().dumpOnEvent("abort");
  // Staged work reports its failures to this object: it ends before the object goes.
  if (comm->core) comm->core->stopStaged();
  delete comm;
}

}  // namespace loom::api

void ncclComm::runInit() noexcept {
  ncclResult_t rc = loom::api::guard("ncclCommInitRank", this, [&]() {
    loom::ScopedLogRank lr(rank);
    for (int t = 0; t < ncclNumTypes; ++t)
      for (int o = 0; o < ncclNumOps; ++o) builtinOps[t][o] = loom::Reducer::make(t, o, nranks);
    auto c = std::make_unique<loom::Communicator>(job, rank, nranks, &abortFlag);
    loom::dispatch::FallbackSetup fb = loom::dispatch::setUpFallback(
        c->bootstrap(), cudaDev, c->peers()[rank].hostHash, &abortFlag, &revoked,
        loom::deviceExecutorWanted());
    shadow = std::move(fb.shadow);
    {
      std::vector<int> pids;
      for (const loom::PeerInfo& p : c->peers()) pids.push_back(p.pid);
      const std::string sharing = loom::dispatch::gpuSharingWarning(
          fb.ranks, pids, rank, loom::dispatch::mpsControlRunning());
      if (!sharing.empty()) LOOM_WARN("%s", sharing.c_str());
      c->setSameContextRanks(loom::dispatch::sameContextRanks(fb.ranks, pids, rank));
      // Decided from what every rank knows alike: each rank creates it, or none does.
      bool onePidNs = true;  // pids compare only within one pid namespace
      for (const loom::PeerInfo& p : c->peers()) onePidNs &= p.pidNs == c->peers()[0].pidNs;
      bool allWant = !shadow;  // the device executor, where every rank asks for it
      std::vector<int> devices;
      for (const loom::dispatch::RankFallbackInfo& r : fb.ranks) {
        allWant &= r.wantsKernel != 0;
        devices.push_back(r.cudaDev);
      }
      c->setDeviceExec(loom::DeviceExec::create(c->bootstrap(), c->peers(), devices,
                                                c->planContext(), c->sameContextRanks(), allWant));
      if (!shadow && !c->deviceExec() && onePidNs &&
          loom::dispatch::processesOnOneDevice(fb.ranks, pids))
        c->setDeviceBoard(loom::DeviceBoard::create(c->bootstrap(), cudaDev));
    }
    std::string noStaging = shadow || cudaDev < 0 ? "" : loom::stagedUnavailableReason();
    staged = !shadow && cudaDev >= 0 && noStaging.empty();
    if (shadow)
      deviceServer = loom::strprintf("stock NCCL %d (%s): %s", shadow->lib().version(),
                                     shadow->lib().path().c_str(), fb.decision.why.c_str());
    else if (staged && c->deviceExec())
      deviceServer = "Loom's device executor (the plan-interpreter kernel on the caller's stream; "
                     "a device-scalar PreMulSum through the staged path; not stock NCCL: " + fb.decision.why + ")";
    else if (staged)
      deviceServer = "Loom's staged path (through pinned host memory, on the caller's stream; "
                     "not stock NCCL: " + fb.decision.why + ")";
    else
      deviceServer = "nobody: " + fb.decision.why +
                     (cudaDev < 0 ? "; the communicator has no CUDA device"
                                  : "; Loom's staged path is unavailable: " + noStaging);
    LOOM_INFO(loom::kLogInit, "comm %p rank %d device %d: device buffers served by %s",
              static_cast<void*>(this), rank, cudaDev, deviceServer.c_str());
    LOOM_INFO(loom::kLogInit, "comm %p %s - Init COMPLETE", static_cast<void*>(this),
              c->initSummary().c_str());
    core = std::move(c);
    return ncclSuccess;
  });
  {
    std::lock_guard<std::mutex> lock(initMu);
    asyncError.store(rc);
  }
  initCv.notify_all();
}

void ncclComm::waitInit() {
  if (asyncError.load() != ncclInProgress) return;  // every call after init: no lock
  std::unique_lock<std::mutex> lock(initMu);
  initCv.wait(lock, [&] { return asyncError.load() != ncclInProgress || abortFlag.load(); });
}
