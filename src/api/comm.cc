#include "api/comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <unordered_map>

#include "api/guard.h"
#include "api/mgmt_job.h"
#include "api/ras_server.h"
#include "api/stock_route.h"
#include "base/log.h"
#include "bootstrap/root.h"
#include "engine/staged.h"

namespace loom::api {
namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<ncclComm_t, uint64_t> live;  // each communicator's serial
  uint64_t nextSerial = 0;
  // Advances whenever a communicator leaves the registry: a thread's memo of the last
  // communicator it found live holds while this stays the same.
  std::atomic<uint64_t> removals{0};
  // Threads between finding a communicator live and counting themselves in its calls
  // (enterCall), spread over slots so that rank threads do not share one cache line. A
  // destroy sees each slot empty once after unregistering, so a call either sees the
  // communicator gone or is counted before it is freed.
  struct alignas(64) Slot {
    std::atomic<int> n{0};
  };
  static constexpr int kSlots = 64;
  Slot entering[kSlots];
  std::atomic<unsigned> nextSlot{0};
};
struct LiveMemo {
  ncclComm_t comm = nullptr;
  uint64_t serial = 0;
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
  comm->serial = ++registry().nextSerial;
  registry().live[comm] = comm->serial;
}

void unregisterComm(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().live.erase(comm);
  registry().removals.fetch_add(1);  // seq_cst: ordered against enterCall's (Dekker)
}

std::vector<std::pair<ncclComm_t, uint64_t>> liveComms() {
  std::lock_guard<std::mutex> lock(registry().mu);
  return {registry().live.begin(), registry().live.end()};
}

// Every call checks its communicator: a training loop calls with the same one again and
// again, so a thread remembers the last one it found live until any is destroyed.
bool isLiveComm(ncclComm_t comm, uint64_t serial) {
  Registry& r = registry();
  const uint64_t removals = r.removals.load();  // seq_cst, for enterCall
  if (comm != nullptr && comm == tlsLive.comm && removals == tlsLive.removals)
    return serial == 0 || serial == tlsLive.serial;
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.find(comm);
  if (it == r.live.end()) return false;
  tlsLive = {comm, it->second, r.removals.load(std::memory_order_relaxed)};
  return serial == 0 || serial == it->second;
}

// Sequentially consistent, with unregisterComm then destroyComm's look at each slot: either
// this thread's look at `removals` comes before the removal, and the destroy then sees it
// in its slot and waits for it to be counted, or it comes after and finds comm gone.
bool enterCall(ncclComm_t comm, uint64_t serial) {
  if (!comm) return false;
  Registry& r = registry();
  thread_local unsigned slot = r.nextSlot.fetch_add(1) % Registry::kSlots;
  std::atomic<int>& entering = r.entering[slot].n;
  entering.fetch_add(1);
  const bool live = isLiveComm(comm, serial);
  if (live) comm->activeCalls.fetch_add(1);
  entering.fetch_sub(1);
  return live;
}

void leaveCall(ncclComm_t comm) { comm->activeCalls.fetch_sub(1); }

CallScope::CallScope(ncclComm_t c, uint64_t serial) : c_(c) {
  if (!enterCall(c, serial))
    LOOM_THROW(kInvalidArgument,
               "comm %p is not a live communicator (destroyed or aborted on another thread)",
               static_cast<void*>(c));
}

CallScope::~CallScope() { leaveCall(c_); }

// Under the registry's lock: a destroy on another thread unregisters the communicator
// under the same lock before it frees it, so the write lands before that or not at all.
void setCommLastError(ncclComm_t comm, const std::string& msg) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.live.count(comm) == 0) return;
  std::lock_guard<std::mutex> errLock(comm->errMu);
  comm->lastError = msg;
}

void waitInitOrThrow(ncclComm_t comm, const char* fn) {
  comm->waitInit();
  if (comm->asyncError.load() == ncclInProgress)  // ended by an abort or a destroy
    LOOM_THROW(kInvalidUsage, "%s: communicator (rank %d) was %s before its init finished", fn,
               comm->rank, comm->abortFlag.load() ? "aborted" : "destroyed");
}

void checkComm(ncclComm_t comm, const char* fn) {
  if (!comm) LOOM_THROW(kInvalidArgument, "%s: comm is NULL", fn);
  if (!isLiveComm(comm))
    LOOM_THROW(kInvalidArgument,
               "%s: comm %p is not a live communicator (already destroyed, or never created)",
               fn, static_cast<void*>(comm));
  waitInitOrThrow(comm, fn);
  refuseDuringJob(comm, fn);
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
  waitInitOrThrow(comm, fn);
  refuseDuringJob(comm, fn);
  LOOM_CHECK_USAGE(comm->core != nullptr, "%s: the communicator (rank %d) never initialized", fn,
                   comm->rank);
  LOOM_CHECK_USAGE(!comm->abortFlag.load(), "%s: communicator (rank %d) has been aborted", fn,
                   comm->rank);
}

void cancelPendingGrowId(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(comm->growMu);
  if (!comm->growIdPending) return;
  comm->growIdPending = false;
  cancelRoot(JobId::decode(comm->growId));
}

void destroyComm(ncclComm_t comm) {
  unregisterComm(comm);
  // A call entering now has seen it live or will see it gone: wait until it knows which.
  for (Registry::Slot& slot : registry().entering)
    while (slot.n.load() != 0) std::this_thread::yield();
  // A thread waiting for an init that will not run (a group's, not yet ended) gives up.
  {
    std::lock_guard<std::mutex> lock(comm->initMu);
    comm->destroying = true;
  }
  comm->initCv.notify_all();
  // Another thread may still be inside a call that noticed the abort: let it leave. The
  // init's publisher is one until its init thread is set, so the join below sees it.
  while (comm->activeCalls.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // A grow id never used (none can be made from here on): its rendezvous is called off.
  cancelPendingGrowId(comm);
  if (comm->initThread.joinable()) comm->initThread.join();
  if (comm->jobThread.joinable()) comm->jobThread.join();  // its last touch is behind it
  // Stock NCCL's abort for an aborted communicator; its destroy (with the object) otherwise.
  if (comm->shadow && comm->abortFlag.load()) comm->shadow->abort();
  if (comm->core && comm->abortFlag.load()) comm->core->recorder().dumpOnEvent("abort");
  // Staged work reports its failures to this object: it ends before the object goes.
  if (comm->core) comm->core->stopStaged();
  if (comm->countedLoomDevice) countLoomServedDevice(comm->cudaDev, -1);
  forgetStockWindowsOf(comm);
  delete comm;
}

}  // namespace loom::api

void ncclComm::runInit() noexcept {
  ncclResult_t rc = loom::api::guard("ncclCommInitRank", this, [&]() {
    loom::ScopedLogRank lr(rank);
    loom::ras::startServer();
    for (int t = 0; t < ncclNumTypes; ++t)
      for (int o = 0; o < ncclNumOps; ++o) builtinOps[t][o] = loom::Reducer::make(t, o, nranks);
    auto c = std::make_unique<loom::Communicator>(job, rank, nranks, &abortFlag, configMinCtas, configMaxCtas);
    loom::dispatch::FallbackSetup fb = loom::dispatch::setUpFallback(
        c->bootstrap(), cudaDev, c->peers()[rank].hostHash, &abortFlag, &revoked,
        loom::deviceExecutorWanted(), userConfig());
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
      peerCudaDevs = devices;
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
    profiler = loom::Profiler::open(c->commHash(), commName.empty() ? nullptr : commName.c_str(),
                                    c->planContext().layout.nhosts(), nranks, rank);
    core = std::move(c);
    if (!shadow && cudaDev >= 0) {  // ncclMemAlloc asks (api/stock_route.h)
      loom::api::countLoomServedDevice(cudaDev, +1);
      countedLoomDevice = true;
    }
    return ncclSuccess;
  });
  initState.store(rc, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(initMu);
    asyncError.store(rc);
  }
  initCv.notify_all();
}

void ncclComm::waitInit() {
  if (asyncError.load() != ncclInProgress) return;  // every call after init: no lock
  std::unique_lock<std::mutex> lock(initMu);
  initCv.wait(lock, [&] {
    return asyncError.load() != ncclInProgress || abortFlag.load() || destroying;
  });
}
