// Selection is a pure function (DESIGN.md, decision 8): topology + collective + size +
// ranks -> algorithm, protocol, channels and chunking, from the cost model. NCCL_ALGO /
// NCCL_PROTO (or LOOM_ALGO / LOOM_PROTO) restrict the candidates with NCCL's syntax; each
// choice is explained under NCCL_DEBUG_SUBSYS=TUNING.
//
// The engine builds a NodeModel once per communicator (buildNodeModel) and calls tune()
// per collective; tune(System, ...) does both for one-off use (loom-topo, tests).
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "algo/collective.h"
#include "algo/cost_model.h"
#include "algo/tuner_hook.h"
#include "topo/system.h"

namespace loom::algo {

struct TuningRequest {
  Collective coll = Collective::kAllReduce;
  size_t bytes = 0;        // nccl-tests' "size" (see cost_model.h)
  int nranks = 1;
  int nnodes = 1;          // hosts; ranks are spread evenly (the last host may have fewer)
  bool hostMemory = false; // buffers in host memory (CPU executor)
};

struct TuningChoice {
  Algorithm algorithm = Algorithm::kRing;
  Protocol protocol = Protocol::kSimple;
  int channels = 1;
  size_t chunkBytes = 0;
  double predictedUs = 0;
  double busBw = 0;        // GB/s, nccl-tests' bus bandwidth the prediction implies
  std::string why;         // the ranking and the model's key figures, for TUNING logs
};

// Which algorithms and protocols a collective may use.
struct AlgoFilter {
  std::array<bool, static_cast<size_t>(Algorithm::kCount)> algorithms;
  std::array<bool, static_cast<size_t>(Protocol::kCount)> protocols;
  std::string restriction;  // the user's setting, "" when unrestricted

  AlgoFilter() {
    algorithms.fill(true);
    protocols.fill(true);
  }
  bool allows(Algorithm a) const { return algorithms[static_cast<size_t>(a)]; }
  bool allows(Protocol p) const { return protocols[static_cast<size_t>(p)]; }
};

// NCCL's list syntax, for one collective: "ring,tree" (only these), "^tree" (all but),
// "allreduce:tree;broadcast:ring" or "ring;allreduce:^ring" (a prefix-less first entry
// applies to every collective, later entries need a collective prefix). Names are case
// insensitive. Loom's algorithms are ring, tree, halvingdoubling (hd), direct and
// hierarchical (hier); NCCL's collnetdirect, collnetchain, nvls, nvlstree and pat are
// accepted and select nothing (Loom has no such algorithm). Throws kInvalidArgument on
// unknown names or prefixes.
AlgoFilter parseAlgoSpec(const std::string& ncclAlgo, Collective coll);
// Same syntax with protocols: LL, LL128, Simple.
AlgoFilter parseProtoSpec(const std::string& ncclProto, Collective coll);
// Both restrictions together.
AlgoFilter combine(const AlgoFilter& algos, const AlgoFilter& protos);
// From NCCL_ALGO/LOOM_ALGO and NCCL_PROTO/LOOM_PROTO.
AlgoFilter filterFromEnv(Collective coll);

// The model's cost table for one collective and size: estimate() for every algorithm and
// protocol, < 0 where the model rules it out or the executor has no such protocol.
CostTable costTable(const NodeModel& node, Collective coll, size_t bytes, int nranks, int nnodes);

// One candidate of a ranking.
struct Ranked {
  double us;  // < 0: ruled out
  Algorithm algo;
  Protocol proto;
};
constexpr int kChoiceCount = kAlgoCount * kProtoCount;
using Ranking = std::array<Ranked, kChoiceCount>;

// Every (algorithm, protocol) of a cost table, fastest first; ties keep the enum order
// (Ring, Tree, ...; Simple, LL, LL128) and the ruled-out come last in that order. The one
// ordering both tune() and the communicator's selector (select.h) use.
Ranking rankCosts(const CostTable& table);

// The fastest allowed (algorithm, protocol) by the cost model. AlltoAll, Gather, Scatter
// and SendRecv have one algorithm (Direct), which NCCL_ALGO does not govern (as in NCCL).
// Throws kInvalidUsage, naming each candidate and why it cannot serve, when the filter
// leaves nothing feasible.
TuningChoice tune(const NodeModel& node, const TuningRequest& req, const AlgoFilter& allowed = {});
TuningChoice tune(const topo::System& sys, const TuningRequest& req, const AlgoFilter& allowed = {});

// Local ranks per host for a request (ceil(nranks / nnodes)).
int localRanksOf(const TuningRequest& req);

}  // namespace loom::algo
