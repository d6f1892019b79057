// ncclGroupStart/End and the launch of collected operations.
#include "api/group.h"

#include <algorithm>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "api/comm.h"
#include "api/guard.h"
#include "algo/select.h"
#include "base/log.h"
#include "engine/executor.h"

namespace loom::api {
namespace {

struct GroupState {
  int depth = 0;
  std::vector<OpArgs> ops;
  std::vector<ncclComm_t> inits;
};
thread_local GroupState tlsGroup;

size_t eltSize(ncclDataType_t t) { return dtypeSize(static_cast<int>(t)); }

Reducer reducerFor(const OpArgs& a) {
  ncclComm_t comm = a.comm;
  if (a.op < ncclNumOps) return Reducer::make(static_cast<int>(a.dtype), static_cast<int>(a.op), comm->nranks);
  std::lock_guard<std::mutex> lock(comm->opsMu);
  return comm->userOps[a.op - ncclNumOps].red;
}

Plan buildCollective(const OpArgs& a) {
  Communicator& c = *a.comm->core;
  CollRequest req{a.coll, a.count, eltSize(a.dtype), a.root};
  Algorithm algo = selectAlgorithm(req, c.planContext());
  LOOM_INFO(kLogColl, "%s: opCount %llu count %zu datatype %d op %d root %d algorithm %s",
            collectiveName(a.coll), static_cast<unsigned long long>(c.nextSeq() - 1 + 1), a.count,
            static_cast<int>(a.dtype), static_cast<int>(a.op), a.root, algorithmName(algo));
  return buildPlan(req, c.planContext(), algo);
}

// Everything a launch owns until its tasks complete.
struct Launch {
  std::vector<std::unique_ptr<Plan>> plans;
  std::vector<std::unique_ptr<Task>> tasks;
};

// One task holding all the sends and receives a group issued on one communicator: one
// channel per (direction, peer) so that messages to one peer stay in order while
// different peers progress concurrently. Self send/recv pairs are copied directly.
void addP2pBatch(Launch& l, ncclComm_t comm, const std::vector<const OpArgs*>& ops) {
  auto plan = std::make_unique<Plan>();
  plan->coll = Collective::kSendRecv;
  std::map<std::pair<int, int>, size_t> chanOf;  // (isSend, peer) -> channel
  std::vector<const OpArgs*> selfSends, selfRecvs;
  for (const OpArgs* op : ops) {
    if (op->root == comm->rank) {
      (op->isSend ? selfSends : selfRecvs).push_back(op);
      continue;
    }
    auto key = std::make_pair(op->isSend ? 1 : 0, op->root);
    auto it = chanOf.find(key);
    if (it == chanOf.end()) {
      it = chanOf.emplace(key, plan->channels.size()).first;
      plan->channels.emplace_back();
    }
    ChannelPlan& ch = plan->channels[it->second];
    size_t bytes = op->count * eltSize(op->dtype);
    PlanBuilder b(ch, op->isSend ? op->root : -1, op->isSend ? -1 : op->root);
    if (op->isSend) b.send(absBuf(op->sendbuff), bytes);
    else b.recv(absBuf(op->recvbuff), bytes);
  }
  if (selfSends.size() != selfRecvs.size())
    LOOM_THROW(kInvalidUsage,
               "rank %d: the group has %zu send(s) to itself but %zu receive(s) from itself",
               comm->rank, selfSends.size(), selfRecvs.size());
  for (size_t i = 0; i < selfSends.size(); ++i) {
    size_t sb = selfSends[i]->count * eltSize(selfSends[i]->dtype);
    size_t rb = selfRecvs[i]->count * eltSize(selfRecvs[i]->dtype);
    LOOM_CHECK_USAGE(sb == rb, "rank %d: send to self of %zu bytes matched with a receive of %zu",
                     comm->rank, sb, rb);
    plan->channels.emplace_back();
    PlanBuilder(plan->channels.back(), -1, -1)
        .copy(absBuf(selfSends[i]->sendbuff), absBuf(selfRecvs[i]->recvbuff), sb);
  }
  auto t = std::make_unique<Task>();
  t->plan = plan.get();
  t->red = Reducer::make(static_cast<int>(ncclInt8), static_cast<int>(ncclSum), comm->nranks);
  t->eltSize = 1;
  t->transports = &comm->core->transports();
  t->abortFlag = &comm->abortFlag;
  t->revokeFlag = &comm->revoked;
  t->rank = comm->rank;
  t->seq = comm->core->nextSeq();
  t->name = "SendRecv";
  l.plans.push_back(std::move(plan));
  l.tasks.push_back(std::move(t));
}

void launch(const std::vector<OpArgs>& ops) {
  Launch l;
  // Per communicator, in issue order; all p2p of a group form one batch.
  std::vector<ncclComm_t> comms;
  for (const OpArgs& op : ops)
    if (std::find(comms.begin(), comms.end(), op.comm) == comms.end()) comms.push_back(op.comm);
  for (ncclComm_t comm : comms) {
    std::vector<const OpArgs*> p2p;
    bool batchPlaced = false;
    size_t batchIndex = 0;
    for (const OpArgs& op : ops) {
      if (op.comm != comm) continue;
      if (op.isSend || op.isRecv) {
        p2p.push_back(&op);
        if (!batchPlaced) {
          batchPlaced = true;
          batchIndex = l.tasks.size();
          l.tasks.push_back(nullptr);  // filled below
        }
        continue;
      }
      auto plan = std::make_unique<Plan>(buildCollective(op));
      auto t = std::make_unique<Task>();
      t->plan = plan.get();
      t->sendbuf = op.sendbuff;
      t->recvbuf = op.recvbuff;
      t->red = reducerFor(op);
      t->eltSize = eltSize(op.dtype);
      t->transports = &comm->core->transports();
      t->abortFlag = &comm->abortFlag;
      t->revokeFlag = &comm->revoked;
      t->rank = comm->rank;
      t->seq = comm->core->nextSeq();
      t->name = collectiveName(op.coll);
      l.plans.push_back(std::move(plan));
      l.tasks.push_back(std::move(t));
    }
    if (batchPlaced) {
      Launch tmp;
      addP2pBatch(tmp, comm, p2p);
      l.plans.push_back(std::move(tmp.plans[0]));
      l.tasks[batchIndex] = std::move(tmp.tasks[0]);
    }
  }
  // Connections the plans need that do not exist yet. Setting them up is collective
  // between each pair, so communicators driven by this one thread connect concurrently.
  using Keys = std::vector<TransportManager::ConnKey>;
  std::vector<std::pair<ncclComm_t, std::pair<Keys, Keys>>> needs;
  for (ncclComm_t comm : comms) {
    Keys s, r;
    for (auto& t : l.tasks)
      if (t->transports == &comm->core->transports()) t->plan->peers(&s, &r);
    needs.push_back({comm, {s, r}});
  }
  if (needs.size() == 1) {
    needs[0].first->core->connect(needs[0].second.first, needs[0].second.second);
  } else {
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(needs.size());
    for (size_t i = 0; i < needs.size(); ++i)
      threads.emplace_back([&, i] {
        try {
          needs[i].first->core->connect(needs[i].second.first, needs[i].second.second);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
  // Each communicator's tasks run one after another and share its scratch buffer.
  for (ncclComm_t comm : comms) {
    size_t need = 0;
    for (auto& t : l.tasks)
      if (t->transports == &comm->core->transports()) need = std::max(need, t->plan->scratchBytes);
    if (need == 0) continue;
    void* scratch = comm->core->scratch(need);
    for (auto& t : l.tasks)
      if (t->transports == &comm->core->transports()) t->scratch = scratch;
  }
  std::vector<Task*> raw;
  for (auto& t : l.tasks) raw.push_back(t.get());
  std::vector<std::unique_ptr<CallScope>> scopes;
  for (ncclComm_t comm : comms) scopes.push_back(std::make_unique<CallScope>(comm));
  try {
    runTasks(raw);
  } catch (const Error& e) {
    // A failed operation leaves the connections mid-stream: the communicator is poisoned
    // (later calls report the error at once) and its peers are told.
    for (ncclComm_t comm : comms) {
        recordError(comm, static_cast<ncclResult_t>(e.code()), e.what());
        comm->asyncError.store(static_cast<int>(e.code()));
        // Peers blocked on this rank learn of the failure through their connections.
        comm->core->transports().closeAll();
      }
    throw;
  }
}

void runDeferredInits(std::vector<ncclComm_t> inits) {
  std::vector<std::thread> threads;
  for (ncclComm_t c : inits) {
    if (c->blocking) threads.emplace_back([c] { c->runInit(); });
    else c->initThread = std::thread([c] { c->runInit(); });
  }
  for (auto& t : threads) t.join();
  for (ncclComm_t c : inits)
    if (c->blocking && c->asyncError.load() != ncclSuccess)
      throw Error(static_cast<Code>(c->asyncError.load()), c->lastError);
}

}  // namespace

bool inGroup() { return tlsGroup.depth > 0; }

void submit(const OpArgs& op) {
  if (inGroup()) {
    tlsGroup.ops.push_back(op);
    return;
  }
  launch({op});
}

void deferInit(ncclComm_t comm) { tlsGroup.inits.push_back(comm); }

}  // namespace loom::api

using loom::api::guard;

LOOM_NCCL_API(ncclResult_t, ncclGroupStart) {
  return guard("ncclGroupStart", nullptr, [&] {
    loom::api::tlsGroup.depth++;
    return ncclSuccess;
  });
}

LOOM_NCCL_API(ncclResult_t, ncclGroupEnd) {
  return guard("ncclGroupEnd", nullptr, [&] {
    auto& g = loom::api::tlsGroup;
    LOOM_CHECK_USAGE(g.depth > 0, "ncclGroupEnd: no matching ncclGroupStart");
    if (--g.depth > 0) return ncclSuccess;
    std::vector<ncclComm_t> inits = std::move(g.inits);
    std::vector<loom::api::OpArgs> ops = std::move(g.ops);
    g.inits.clear();
    g.ops.clear();
    if (!inits.empty()) loom::api::runDeferredInits(inits);
    if (!ops.empty()) loom::api::launch(ops);
    for (ncclComm_t c : inits)
      if (!c->blocking) return ncclInProgress;
    return ncclSuccess;
  });
}

LOOM_NCCL_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t* simInfo) {
  return guard("ncclGroupSimulateEnd", nullptr, [&] {
    auto& g = loom::api::tlsGroup;
    LOOM_CHECK_ARG(simInfo != nullptr, "ncclGroupSimulateEnd: simInfo is NULL");
    LOOM_CHECK_USAGE(g.depth > 0, "ncclGroupSimulateEnd: no matching ncclGroupStart");
    // The group ends without running anything, as NCCL's simulation does.
    if (--g.depth == 0) {
      g.ops.clear();
      g.inits.clear();
    }
    LOOM_CHECK_USAGE(false,
                     "ncclGroupSimulateEnd: Loom has no performance simulator yet; the group "
                     "was ended without running its operations");
    return ncclSuccess;
  });
}
