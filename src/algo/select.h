// Turns a collective request into a plan: picks the algorithm (among those NCCL_ALGO /
// LOOM_ALGO allow, the fastest by the tuner's cost model for this communicator's hosts)
// and builds that algorithm's plan. An algorithm that cannot serve a request falls through
// to the next one, never to a wrong result.
#pragma once

#include <array>
#include <cstddef>

#include "algo/collective.h"
#include "algo/cost_model.h"
#include "algo/hierarchical.h"
#include "algo/plan.h"
#include "algo/ring.h"

namespace loom {

struct CollRequest {
  Collective coll;
  size_t count;    // elements per rank, as the NCCL call counts them
  size_t eltSize;
  int root = 0;
};

constexpr int kAlgoCount = static_cast<int>(Algorithm::kCount);
constexpr int kSizeBuckets = 41;  // message sizes up to 2^40 bytes, by power of two

struct PlanContext {
  int rank = 0;
  int nranks = 1;
  const Ring* ring = nullptr;  // all ranks, each host's ranks adjacent
  HostLayout layout;           // which ranks share a host
  size_t slotBytes = 256 << 10;
  int depth = 8;
  // Per collective: which algorithms NCCL_ALGO allows (read once per communicator).
  std::array<std::array<bool, kAlgoCount>, static_cast<size_t>(Collective::kCount)> allowed;
  // Per collective and size bucket (ceil(log2 bytes)): the algorithms fastest first by the
  // cost model, and their predicted times (us; < 0: the model rules it out).
  struct Ranking {
    std::array<Algorithm, kAlgoCount> order;
    std::array<double, kAlgoCount> us;
  };
  std::array<std::array<Ranking, kSizeBuckets>, static_cast<size_t>(Collective::kCount)> ranking;
  std::string modelNotes;  // the host model's figures, for TUNING logs

  PlanContext();
  // Reads NCCL_ALGO / LOOM_ALGO into `allowed`; throws kInvalidArgument on bad syntax.
  void loadAlgoFilter();
  // Ranks the algorithms for every collective and size with the cost model of this host
  // (the same model on every rank, so every rank picks the same algorithm).
  void loadTuning(const algo::NodeModel& node);
};

// Whether `algo` can run this request at all.
bool canServe(Algorithm algo, const CollRequest& req, const PlanContext& ctx);
// The algorithm that will run: the size rule's preference among those allowed and able.
Algorithm selectAlgorithm(const CollRequest& req, const PlanContext& ctx);
Plan buildPlan(const CollRequest& req, const PlanContext& ctx, Algorithm algo);

}  // namespace loom
