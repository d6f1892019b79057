// Turns a collective request into a plan: picks the algorithm (NCCL_ALGO / LOOM_ALGO first,
// then a size rule; the topology-aware tuner takes over when it is wired in) and builds
// that algorithm's plan. An algorithm that cannot serve a request falls through to the
// next one, never to a wrong result.
#pragma once

#include <array>
#include <cstddef>

#include "algo/collective.h"
#include "algo/plan.h"
#include "algo/ring.h"

namespace loom {

struct CollRequest {
  Collective coll;
  size_t count;    // elements per rank, as the NCCL call counts them
  size_t eltSize;
  int root = 0;
};

struct PlanContext {
  int rank = 0;
  int nranks = 1;
  const Ring* ring = nullptr;
  size_t slotBytes = 256 << 10;
  int depth = 8;
  // Per collective: which algorithms NCCL_ALGO allows (read once per communicator).
  std::array<std::array<bool, static_cast<size_t>(Algorithm::kCount)>,
             static_cast<size_t>(Collective::kCount)>
      allowed;

  PlanContext() {
    for (auto& a : allowed) a.fill(true);
  }
  // Reads NCCL_ALGO / LOOM_ALGO into `allowed`; throws kInvalidArgument on bad syntax.
  void loadAlgoFilter();
};

// Whether `algo` can run this request at all.
bool canServe(Algorithm algo, const CollRequest& req, const PlanContext& ctx);
// The algorithm that will run: the size rule's preference among those allowed and able.
Algorithm selectAlgorithm(const CollRequest& req, const PlanContext& ctx);
Plan buildPlan(const CollRequest& req, const PlanContext& ctx, Algorithm algo);

}  // namespace loom
