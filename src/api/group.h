// Group semantics: between ncclGroupStart and the matching ncclGroupEnd, operations and
// communicator inits are collected per thread and launched together.
#pragma once

#include <nccl.h>

#include <functional>
#include <vector>

#include "algo/collective.h"
#include "base/mem_kind.h"

namespace loom::api {

struct OpArgs {
  Collective coll;
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  ncclDataType_t dtype;
  ncclRedOp_t op;
  int root;  // root, or peer for send/recv
  bool isSend = false;
  bool isRecv = false;
  ncclComm_t comm;
  MemKind mem = MemKind::kHost;  // of the buffers, classified by the entry point
  cudaStream_t stream = nullptr;
  // comm's registration serial, noted when a group records the call: the group's end
  // enters that communicator, not one made since at a freed one's address.
  uint64_t serial = 0;
  void* profApi = nullptr;  // the call's profiler API event (engine/profiler_plugin.h)
};

bool inGroup();
// While alive: the group an entry point opens around its own sends and receives (all-to-all,
// gather, scatter) is part of the call, not a group of the caller's (a profiler plugin's
// GroupApi depth, as NCCL's).
struct InternalGroup {
  InternalGroup();
  ~InternalGroup();
  InternalGroup(const InternalGroup&) = delete;
  InternalGroup& operator=(const InternalGroup&) = delete;
};
// Queues an op in the current group, or launches it alone when no group is open.
void submit(const OpArgs& op);
// Queues a deferred communicator init to run (concurrently with the group's others) at
// the outermost ncclGroupEnd.
void deferInit(ncclComm_t comm);
// Queues a management call of `comm` (ncclCommSplit) to run at the outermost ncclGroupEnd,
// on a thread of its own beside the group's other such calls (one thread driving several
// ranks splits them together), after the group's inits, before its operations. It runs as a
// call of `comm` (counted in it), or fails the group end if `comm` was aborted meanwhile.
// `run` makes the call's new communicator into the pointer it is given: `newcomm` (the
// caller's), or, for a non-blocking `comm`, one whose value its job (api/mgmt_job.h) sets
// into `newcomm` when the job ends: a non-blocking communicator's recorded calls run as its
// job, and the group's end does not wait for them (unless the group also has operations on
// that communicator, which then run after them). `run` returns ncclInProgress where it
// leaves work in the background (a non-blocking communicator's init); the group end then
// returns ncclInProgress too, as it does when a job was started.
// `skipped`, if given, runs instead when the call does not run (another recorded call's
// communicator was gone at the end, or an earlier call of its communicator failed), its
// communicator still entered.
void deferCall(ncclComm_t comm, const char* fn, ncclComm_t* newcomm,
               std::function<ncclResult_t(ncclComm_t* out)> run, std::function<void()> skipped = {});
// Inside a group: stock NCCL calls on `comm`'s shadow made from now on (window
// registration, the device API) join a stock NCCL group on this thread, as NCCL defers such
// calls to the group's end. The outermost end closes it first (before the group's inits,
// management calls and operations) and settles non-blocking shadows; then each `then` given
// since runs (a window's note), unless the stock group failed.
void joinStockGroup(ncclComm_t comm, std::function<void()> then = nullptr);
// The cost model's time (microseconds) for a group's operations: what
// ncclGroupSimulateEnd reports.
double estimateGroupMicros(const std::vector<OpArgs>& ops);

}  // namespace loom::api
