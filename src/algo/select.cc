#include "algo/select.h"

#include "algo/direct.h"
#include "algo/halving_doubling.h"
#include "algo/tree.h"
#include "algo/tuner.h"
#include "base/error.h"
#include "base/log.h"

namespace loom {

void PlanContext::loadAlgoFilter() {
  for (int c = 0; c < static_cast<int>(Collective::kCount); ++c) {
    algo::AlgoFilter f = algo::filterFromEnv(static_cast<Collective>(c));
    allowed[c] = f.algorithms;
  }
}

bool canServe(Algorithm algo, const CollRequest& req, const PlanContext& ctx) {
  size_t bytes = req.count * req.eltSize;
  switch (req.coll) {
    case Collective::kAllReduce:
      switch (algo) {
        case Algorithm::kRing:
        case Algorithm::kTree:
        case Algorithm::kHalvingDoubling: return true;
        // One-shot sends everything before receiving: it must fit in a FIFO.
        case Algorithm::kDirect: return bytes <= ctx.slotBytes * ctx.depth;
        default: return false;
      }
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kBroadcast:
    case Collective::kReduce: return algo == Algorithm::kRing;
    default: return algo == Algorithm::kDirect;
  }
}

Algorithm selectAlgorithm(const CollRequest& req, const PlanContext& ctx) {
  size_t bytes = req.count * req.eltSize;
  Algorithm order[4] = {Algorithm::kRing, Algorithm::kTree, Algorithm::kHalvingDoubling,
                        Algorithm::kDirect};
  // The size rule: one-shot for tiny messages, halving-doubling while latency dominates,
  // trees for mid sizes on many ranks, the bandwidth-optimal ring for the rest.
  Algorithm pref = Algorithm::kRing;
  if (req.coll == Collective::kAllReduce && ctx.nranks > 1) {
    if (bytes <= (32u << 10)) pref = Algorithm::kDirect;
    else if (bytes <= (512u << 10)) pref = Algorithm::kHalvingDoubling;
    else if (ctx.nranks >= 8 && bytes <= (4u << 20)) pref = Algorithm::kTree;
  }
  const auto& allowed = ctx.allowed[static_cast<size_t>(req.coll)];
  auto ok = [&](Algorithm a) { return allowed[static_cast<size_t>(a)] && canServe(a, req, ctx); };
  if (ok(pref)) return pref;
  for (Algorithm a : order)
    if (ok(a)) return a;
  // NCCL_ALGO left nothing that can serve: run correctly anyway and say so.
  for (Algorithm a : order)
    if (canServe(a, req, ctx)) {
      LOOM_INFO(kLogTuning, "%s of %zu bytes: no allowed algorithm can serve it; using %s",
                collectiveName(req.coll), bytes, algorithmName(a));
      return a;
    }
  if (canServe(Algorithm::kDirect, req, ctx)) return Algorithm::kDirect;
  LOOM_THROW(kInternalError, "no algorithm serves %s", collectiveName(req.coll));
}

Plan buildPlan(const CollRequest& req, const PlanContext& ctx, Algorithm algo) {
  const Ring& ring = *ctx.ring;
  size_t n = req.count, e = req.eltSize;
  // Exchanges and tree chunks stay within half a FIFO so the two ends of a link never
  // wait on each other.
  size_t half = ctx.slotBytes * ctx.depth / 2;
  switch (req.coll) {
    case Collective::kAllReduce:
      switch (algo) {
        case Algorithm::kTree: return treeAllReduce(ctx.nranks, ctx.rank, n, e, ctx.slotBytes * 2);
        case Algorithm::kHalvingDoubling:
          return halvingDoublingAllReduce(ctx.nranks, ctx.rank, n, e, half);
        case Algorithm::kDirect: return directAllReduce(ctx.nranks, ctx.rank, n, e);
        default: return ringAllReduce(ring, n, e, half);
      }
    case Collective::kAllGather: return ringAllGather(ring, ctx.rank, n, e, half);
    case Collective::kReduceScatter: return ringReduceScatter(ring, ctx.rank, n, e, half);
    case Collective::kBroadcast: return ringBroadcast(ring, ctx.rank, req.root, n, e);
    case Collective::kReduce: return ringReduce(ring, ctx.rank, req.root, n, e);
    default: break;
  }
  LOOM_THROW(kInternalError, "%s has no plan builder", collectiveName(req.coll));
}

}  // namespace loom
