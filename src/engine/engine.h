// The engine's one entry point. The API checks arguments and keeps group bookkeeping,
// then hands every operation of a call or of a group here:
//
//   enqueue(ops) -> per communicator, in issue order:
//     select + plan (PlanCache)      collectives; a group's sends/receives form one plan
//     connect                         the connections the plans need, made once
//     bind                            plan + buffers + reduction = Task
//     Executor::launch                CPU executor for host memory -> Work
//
// Operations of several communicators in one group run together, so ranks of one process
// driven by one thread (ncclCommInitAll) make progress together.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "engine/op.h"
#include "engine/work.h"

namespace loom {

// Runs (kBeforeReturn) or launches (kAsync) `ops`. Throws loom::Error; a failure while
// running poisons the communicators involved (their connections are closed so that peers
// fail promptly too). kAsync takes the operations of one communicator only.
std::shared_ptr<Work> enqueue(std::span<const Op> ops,
                              Completion completion = Completion::kBeforeReturn);

// The profiler plugin's task events (engine/profiler_plugin.h) of operations that the host
// engine runs later, made now on the calling thread as NCCL makes them when a call is
// queued (the staged path): each op's profTask, profQueued set.
void profileQueued(std::span<Op> ops);

struct Plan;
// The plan of a group's sends and receives on one communicator (absolute buffer addresses,
// so made per call): a channel per (direction, peer), connection 0 of each peer, so that
// messages to one peer stay in order; sends to this rank copied to its receives; those of
// 0 bytes left out.
// Throws loom::Error (kInvalidUsage: unmatched sends and receives to this rank).
std::shared_ptr<const Plan> p2pPlan(int rank, const std::vector<const Op*>& ops);

}  // namespace loom
