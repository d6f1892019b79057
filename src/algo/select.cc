#include "algo/select.h"

#include <algorithm>

#include "algo/direct.h"
#include "algo/halving_doubling.h"
#include "algo/hierarchical.h"
#include "algo/tree.h"
#include "algo/tuner.h"
#include "base/error.h"
#include "base/log.h"

namespace loom {

PlanContext::PlanContext() {
  for (auto& a : allowed) a.fill(true);
  for (auto& perSize : ranking)
    for (Ranking& r : perSize) {
      for (int a = 0; a < kAlgoCount; ++a) r.order[a] = static_cast<Algorithm>(a);
      r.us.fill(-1);
    }
}

void PlanContext::loadAlgoFilter() {
  for (int c = 0; c < static_cast<int>(Collective::kCount); ++c) {
    algo::AlgoFilter f = algo::filterFromEnv(static_cast<Collective>(c));
    allowed[c] = f.algorithms;
  }
}

namespace {

// nccl-tests' "size" of a request, which the cost model takes (see cost_model.h).
size_t modelBytes(Collective coll, size_t bytes, int nranks) {
  switch (coll) {
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAlltoAll:
    case Collective::kGather:
    case Collective::kScatter: return bytes * nranks;
    default: return bytes;
  }
}

int bucketOf(size_t bytes) {
  int k = 0;
  while (k + 1 < kSizeBuckets && (size_t{1} << k) < bytes) ++k;
  return k;
}

}  // namespace

void PlanContext::loadTuning(const algo::NodeModel& node) {
  modelNotes = strprintf("host memory, %d rank(s) per host over %s at %.1f GB/s, hosts joined by %s at %.2f GB/s",
                         node.localRanks, algo::linkClassName(node.intra), node.ringBw,
                         algo::linkClassName(node.inter), node.netBw);
  if (!node.notes.empty()) modelNotes += "; " + node.notes;
  int nnodes = layout.nhosts();
  for (int c = 0; c < static_cast<int>(Collective::kCount); ++c)
    for (int k = 0; k < kSizeBuckets; ++k) {
      Ranking& r = ranking[c][k];
      size_t bytes = modelBytes(static_cast<Collective>(c), size_t{1} << k, nranks);
      for (int a = 0; a < kAlgoCount; ++a) {
        // The CPU executor moves data in Simple-protocol slots only.
        algo::Estimate e = algo::estimate(node, static_cast<Collective>(c), static_cast<Algorithm>(a),
                                          Protocol::kSimple, bytes, nranks, nnodes);
        r.us[a] = e.feasible ? e.us : -1;
      }
      std::stable_sort(r.order.begin(), r.order.end(), [&](Algorithm x, Algorithm y) {
        double ux = r.us[static_cast<int>(x)], uy = r.us[static_cast<int>(y)];
        if ((ux < 0) != (uy < 0)) return uy < 0;  // ruled out last
        return ux < uy;
      });
    }
}

bool canServe(Algorithm algo, const CollRequest& req, const PlanContext& ctx) {
  size_t bytes = req.count * req.eltSize;
  bool multiHost = ctx.layout.nhosts() > 1;
  switch (req.coll) {
    case Collective::kAllReduce:
      switch (algo) {
        case Algorithm::kRing:
        case Algorithm::kTree:
        case Algorithm::kHalvingDoubling: return true;
        // One-shot sends everything before receiving: it must fit in a FIFO.
        case Algorithm::kDirect: return bytes <= ctx.slotBytes * ctx.depth;
        case Algorithm::kHierarchical: return multiHost;
        default: return false;
      }
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kBroadcast:
    case Collective::kReduce:
      return algo == Algorithm::kRing || (algo == Algorithm::kHierarchical && multiHost);
    default: return algo == Algorithm::kDirect;
  }
}

Algorithm selectAlgorithm(const CollRequest& req, const PlanContext& ctx) {
  size_t bytes = req.count * req.eltSize;
  const int c = static_cast<int>(req.coll);
  const PlanContext::Ranking& r = ctx.ranking[c][bucketOf(modelBytes(req.coll, bytes, ctx.nranks))];
  const auto& allowed = ctx.allowed[c];
  auto ok = [&](Algorithm a) { return allowed[static_cast<size_t>(a)] && canServe(a, req, ctx); };
  Algorithm chosen = Algorithm::kCount;
  for (Algorithm a : r.order)
    if (ok(a)) {
      chosen = a;
      break;
    }
  if (chosen == Algorithm::kCount) {
    // NCCL_ALGO left nothing that can serve: run correctly anyway and say so.
    for (Algorithm a : r.order)
      if (canServe(a, req, ctx)) {
        LOOM_INFO(kLogTuning, "%s of %zu bytes: no allowed algorithm can serve it; using %s",
                  collectiveName(req.coll), bytes, algorithmName(a));
        return a;
      }
    LOOM_THROW(kInternalError, "no algorithm serves %s", collectiveName(req.coll));
  }
  if (logEnabled(LogLevel::kInfo, kLogTuning)) {
    std::string why;
    for (Algorithm a : r.order) {
      double us = r.us[static_cast<int>(a)];
      const char* note = !allowed[static_cast<size_t>(a)] ? " (excluded by NCCL_ALGO)"
                         : !canServe(a, req, ctx)        ? " (cannot serve this call)"
                                                         : "";
      if (us < 0) why += strprintf(", %s ruled out by the model%s", algorithmName(a), note);
      else why += strprintf(", %s %.1f us%s", algorithmName(a), us, note);
    }
    LOOM_INFO(kLogTuning, "%s of %zu bytes per rank, %d ranks on %d host(s) -> %s; predicted: %s; model: %s",
              collectiveName(req.coll), bytes, ctx.nranks, ctx.layout.nhosts(), algorithmName(chosen),
              why.c_str() + 2, ctx.modelNotes.c_str());
  }
  return chosen;
}

Plan buildPlan(const CollRequest& req, const PlanContext& ctx, Algorithm algo) {
  const Ring& ring = *ctx.ring;
  size_t n = req.count, e = req.eltSize;
  // Exchanges and tree chunks stay within half a FIFO so the two ends of a link never
  // wait on each other.
  size_t half = ctx.slotBytes * ctx.depth / 2;
  if (algo == Algorithm::kHierarchical) {
    switch (req.coll) {
      case Collective::kAllReduce: return hierarchicalAllReduce(ctx.layout, n, e, half);
      case Collective::kAllGather: return hierarchicalAllGather(ctx.layout, n, e, half);
      case Collective::kReduceScatter: return hierarchicalReduceScatter(ctx.layout, n, e, half);
      case Collective::kBroadcast: return hierarchicalBroadcast(ctx.layout, req.root, n, e, half);
      case Collective::kReduce: return hierarchicalReduce(ctx.layout, req.root, n, e, half);
      default: break;
    }
  }
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
