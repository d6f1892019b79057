// Plans run without transports: every rank's plan of a collective, executed piece by piece
// as the CPU executor moves them (one FIFO slot at a time, a step that receives waiting for
// its peer's slot, a step that sends waiting for room), over in-memory FIFOs of the
// communicator's shape, one per (sender, receiver, connection). Used to check plans (size
// agreement at both ends of every message, no rank left waiting, nothing left unreceived,
// every buffer access in bounds, the collective's exact result), to print them
// (loom-topo --plan) and in tests.
//
// Data: each element of the request's type is one double. Inputs are integers, so sums
// are exact whatever the order of reduction. The reduction may be modelled as a sum with
// a pre-scaling (x -> 2x) and a final step (x -> x + 0.5), like ncclAvg's or
// ncclPreMulSum's: a plan that skips or repeats one (a wrong kSrcPartial / kDstPartial)
// gives a wrong result.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "algo/plan.h"
#include "algo/select.h"

namespace loom {

// One rank's buffers: one value per element.
struct SimBuffers {
  std::vector<double> send, recv, scratch;
};

// What one rank did.
struct SimStats {
  size_t steps = 0;           // plan steps completed, all channels
  size_t pieces = 0;          // FIFO-slot-sized pieces those steps moved or computed
  size_t bytesSent = 0;
  size_t bytesReceived = 0;
  std::vector<size_t> bytesTo;  // sent to each rank
};

struct SimOptions {
  size_t slotBytes = 256 << 10;
  int depth = 8;       // slots per FIFO; 0: unbounded
  size_t eltSize = 8;  // bytes per element (one value each)
  bool scaledReduction = false;  // model pre(x) = 2x and post(x) = x + 0.5 (see above)
  bool moveData = true;          // false: only sizes and order (buffers may be empty)
};

// Runs plans[r] (explicit ones: see expandPlan) on bufs[r] for every rank until no channel can move. Returns "" when every
// channel of every rank finished and every message was received, or what went wrong.
std::string runPlans(const std::vector<Plan>& plans, std::vector<SimBuffers>& bufs, const SimOptions& opt,
                     std::vector<SimStats>* stats = nullptr);

// Every rank's context of a job that is described rather than run (loom-topo, the
// simulator, tests): ranks on hosts as hostOf[rank] says, channel rings visiting each
// host's ranks in a row, hosts ordered by their lowest rank (as a communicator builds
// them), NCCL_ALGO / NCCL_PROTO from the environment, tuned with `node` (and `hook`).
class JobContexts {
 public:
  JobContexts(const std::vector<int>& hostOf, const algo::NodeModel& node, size_t slotBytes = 256 << 10,
              int depth = 8, algo::TunerHook* hook = nullptr);
  int nranks() const { return static_cast<int>(ctx_.size()); }
  const PlanContext& operator[](int rank) const { return *ctx_[static_cast<size_t>(rank)]; }

  // nranks ranks on nhosts hosts in contiguous blocks, as even as can be.
  static std::vector<int> contiguous(int nranks, int nhosts);

 private:
  std::vector<std::unique_ptr<PlanContext>> ctx_;
};

struct SimReport {
  Selection selection;
  std::vector<Plan> plans;      // every rank's, written out for the request's count
  std::vector<SimStats> stats;  // every rank's
  double predictedUs = -1;      // the cost model's time for the selection (< 0: not priced)
  bool dataChecked = false;     // false: too large to hold, only sizes and order
  std::string error;            // "" when every rank finished with the exact result
};

// Selects on every rank (they must agree), builds every rank's plan, runs them with the
// job's FIFO shape and checks each rank's result against the collective's definition
// (AllReduce, AllGather, ReduceScatter, Broadcast, Reduce). Values are moved only while all
// ranks' buffers hold at most maxElements values together.
SimReport simulate(const CollRequest& req, const JobContexts& job, size_t maxElements = size_t{1} << 24);
SimReport simulate(const CollRequest& req, const JobContexts& job, const Selection& sel,
                   size_t maxElements = size_t{1} << 24);

}  // namespace loom
