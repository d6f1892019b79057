// ncclGroupStart/End and the launch of collected operations.
#include "api/group.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "algo/select.h"
#include "api/comm.h"
#include "api/guard.h"
#include "api/mgmt_job.h"
#include "base/cuda_driver.h"
#include "base/log.h"
#include "engine/engine.h"
#include "engine/profiler_abi.h"
#include "engine/profiler_plugin.h"

namespace loom::api {
namespace {

struct DeferredInit {
  ncclComm_t comm;
  uint64_t serial;  // as OpArgs::serial
};
struct DeferredCall {
  ncclComm_t comm;
  uint64_t serial;
  JobStep step;  // what runs, into which newcomm, and what runs when it does not
};
struct GroupState {
  int depth = 0;
  std::vector<OpArgs> ops;
  std::vector<DeferredInit> inits;
  std::vector<DeferredCall> calls;
  // The stock NCCL group joinStockGroup opened, its communicators and what runs after it.
  const dispatch::StockNccl* stockLib = nullptr;
  std::vector<DeferredInit> stockComms;
  std::vector<std::function<void()>> stockThens;
  // The profiler plugin's GroupApi event of the group's operations (engine/profiler_plugin.h),
  // started by the first, in its communicator's plugin context, and stopped when the
  // outermost end returns; `groupApiComm` (with its serial) set once one was asked for.
  void* groupApi = nullptr;
  ncclComm_t groupApiComm = nullptr;
  uint64_t groupApiSerial = 0;
  // Groups an entry point opens around its own sends and receives (all-to-all, gather,
  // scatter): part of the call, not a group of the caller's, for the event's depth.
  int internal = 0;
};
thread_local GroupState tlsGroup;

// Ends the group's GroupApi event around the launch, as NCCL's group end: the
// GroupEndApiStart state, then the stop when the launch has returned or failed. Only while
// the event's communicator lives: one aborted or destroyed since has finalised its plugin
// context, and the event with it.
class GroupApiEnd {
 public:
  explicit GroupApiEnd(GroupState& g) : g_(g) {
    if (g_.groupApiComm && enterCall(g_.groupApiComm, g_.groupApiSerial)) {
      scope_.emplace(CallScope::kEntered, g_.groupApiComm);
      prof_ = g_.groupApiComm->profiler.get();
      prof_->record(g_.groupApi, profabi::kStateGroupEndApiStart);
    }
  }
  ~GroupApiEnd() {
    if (prof_) prof_->stop(g_.groupApi);
    g_.groupApi = nullptr;
    g_.groupApiComm = nullptr;
  }

 private:
  GroupState& g_;
  std::optional<CallScope> scope_;
  Profiler* prof_ = nullptr;
};

bool capturing(const OpArgs& a) {
  if (a.mem != MemKind::kDevice) return false;
  const cuda::Driver* drv = cuda::driver();
  int status = cuda::kStreamCaptureStatusNone;
  return drv && drv->hasStreams && drv->streams.streamIsCapturing(a.stream, &status) == cuda::kCudaSuccess &&
         status == cuda::kStreamCaptureStatusActive;
}

Reducer reducerFor(const OpArgs& a, const void** deviceScalar) {
  ncclComm_t comm = a.comm;
  if (a.op < ncclNumOps) return comm->builtinOps[a.dtype][a.op];  // both checked by the entry point
  std::lock_guard<std::mutex> lock(comm->opsMu);
  const auto& u = comm->userOps[a.op - ncclNumOps];
  LOOM_CHECK_USAGE(!u.deviceScalar || a.mem == MemKind::kDevice,
                   "%s on host buffers with reduction op %d, whose scalar is in device memory "
                   "(ncclScalarDevice): use device buffers, or an op made with "
                   "ncclScalarHostImmediate",
                   collectiveName(a.coll), static_cast<int>(a.op));
  *deviceScalar = u.deviceScalar;
  return u.red;
}

// The engine tells us when an operation failed: the communicator is poisoned, so later
// calls report the error at once.
void onFailure(void* owner, const Error& e) {
  ncclComm_t comm = static_cast<ncclComm_t>(owner);
  recordError(comm, static_cast<ncclResult_t>(e.code()), e.what());
  comm->asyncError.store(static_cast<int>(e.code()));
}

Op toOp(const OpArgs& a) {
  Op op;
  op.coll = a.coll;
  op.sendbuff = a.sendbuff;
  op.recvbuff = a.recvbuff;
  op.count = a.count;
  op.eltSize = dtypeSize(static_cast<int>(a.dtype));
  if (!a.isSend && !a.isRecv) op.red = reducerFor(a, &op.deviceScalar);
  op.dtype = static_cast<int>(a.dtype);
  op.redop = static_cast<int>(a.op);
  op.root = a.root;
  op.isSend = a.isSend;
  op.isRecv = a.isRecv;
  op.mem = a.mem;
  op.stream = a.stream;
  op.device = a.comm->cudaDev;
  op.comm = {a.comm->core.get(), &a.comm->abortFlag, &a.comm->revoked, &onFailure, a.comm,
             a.comm->profiler.get()};
  op.profApi = a.profApi;
  return op;
}

// ---- calls served by stock NCCL (device memory on a communicator with a shadow; on any
// other, device memory takes Loom's staged path, or the entry point refused it)

bool onStock(const OpArgs& a) { return a.mem == MemKind::kDevice && a.comm->shadow; }

const char* opName(const OpArgs& a) {
  return a.isSend ? "Send" : a.isRecv ? "Recv" : collectiveName(a.coll);
}

void issueOnStock(const OpArgs& a) {
  ncclRedOp_t op = a.op;
  if (!a.isSend && !a.isRecv && op >= ncclNumOps) {
    std::lock_guard<std::mutex> lock(a.comm->opsMu);
    const auto& u = a.comm->userOps[op - ncclNumOps];
    LOOM_CHECK_USAGE(u.hasStockOp,
                     "%s on device buffers: reduction op %d has no twin on stock NCCL (its "
                     "ncclRedOpCreatePreMulSum failed or is missing), which serves this call",
                     opName(a), static_cast<int>(op));
    op = u.stockOp;
  }
  std::string msg;
  ncclResult_t rc = a.comm->shadow->run({a.coll, a.sendbuff, a.recvbuff, a.count, a.dtype, op,
                                         a.root, a.isSend, a.isRecv, a.stream}, &msg);
  if (rc != ncclSuccess)
    throwError(static_cast<Code>(rc), "%s (rank %d, device buffers, served by stock NCCL): %s",
               opName(a), a.comm->rank, msg.c_str());
}

// Opens a stock NCCL group on this thread.
void startStockGroup(const dispatch::StockNccl& lib) {
  if (ncclResult_t rc = lib.api().groupStart(); rc != ncclSuccess)
    throwError(static_cast<Code>(rc), "stock ncclGroupStart: %s",
               lib.errorText(rc, nullptr).c_str());
}

// Ends it: non-blocking shadows answer ncclInProgress, and then each of `comms` (their calls
// counted by the caller) settles on its own. The group's result.
ncclResult_t endStockGroup(const dispatch::StockNccl& lib, const std::vector<ncclComm_t>& comms) {
  ncclResult_t rc = lib.api().groupEnd();
  if (rc != ncclInProgress) return rc;
  rc = ncclSuccess;
  for (ncclComm_t c : comms)
    if (ncclResult_t r = c->shadow->settle(ncclInProgress); rc == ncclSuccess) rc = r;
  return rc;
}

// A group's stock calls go in one stock group, closed even when one of them fails.
void launchOnStock(const std::vector<const OpArgs*>& calls) {
  const dispatch::StockNccl& lib = calls[0]->comm->shadow->lib();  // one per process
  startStockGroup(lib);
  std::exception_ptr first;
  for (const OpArgs* a : calls) {
    try {
      issueOnStock(*a);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  std::vector<ncclComm_t> comms;
  for (const OpArgs* a : calls)
    if (std::find(comms.begin(), comms.end(), a->comm) == comms.end()) comms.push_back(a->comm);
  const ncclResult_t rc = endStockGroup(lib, comms);
  if (first) std::rethrow_exception(first);
  if (rc != ncclSuccess)
    throwError(static_cast<Code>(rc), "stock ncclGroupEnd (%zu calls on device buffers): %s",
               calls.size(), lib.errorText(rc, nullptr).c_str());
}

// One operation outside a group: the entry point already holds its call scope.
void launchOne(const OpArgs& a) {
  if (onStock(a)) return issueOnStock(a);
  Op op = toOp(a);
  enqueue({&op, 1}, Completion::kBeforeReturn);
}

// Counts the group's end as a call of each of its communicators before anything reads
// them: one may have been aborted on another thread since its calls were recorded.
std::vector<std::unique_ptr<CallScope>> enterEach(const std::vector<OpArgs>& args) {
  std::vector<ncclComm_t> comms;
  std::vector<std::unique_ptr<CallScope>> scopes;
  for (const OpArgs& a : args) {
    if (std::find(comms.begin(), comms.end(), a.comm) != comms.end()) continue;
    comms.push_back(a.comm);
    scopes.push_back(std::make_unique<CallScope>(a.comm, a.serial));
  }
  return scopes;
}

void launch(const std::vector<OpArgs>& args) {
  const auto scopes = enterEach(args);
  std::vector<Op> ops;
  ops.reserve(args.size());
  std::vector<const OpArgs*> stock;
  for (const OpArgs& a : args) {
    if (onStock(a)) stock.push_back(&a);
    else ops.push_back(toOp(a));
  }
  // Stock calls are enqueued on the callers' streams and return soon. Loom's part runs
  // even when they fail, so that peers waiting in it are not left hanging.
  std::exception_ptr stockFailure;
  if (!stock.empty()) {
    try {
      launchOnStock(stock);
    } catch (...) {
      stockFailure = std::current_exception();
    }
  }
  if (!ops.empty()) enqueue(ops, Completion::kBeforeReturn);
  if (stockFailure) std::rethrow_exception(stockFailure);
}

// The group's recorded inits and management calls, side by side, as NCCL runs a group's
// jobs: each init on a thread of its own (a non-blocking one on its init thread, left
// running), and each communicator's calls in the order recorded on a thread of its own
// (calls of ranks that one thread drives meet each other: a split's color exchange is
// collective over its parent; a split whose parent is one of the inits waits for it). Each
// runs as a call of its communicator: an abort on another thread frees it only after. An
// init whose communicator was aborted or destroyed before the group ended is skipped (the
// others run); a call's fails the end before any call runs (a split would wait for the
// missing rank's colors). The first failure is raised once all have returned. A
// non-blocking communicator's calls run as its job instead (api/mgmt_job.h), not waited
// for, unless the group also has operations on it: they run after its calls, as NCCL runs a
// group's jobs before its operations. True if an init or a job goes on in the background.
bool runDeferred(const std::vector<DeferredInit>& inits, const std::vector<DeferredCall>& calls,
                 const std::vector<OpArgs>& ops) {
  std::vector<std::unique_ptr<CallScope>> scopes;
  size_t goneInits = 0, goneCalls = 0;
  std::vector<ncclComm_t> live;  // inits not aborted meanwhile
  for (const DeferredInit& d : inits) {
    if (!enterCall(d.comm, d.serial)) {
      ++goneInits;
      continue;
    }
    scopes.push_back(std::make_unique<CallScope>(CallScope::kEntered, d.comm));
    live.push_back(d.comm);
  }
  std::vector<std::pair<ncclComm_t, std::vector<const DeferredCall*>>> perComm;
  for (const DeferredCall& d : calls) {
    auto it = std::find_if(perComm.begin(), perComm.end(), [&](const auto& p) { return p.first == d.comm; });
    if (it == perComm.end()) {
      if (!enterCall(d.comm, d.serial)) {
        ++goneCalls;
        continue;
      }
      scopes.push_back(std::make_unique<CallScope>(CallScope::kEntered, d.comm));
      it = perComm.insert(perComm.end(), {d.comm, {}});
    }
    it->second.push_back(&d);
  }
  auto skip = [](const DeferredCall* d) {
    if (d->step.skipped) d->step.skipped();
  };
  if (goneCalls) {
    for (const auto& [comm, list] : perComm)
      for (const DeferredCall* d : list) skip(d);
    perComm.clear();
  }
  std::vector<std::thread> threads;
  bool background = false;
  for (ncclComm_t c : live) {
    if (c->blocking) threads.emplace_back([c] { c->runInit(); });
    else c->initThread = std::thread([c] { c->runInit(); });
    background |= !c->blocking;
  }
  std::vector<std::exception_ptr> errors(perComm.size());
  std::vector<int> inProgress(perComm.size(), 0);
  auto asJob = [&](ncclComm_t c) {
    return !c->blocking &&
           std::none_of(ops.begin(), ops.end(), [c](const OpArgs& a) { return a.comm == c; });
  };
  for (size_t i = 0; i < perComm.size(); ++i) {
    const auto& list = perComm[i].second;
    if (!asJob(perComm[i].first)) continue;
    // A non-blocking communicator's calls: its job, not waited for.
    std::vector<JobStep> steps;
    for (const DeferredCall* d : list) steps.push_back(d->step);
    try {
      startJob(perComm[i].first, std::move(steps));
      inProgress[i] = 1;
    } catch (...) {
      errors[i] = std::current_exception();
      for (const DeferredCall* d : list) skip(d);
    }
  }
  for (size_t i = 0; i < perComm.size(); ++i)
    if (!asJob(perComm[i].first)) threads.emplace_back([&, i] {
      const auto& list = perComm[i].second;
      size_t j = 0;
      try {
        for (; j < list.size(); ++j) {
          const JobStep& step = list[j]->step;
          inProgress[i] |= step.run(step.newcomm) == ncclInProgress;
        }
      } catch (...) {
        errors[i] = std::current_exception();
        for (++j; j < list.size(); ++j) skip(list[j]);
      }
    });
  for (auto& t : threads) t.join();
  // An init's failure first; a recorded call's failure is added to its message, as either
  // may have caused the other (a split whose parent failed its init; a new rank whose grow
  // was called off by the existing ranks' failed ncclCommGrow).
  std::string callError;
  for (const std::exception_ptr& e : errors) {
    if (!e || !callError.empty()) continue;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      callError = x.what();
    }
  }
  for (ncclComm_t c : live)
    if (c->blocking && c->asyncError.load() != ncclSuccess) {
      std::lock_guard<std::mutex> lock(c->errMu);
      throw Error(static_cast<Code>(c->asyncError.load()),
                  callError.empty() ? c->lastError
                                    : c->lastError + " (and a recorded call failed: " + callError + ")");
    }
  LOOM_CHECK_USAGE(goneInits == 0,
                   "ncclGroupEnd: %zu of the group's %zu communicator inits were aborted or "
                   "destroyed before the group ended",
                   goneInits, inits.size());
  LOOM_CHECK_USAGE(goneCalls == 0,
                   "ncclGroupEnd: the communicators of %zu of the group's %zu recorded %s calls "
                   "were aborted or destroyed before the group ended (no call of the group ran)",
                   goneCalls, calls.size(), calls.empty() ? "" : calls[0].step.fn);
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return background || std::find(inProgress.begin(), inProgress.end(), 1) != inProgress.end();
}

}  // namespace

double estimateGroupMicros(const std::vector<OpArgs>& ops) {
  const auto scopes = enterEach(ops);
  // Each communicator runs its operations one after another; communicators run side by
  // side, so the group takes as long as its slowest communicator.
  std::vector<std::pair<ncclComm_t, std::vector<CollRequest>>> perComm;
  for (const OpArgs& a : ops) {
    auto it = std::find_if(perComm.begin(), perComm.end(), [&](const auto& p) { return p.first == a.comm; });
    if (it == perComm.end()) it = perComm.insert(perComm.end(), {a.comm, {}});
    it->second.push_back({a.coll, a.count, dtypeSize(static_cast<int>(a.dtype)), a.root});
  }
  double slowest = 0;
  for (auto& [comm, reqs] : perComm) {
    waitInitOrThrow(comm, "ncclGroupSimulateEnd");
    LOOM_CHECK_USAGE(comm->core != nullptr,
                     "ncclGroupSimulateEnd: communicator %p failed to initialize", static_cast<void*>(comm));
    slowest = std::max(slowest, estimateMicros(reqs, comm->core->planContext()));
  }
  return slowest;
}

bool inGroup() { return tlsGroup.depth > 0; }

namespace {

// submit() with the profiler plugin's API events of a call Loom serves (stock NCCL reports
// its own).
void submitProfiled(const OpArgs& args, Profiler* prof) {
  GroupState& g = tlsGroup;
  OpArgs op = args;
  const bool captured = capturing(op);
  if (!g.groupApiComm) {
    // As NCCL's: 1 for a lone call's implicit group, more inside the caller's groups.
    g.groupApi = prof->startGroupApi(g.depth - g.internal + 1, captured);
    g.groupApiComm = op.comm;
    g.groupApiSerial = op.comm->serial;
  }
  op.profApi = op.isSend || op.isRecv
                   ? prof->startP2pApi(g.groupApi, op.isSend, op.count, static_cast<int>(op.dtype), op.stream,
                                       captured)
                   : prof->startCollApi(g.groupApi, op.coll, op.count, static_cast<int>(op.dtype), op.root,
                                        op.stream, captured);
  prof->stop(op.profApi);  // the call itself ends here
  if (inGroup()) {
    g.ops.push_back(op);
    g.ops.back().serial = op.comm->serial;  // the recording call is counted in it
    return;
  }
  GroupApiEnd end(g);
  launchOne(op);
}

}  // namespace

void submit(const OpArgs& op) {
  if (Profiler* prof = onStock(op) ? nullptr : op.comm->profiler.get(); __builtin_expect(prof != nullptr, 0))
    return submitProfiled(op, prof);
  if (inGroup()) {
    tlsGroup.ops.push_back(op);
    tlsGroup.ops.back().serial = op.comm->serial;  // the recording call is counted in it
    return;
  }
  launchOne(op);
}

void joinStockGroup(ncclComm_t comm, std::function<void()> then) {
  GroupState& g = tlsGroup;
  if (!g.stockLib) {
    startStockGroup(comm->shadow->lib());  // one per process
    g.stockLib = &comm->shadow->lib();
  }
  if (std::none_of(g.stockComms.begin(), g.stockComms.end(),
                   [&](const DeferredInit& d) { return d.comm == comm; }))
    g.stockComms.push_back({comm, comm->serial});
  if (then) g.stockThens.push_back(std::move(then));
}

void deferInit(ncclComm_t comm) { tlsGroup.inits.push_back({comm, comm->serial}); }

InternalGroup::InternalGroup() { ++tlsGroup.internal; }
InternalGroup::~InternalGroup() { --tlsGroup.internal; }

void deferCall(ncclComm_t comm, const char* fn, ncclComm_t* newcomm,
               std::function<ncclResult_t(ncclComm_t* out)> run, std::function<void()> skipped) {
  tlsGroup.calls.push_back({comm, comm->serial, {fn, newcomm, std::move(run), std::move(skipped)}});
}

}  // namespace loom::api

using loom::api::guard;

LOOM_NCCL_API ncclResult_t ncclGroupStart(void) {
  return guard("ncclGroupStart", nullptr, [&] {
    loom::api::tlsGroup.depth++;
    return ncclSuccess;
  });
}

namespace loom::api {
namespace {

// Closes the stock group joinStockGroup opened: its calls run (stock NCCL's group end), the
// non-blocking shadows among them settle, then the notes run.
void closeStockGroup(GroupState& g) {
  if (!g.stockLib) return;
  const dispatch::StockNccl& lib = *g.stockLib;
  std::vector<DeferredInit> comms = std::move(g.stockComms);
  std::vector<std::function<void()>> thens = std::move(g.stockThens);
  g.stockLib = nullptr;
  g.stockComms.clear();
  g.stockThens.clear();
  std::vector<std::unique_ptr<CallScope>> scopes;
  std::vector<ncclComm_t> live;  // aborted meanwhile: its own error says so
  for (const DeferredInit& d : comms) {
    if (!enterCall(d.comm, d.serial)) continue;
    scopes.push_back(std::make_unique<CallScope>(CallScope::kEntered, d.comm));
    live.push_back(d.comm);
  }
  const ncclResult_t rc = endStockGroup(lib, live);
  if (rc != ncclSuccess)
    throwError(static_cast<Code>(rc), "stock ncclGroupEnd (window registrations or device "
               "communicators of %zu communicators): %s", comms.size(),
               lib.errorText(rc, nullptr).c_str());
  for (auto& then : thens) then();
}

// The outermost end closes the stock group of the calls that joined one, runs the group's
// communicator inits, then launches its operations, or, with `sim`, prices them instead.
ncclResult_t endGroup(const char* fn, ncclSimInfo_t* sim) {
  auto& g = tlsGroup;
  LOOM_CHECK_USAGE(g.depth > 0, "%s: no matching ncclGroupStart", fn);
  if (--g.depth > 0) return ncclSuccess;
  GroupApiEnd profEnd(g);
  std::vector<DeferredCall> calls = std::move(g.calls);
  std::vector<DeferredInit> inits = std::move(g.inits);
  std::vector<OpArgs> ops = std::move(g.ops);
  g.calls.clear();
  g.inits.clear();
  g.ops.clear();
  std::exception_ptr stockFailed;
  try {
    closeStockGroup(g);
  } catch (...) {
    stockFailed = std::current_exception();
  }
  const bool background = (!inits.empty() || !calls.empty()) && runDeferred(inits, calls, ops);
  if (stockFailed) std::rethrow_exception(stockFailed);
  if (sim) sim->estimatedTime = static_cast<float>(estimateGroupMicros(ops));
  else if (!ops.empty()) launch(ops);
  return background ? ncclInProgress : ncclSuccess;
}

}  // namespace
}  // namespace loom::api

LOOM_NCCL_API ncclResult_t ncclGroupEnd(void) {
  return guard("ncclGroupEnd", nullptr, [&] { return loom::api::endGroup("ncclGroupEnd", nullptr); });
}

LOOM_NCCL_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  return guard("ncclGroupSimulateEnd", nullptr, [&] {
    LOOM_CHECK_ARG(simInfo != nullptr, "ncclGroupSimulateEnd: simInfo is NULL");
    LOOM_CHECK_ARG(simInfo->magic == 0x74685283u,
                   "ncclGroupSimulateEnd: simInfo was not set up with NCCL_SIM_INFO_INITIALIZER "
                   "(magic 0x%x)", simInfo->magic);
    return loom::api::endGroup("ncclGroupSimulateEnd", simInfo);
  });
}

// The pncclX profiling names (nccl.h declares both; NCCL exports both).
LOOM_NCCL_PROFILING_ALIAS(ncclGroupStart);
LOOM_NCCL_PROFILING_ALIAS(ncclGroupEnd);
LOOM_NCCL_PROFILING_ALIAS(ncclGroupSimulateEnd);
