#include "engine/engine.h"

#include <algorithm>
#include <map>
#include <thread>

#include "base/cuda_driver.h"
#include "base/error.h"
#include "base/log.h"
#include "engine/communicator.h"
#include "engine/cpu_executor.h"
#include "engine/profiler_abi.h"
#include "engine/profiler_plugin.h"
#include "engine/staged.h"

namespace loom {
namespace {

Task bindTask(const Op& op, const Plan& plan, uint64_t seq, const char* name) {
  Task t;
  t.core = op.comm.core;
  t.recorder = &op.comm.core->recorder();
  t.plan = &plan;
  t.sendbuf = op.sendbuff;
  t.recvbuf = op.recvbuff;
  t.red = op.red;
  t.eltSize = op.eltSize;
  t.count = op.count;
  t.transports = &op.comm.core->transports();
  t.abortFlag = op.comm.abortFlag;
  t.revokeFlag = op.comm.revokeFlag;
  t.rank = op.comm.core->rank();
  t.seq = seq;
  t.name = name;
  t.oversubscribed = op.comm.core->oversubscribed();
  t.interp = op.comm.core->interp();
  return t;
}

// What one communicator contributes to a launch.
struct CommWork {
  OpComm comm;
  std::vector<const Op*> ops;
  // Plans not known to be connected yet: their connections are made before the launch.
  std::vector<std::shared_ptr<CachedPlan>> unconnected;
  std::shared_ptr<const Plan> p2p;
};

// fn(0) .. fn(n - 1), each on a thread of its own when there are several: set-ups that are
// collective between ranks this one thread drives must run at once. Rethrows the first
// failure (by index), its index in *failed.
template <class Fn>
void allAtOnce(size_t n, Fn fn, size_t* failed = nullptr) {
  size_t i = 0;
  try {
    if (n == 1) return fn(i);
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(n);
    for (size_t k = 0; k < n; ++k)
      threads.emplace_back([&, k] {
        try {
          fn(k);
        } catch (...) {
          errors[k] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (i = 0; i < n; ++i)
      if (errors[i]) std::rethrow_exception(errors[i]);
  } catch (...) {
    if (failed) *failed = i;
    throw;
  }
}

// Makes the connections the plans need. Setting them up is collective between each pair,
// so communicators driven by this one thread connect concurrently.
void connectAll(std::vector<CommWork>& comms) {
  using Keys = std::vector<TransportManager::ConnKey>;
  std::vector<std::pair<Communicator*, std::pair<Keys, Keys>>> needs;
  for (CommWork& cw : comms) {
    Keys s, r;
    for (auto& cp : cw.unconnected) cp->plan.peers(&s, &r);
    if (cw.p2p) cw.p2p->peers(&s, &r);
    if (!s.empty() || !r.empty()) needs.push_back({cw.comm.core, {s, r}});
  }
  allAtOnce(needs.size(), [&](size_t i) { needs[i].first->connect(needs[i].second.first, needs[i].second.second); });
  for (CommWork& cw : comms)
    for (auto& cp : cw.unconnected) cp->connected.store(true, std::memory_order_release);
}

// A failed operation leaves the connections mid-stream: the API records the error (the
// communicator is poisoned) and the peers blocked on this rank learn of the failure
// through the closed connections.
void failAll(std::span<const OpComm> comms, const Error& e) {
  for (const OpComm& c : comms) {
    c.core->recorder().noteError(e.what());
    if (c.onFailure) c.onFailure(c.owner, e);
    c.core->transports().closeAll();
  }
  for (const OpComm& c : comms) c.core->recorder().dumpOnEvent("failure");
}

// The flight recorder's entry of a collective about to run.
FlightEntry* recordColl(const Op& op, uint64_t seq, const CachedPlan& cp) {
  return op.comm.core->recorder().record(seq, op.coll, cp.plan.algo, op.bytes(), op.dtype,
                                         op.redop, op.root, cp.peerRanks.data(),
                                         static_cast<int>(cp.peerRanks.size()));
}

const char* opName(const Op& op) { return collectiveName(op.coll); }

// ---- the profiler plugin's events of a launch (engine/profiler_plugin.h)

// NCCL's style of algorithm name ("RING", "TREE"), Loom's own algorithms alike.
const char* profAlgoName(Algorithm a) {
  switch (a) {
    case Algorithm::kRing: return "RING";
    case Algorithm::kTree: return "TREE";
    case Algorithm::kHalvingDoubling: return "HALVING_DOUBLING";
    case Algorithm::kDirect: return "DIRECT";
    case Algorithm::kHierarchical: return "HIERARCHICAL";
    default: return "Unknown";
  }
}

// One communicator's part of a launch: its Group event and its task events, started as the
// tasks are bound (the group with the first) and stopped once they all are (queued, as
// NCCL's); the channel events are the executor's (Task::prof). Operations whose task events
// were made when they were queued (Op::profQueued) get only the channel events.
class LaunchProfile {
 public:
  explicit LaunchProfile(Profiler* p) : p_(p) {}
  ~LaunchProfile() {
    if (!p_) return;
    for (void* h : tasks_) p_->stop(h);
    p_->stop(group_);
  }
  LaunchProfile(const LaunchProfile&) = delete;
  LaunchProfile& operator=(const LaunchProfile&) = delete;

  void* collEvent(const Op& op, const Plan& plan, uint8_t interp) {
    return keep(p_->startColl(op.profApi, group(), op.coll, op.sendbuff, op.recvbuff, op.count, op.dtype, op.root,
                              static_cast<int>(plan.channels.size()), profAlgoName(plan.algo),
                              interp == Task::kInterpLL ? "LL" : "SIMPLE"));
  }
  void* p2pEvent(const Op& op) {
    void* buff = op.isSend ? const_cast<void*>(op.sendbuff) : op.recvbuff;
    return keep(p_->startP2p(op.profApi, group(), op.isSend, buff, op.count, op.dtype, op.root));
  }
  void coll(const Op& op, const Plan& plan, Task* t) {
    if (!p_) return;
    void* h = op.profQueued ? op.profTask : collEvent(op, plan, t->interp);
    attach(t, {h}, static_cast<int>(plan.channels.size()));
  }
  void p2p(const std::vector<const Op*>& ops, Task* t) {
    if (!p_) return;
    std::vector<void*> hs;
    for (const Op* op : ops) hs.push_back(op->profQueued ? op->profTask : p2pEvent(*op));
    attach(t, std::move(hs), 1);
  }

 private:
  void* group() {
    if (!groupStarted_) group_ = p_->startGroup();
    groupStarted_ = true;
    return group_;
  }
  void* keep(void* h) {
    if (h) tasks_.push_back(h);
    return h;
  }
  void attach(Task* t, std::vector<void*> events, int channels) {
    if (p_->wants(profabi::kKernelCh) && std::any_of(events.begin(), events.end(), [](void* h) { return h; }))
      t->prof = std::make_shared<TaskProfile>(p_, std::move(events), channels);
  }
  Profiler* p_;
  void* group_ = nullptr;
  bool groupStarted_ = false;
  std::vector<void*> tasks_;
};

void logColl(const Op& op, uint64_t seq, Algorithm algo) {
  LOOM_INFO(kLogColl, "%s: opCount %llu count %zu datatype %d op %d root %d algorithm %s",
            opName(op), static_cast<unsigned long long>(seq), op.count, op.dtype, op.redop,
            op.root, algorithmName(algo));
}

// The common case of a training loop: one collective, completing before return, whose plan
// is cached and connected and whose scratch space exists. Nothing to set up, nothing to
// allocate.
bool runReady(const Op& op, const CachedPlan& cp) {
  Communicator& core = *op.comm.core;
  if (!cp.connected.load(std::memory_order_acquire) || cp.plan.scratchBytes > core.scratchBytes())
    return false;
  uint64_t seq = core.nextSeq();
  logColl(op, seq, cp.plan.algo);
  Task t = bindTask(op, cp.plan, seq, opName(op));
  t.rec = recordColl(op, seq, cp);
  if (__builtin_expect(op.comm.profiler != nullptr, 0)) LaunchProfile(op.comm.profiler).coll(op, cp.plan, &t);
  if (cp.plan.scratchBytes > 0) t.scratch = core.scratch(cp.plan.scratchBytes);
  core.executor().drain();
  Task* task = &t;
  try {
    runTasks({&task, 1});
  } catch (const Error& e) {
    failAll({&op.comm, 1}, e);
    throw;
  }
  return true;
}

// A lone collective of a one-rank communicator on device memory: its output is its input (a
// pre-multiplied sum excepted), so it is one device copy on the call's stream, as stock NCCL
// makes it (nothing where it is in place), instead of a kernel or a trip through host memory.
bool copiedAlone(std::span<const Op> ops) {
  if (ops.size() != 1) return false;
  const Op& op = ops[0];
  if (op.isP2p() || op.comm.core->nranks() != 1 || op.mem == MemKind::kHost || op.deviceScalar ||
      op.red.kind == RedKind::kPreMulSum)
    return false;
  const cuda::Driver* drv = cuda::driver();
  if (!drv) return false;
  const bool inPlace = op.bytes() == 0 || op.sendbuff == op.recvbuff;
  try {
    if (!inPlace) {
      cuda::ScopedDevice sd;
      std::string why;
      if (!sd.set(op.device, &why))
        LOOM_THROW(kUnhandledCudaError, "rank 0: %s on device buffers: device %d cannot be made current: %s",
                   op.callName(), op.device, why.c_str());
      if (cuda::CuResult r = drv->streams.memcpyAsync(reinterpret_cast<cuda::CuDevicePtr>(op.recvbuff),
                                                      reinterpret_cast<cuda::CuDevicePtr>(op.sendbuff), op.bytes(),
                                                      op.stream);
          r != cuda::kCudaSuccess)
        LOOM_THROW(kUnhandledCudaError, "rank 0: %s on device buffers: cuMemcpyAsync of %zu bytes failed: %s",
                   op.callName(), op.bytes(), drv->errorText(r).c_str());
    }
  } catch (const Error& e) {
    failAll({&op.comm, 1}, e);
    throw;
  }
  LOOM_INFO(kLogColl, "%s: %zu bytes, one rank: %s (stream %p)", op.callName(), op.bytes(),
            inPlace ? "in place, nothing to copy" : "a device copy", op.stream);
  return true;
}

// Collectives and sends/receives of communicators the device executor serves run as its
// kernel; the rest (a device scalar, other communicators) go to *staged. Every plan is made
// ready before any kernel is queued: making connections is collective between pairs of
// ranks, so executors driven by this one thread prepare concurrently (as connectAll).
void launchOnDevice(std::span<const Op> ops, std::vector<Op>* staged) {
  if (copiedAlone(ops)) return;
  std::vector<std::pair<DeviceExec*, std::vector<const Op*>>> execs;
  std::vector<size_t> execOf;  // of each collective, in issue order
  for (const Op& op : ops) {
    DeviceExec* ex = op.comm.core->deviceExec();
    if (!ex || !DeviceExec::takes(op)) {
      staged->push_back(op);
      continue;
    }
    auto it = std::find_if(execs.begin(), execs.end(), [&](const auto& e) { return e.first == ex; });
    if (it == execs.end()) it = execs.insert(execs.end(), {ex, {}});
    it->second.push_back(&op);
    if (!op.isP2p()) execOf.push_back(static_cast<size_t>(it - execs.begin()));
  }
  // Refused before anything launches: the staged path takes device memory only.
  for (const Op& op : *staged)
    LOOM_CHECK_USAGE(op.mem == MemKind::kDevice,
                     "rank %d: a group mixes host-memory and device-memory operations (%s on host "
                     "memory); Loom's staged path takes device memory only: issue them in separate "
                     "groups",
                     op.comm.core->rank(), op.callName());
  std::vector<std::vector<DeviceExec::Launch>> ready(execs.size());
  const Op* current = nullptr;
  try {
    size_t failed = 0;
    try {
      allAtOnce(execs.size(), [&](size_t i) { ready[i] = execs[i].first->prepare(execs[i].second); }, &failed);
    } catch (...) {
      current = execs[failed].second[0];
      throw;
    }
    std::vector<size_t> next(execs.size(), 0);  // each executor's launches, in issue order
    auto launchNext = [&](size_t e) {
      const DeviceExec::Launch& l = ready[e][next[e]++];
      current = l.op;
      execs[e].first->launch(l);
    };
    for (size_t e : execOf) launchNext(e);
    // Each communicator's sends and receives (one launch) after its collectives, as the
    // host engine runs them: every rank alike, however it ordered its calls.
    for (size_t e = 0; e < execs.size(); ++e) {
      while (next[e] < ready[e].size()) launchNext(e);
      current = execs[e].second[0];
      execs[e].first->finishGroup();
    }
  } catch (const Error& e) {
    failAll({&current->comm, 1}, e);
    throw;
  }
}

}  // namespace

// One plan holding all the sends and receives a group issued on one communicator: one
// channel per (direction, peer) so that messages to one peer stay in order while
// different peers progress concurrently. Self send/recv pairs are copied directly; sends
// and receives of 0 bytes are left out.
std::shared_ptr<const Plan> p2pPlan(int rank, const std::vector<const Op*>& ops) {
  auto plan = std::make_shared<Plan>();
  plan->coll = Collective::kSendRecv;
  std::map<std::pair<int, int>, size_t> chanOf;  // (isSend, peer) -> channel
  std::vector<const Op*> selfSends, selfRecvs;
  for (const Op* op : ops) {
    // Nothing to move, nothing to match: a rank whose group holds only such ops (which
    // name no memory, so may take another path than its peer's) exchanges nothing.
    if (op->bytes() == 0) continue;
    if (op->root == rank) {
      (op->isSend ? selfSends : selfRecvs).push_back(op);
      continue;
    }
    auto key = std::make_pair(op->isSend ? 1 : 0, op->root);
    auto it = chanOf.find(key);
    if (it == chanOf.end()) {
      it = chanOf.emplace(key, plan->channels.size()).first;
      plan->channels.emplace_back();
    }
    PlanBuilder b(plan->channels[it->second], op->isSend ? op->root : -1,
                  op->isSend ? -1 : op->root);
    if (op->isSend) b.send(absBuf(op->sendbuff), op->bytes());
    else b.recv(absBuf(op->recvbuff), op->bytes());
  }
  if (selfSends.size() != selfRecvs.size())
    LOOM_THROW(kInvalidUsage,
               "rank %d: the group has %zu send(s) to itself but %zu receive(s) from itself",
               rank, selfSends.size(), selfRecvs.size());
  for (size_t i = 0; i < selfSends.size(); ++i) {
    size_t sb = selfSends[i]->bytes(), rb = selfRecvs[i]->bytes();
    LOOM_CHECK_USAGE(sb == rb, "rank %d: send to self of %zu bytes matched with a receive of %zu",
                     rank, sb, rb);
    plan->channels.emplace_back();
    PlanBuilder(plan->channels.back(), -1, -1)
        .copy(absBuf(selfSends[i]->sendbuff), absBuf(selfRecvs[i]->recvbuff), sb);
  }
  return plan;
}

void failBatch(const Batch& batch, const Error& e) { failAll(batch.comms, e); }

void profileQueued(std::span<Op> ops) {
  for (size_t i = 0; i < ops.size(); ++i) {
    Profiler* p = ops[i].comm.profiler;
    if (!p || ops[i].profQueued) continue;
    LaunchProfile prof(p);  // this communicator's operations of the launch
    for (size_t j = i; j < ops.size(); ++j) {
      Op& op = ops[j];
      if (op.comm.profiler != p) continue;
      Communicator& core = *op.comm.core;
      op.profQueued = true;
      if (op.isP2p()) {
        op.profTask = prof.p2pEvent(op);
        continue;
      }
      // The plan the host engine will run: the communicator's cached one for the request.
      const std::shared_ptr<CachedPlan> cp =
          core.planCache().get({op.coll, op.count, op.eltSize, op.root}, core.planContext());
      op.profTask = prof.collEvent(op, cp->plan, core.interp());
    }
  }
}

std::shared_ptr<Work> enqueue(std::span<const Op> ops, Completion completion) {
  if (ops.empty()) return completedWork();
  bool device = false;
  for (const Op& op : ops) device |= op.mem != MemKind::kHost;
  if (device) {
    LOOM_CHECK_USAGE(completion == Completion::kBeforeReturn,
                     "rank %d: an asynchronous launch on device memory: device work is ordered "
                     "by its stream, not by a work handle",
                     ops[0].comm.core->rank());
    std::vector<Op> staged;
    launchOnDevice(ops, &staged);
    if (!staged.empty()) launchStaged(staged);
    return completedWork();
  }
  for (const Op& op : ops) op.comm.core->drainStaged();  // issue order across memory kinds
  std::shared_ptr<CachedPlan> first;  // ops[0]'s plan, when the fast path looked it up
  if (ops.size() == 1 && completion == Completion::kBeforeReturn && !ops[0].isP2p() &&
      ops[0].mem == MemKind::kHost) {
    const Op& op = ops[0];
    Communicator& core = *op.comm.core;
    first = core.planCache().get({op.coll, op.count, op.eltSize, op.root}, core.planContext());
    if (runReady(op, *first)) return completedWork();
  }
  // Per communicator, in issue order.
  std::vector<CommWork> comms;
  for (const Op& op : ops) {
    auto it = std::find_if(comms.begin(), comms.end(),
                           [&](const CommWork& c) { return c.comm.core == op.comm.core; });
    if (it == comms.end()) {
      comms.push_back({op.comm, {}, {}, nullptr});
      it = comms.end() - 1;
    }
    it->ops.push_back(&op);
  }
  LOOM_CHECK_USAGE(completion == Completion::kBeforeReturn || comms.size() == 1,
                   "an asynchronous launch spans %zu communicators; it may use one",
                   comms.size());

  auto batch = std::make_unique<Batch>();
  for (CommWork& cw : comms) {
    Communicator& core = *cw.comm.core;
    LaunchProfile prof(cw.comm.profiler);
    // The group's sends and receives run after its collectives, on every rank alike
    // (they share connections), however each rank ordered its calls.
    std::vector<const Op*> p2p;
    for (const Op* op : cw.ops) {
      if (op->isP2p()) {
        p2p.push_back(op);
        continue;
      }
      CollRequest req{op->coll, op->count, op->eltSize, op->root};
      std::shared_ptr<CachedPlan> cp =
          op == &ops[0] && first ? first : core.planCache().get(req, core.planContext());
      if (!cp->connected.load(std::memory_order_acquire)) cw.unconnected.push_back(cp);
      uint64_t seq = core.nextSeq();
      logColl(*op, seq, cp->plan.algo);
      batch->tasks.push_back(bindTask(*op, cp->plan, seq, opName(*op)));
      batch->tasks.back().rec = recordColl(*op, seq, *cp);
      prof.coll(*op, cp->plan, &batch->tasks.back());
      batch->plans.push_back(std::shared_ptr<const Plan>(cp, &cp->plan));
    }
    if (!p2p.empty()) {
      cw.p2p = p2pPlan(core.rank(), p2p);
      uint64_t seq = core.nextSeq();
      LOOM_INFO(kLogColl, "SendRecv: opCount %llu with %zu send(s)/receive(s)",
                static_cast<unsigned long long>(seq), p2p.size());
      Task t = bindTask(*p2p[0], *cw.p2p, seq, "SendRecv");
      std::vector<int> peers = peerRanks(*cw.p2p);
      uint64_t bytes = 0;
      for (const Op* op : p2p) bytes += op->bytes();
      t.rec = core.recorder().record(seq, Collective::kSendRecv, Algorithm::kDirect, bytes, 0, 0,
                                     p2p.size() == 1 ? p2p[0]->root : -1, peers.data(),
                                     static_cast<int>(peers.size()));
      t.red = Reducer::make(0 /* int8 */, 0 /* sum */, core.nranks());
      t.eltSize = 1;
      t.sendbuf = nullptr;
      t.recvbuf = nullptr;
      prof.p2p(p2p, &t);
      batch->tasks.push_back(std::move(t));
      batch->plans.push_back(cw.p2p);
    }
  }

  for (const CommWork& cw : comms) batch->comms.push_back(cw.comm);
  try {
    // New connections and a larger scratch buffer change state that queued asynchronous
    // work may be using: let it finish first.
    bool connecting = false;
    for (const CommWork& cw : comms) connecting |= !cw.unconnected.empty() || cw.p2p;
    if (connecting) {
      for (const CommWork& cw : comms) cw.comm.core->executor().drain();
      connectAll(comms);
    }
    // Each communicator's tasks run one after another and share its scratch buffer.
    for (const CommWork& cw : comms) {
      size_t need = 0;
      for (const Task& t : batch->tasks)
        if (t.transports == &cw.comm.core->transports())
          need = std::max(need, t.plan->scratchBytes);
      if (need == 0) continue;
      if (need > cw.comm.core->scratchBytes()) cw.comm.core->executor().drain();
      void* scratch = cw.comm.core->scratch(need);
      for (Task& t : batch->tasks)
        if (t.transports == &cw.comm.core->transports()) t.scratch = scratch;
    }
  } catch (const Error& e) {
    failBatch(*batch, e);
    throw;
  }
  // Work queued earlier on any of these communicators runs first.
  for (size_t i = 1; i < comms.size(); ++i) comms[i].comm.core->executor().drain();
  return comms[0].comm.core->executor().launch(std::move(batch), completion);
}

}  // namespace loom
