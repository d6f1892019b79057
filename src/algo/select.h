// The one selector: a collective request and a communicator's context -> the algorithm,
// protocol, channels and chunk size that run it (select), and the plan that does
// (buildPlan). The engine and loom-topo both call it.
//
// At communicator creation the context ranks every (algorithm, protocol) for every
// collective and power-of-two size with the cost model of its hosts (the same model on
// every rank, so every rank picks the same), after an optional tuner hook has adjusted the
// costs. A call takes the first candidate of its size's ranking that NCCL_ALGO / NCCL_PROTO
// (LOOM_ALGO / LOOM_PROTO) allow and that the executor can run for it; the channels and
// chunk size come from the cost model's plan shape for that candidate at the call's exact
// size, or from the tuner hook for the size class where it set them. An algorithm that
// cannot serve a request falls through to the next one, never to a wrong result.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "algo/collective.h"
#include "algo/cost_model.h"
#include "algo/hierarchical.h"
#include "algo/plan.h"
#include "algo/ring.h"
#include "algo/tuner.h"
#include "algo/tuner_hook.h"

namespace loom {

struct CollRequest {
  Collective coll;
  size_t count;    // elements per rank, as the NCCL call counts them
  size_t eltSize;
  int root = 0;
};

struct Selection {
  Algorithm algorithm = Algorithm::kRing;
  Protocol protocol = Protocol::kSimple;  // always Simple on the CPU executor (host memory)
  int channels = 1;                       // pipelines run at once, each on its own connections
  size_t chunkBytes = 0;                  // the most one step of a channel carries

  bool operator==(const Selection&) const = default;
};

constexpr int kSizeBuckets = 41;  // message sizes up to 2^40 bytes, by power of two

// A hook may ask for more channels than any host keeps busy; past this, each channel's
// connections cost more than the parallelism gains. NCCL's channel limit too (MAXCHANNELS).
constexpr int kMaxPlanChannels = 64;

class KnobBase;
// NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS, NCCL_MIN_CTAS and NCCL_MAX_CTAS (job-wide knobs).
const std::vector<const KnobBase*>& channelBoundKnobs();

struct PlanContext {
  int rank = 0;
  int nranks = 1;
  // Channel c's ring of all ranks: rings[c % rings.size()]. Each visits a host's ranks in
  // a row (hosts in layout order), within a host in the order of one of the intra-host
  // rings the topology search found (node.ringOrders), channels taking them in turn.
  std::vector<Ring> rings;
  const Ring& ring(int channel = 0) const { return rings[static_cast<size_t>(channel) % rings.size()]; }
  HostLayout layout;           // which ranks share a host
  size_t slotBytes = 256 << 10;
  int depth = 8;
  // Per collective: which algorithms NCCL_ALGO and which protocols NCCL_PROTO allow (read
  // once per communicator).
  std::array<std::array<bool, kAlgoCount>, kCollectiveCount> allowed;
  std::array<std::array<bool, kProtoCount>, kCollectiveCount> allowedProtocols;
  // The host model the ranking came from; hostMemory: the CPU executor runs the plans.
  algo::NodeModel node;
  // Per collective and size bucket (ceil(log2 bytes)): every (algorithm, protocol) fastest
  // first by the cost model (us < 0: ruled out), a tuner hook's channel count (0: the
  // model's) and its chunk per candidate (0: the model's at the call's size; else already
  // clamped to algo::chunkCeiling, and every call of the bucket runs it).
  struct Ranking {
    algo::Ranking order;
    int channels = 0;
    std::array<std::array<size_t, kProtoCount>, kAlgoCount> chunk{};
  };
  std::array<std::array<Ranking, kSizeBuckets>, kCollectiveCount> ranking;
  std::string modelNotes;  // the host model's figures, for TUNING logs
  algo::TunerHook* tuner = nullptr;  // the hook the ranking was made with (not owned; null: none)
  // NCCL's channel bounds (NCCL_MIN_NCHANNELS / NCCL_MIN_CTAS, NCCL_MAX_NCHANNELS /
  // NCCL_MAX_CTAS): the GPU model's channel pool lies within them (loadTuning); every plan,
  // a tuner's count included, runs at most maxChannels.
  int minChannels = 1;
  int maxChannels = kMaxPlanChannels;
  // The CTA bounds in force (0: none; NCCL_MIN_CTAS / NCCL_MAX_CTAS, else ncclConfig_t's
  // minCTAs / maxCTAs, clamped) and whether the config set them: what ranks compare.
  int minCtas = 0, maxCtas = 0;
  bool minCtasFromConfig = false, maxCtasFromConfig = false;

  PlanContext();
  // Reads NCCL_ALGO / LOOM_ALGO and NCCL_PROTO / LOOM_PROTO into `allowed*`; throws
  // kInvalidArgument on bad syntax.
  void loadAlgoFilter();
  // Reads the channel bounds into min/maxChannels as NCCL reads them (out-of-range values
  // clamped, never refused; a minimum over a maximum of the CTA pair lowered to it); call
  // before loadTuning. `configMin/MaxCtas` (> 0) are ncclConfig_t's minCTAs / maxCTAs,
  // which NCCL_MIN_CTAS / NCCL_MAX_CTAS override where set (> 0), as in NCCL. Throws
  // kInvalidArgument on a value that is not an integer.
  void loadChannelBounds(int configMinCtas = 0, int configMaxCtas = 0);
  // Ranks the candidates for every collective and size with the cost model of this host
  // (its FIFO shape taken from slotBytes / depth), after `hook`, if any, has adjusted each
  // cost table.
  void loadTuning(const algo::NodeModel& node, algo::TunerHook* hook = nullptr);
  // Fills `rings` from layout, rank and node (after loadTuning).
  void loadRings();
  // A checksum of `ranking` (every candidate order, channel count and chunk): ranks whose
  // digests differ would pick different plans.
  uint64_t digest() const;
};

// nccl-tests' "size" of a request of `bytes` per rank, which the cost model takes: the
// whole gathered / scattered buffer for AllGather, ReduceScatter, AlltoAll, Gather, Scatter.
size_t modelBytes(Collective coll, size_t bytes, int nranks);

// Whether the executor can run this request with `algo` (and `proto`) at all.
bool canServe(Algorithm algo, const CollRequest& req, const PlanContext& ctx);
bool canServe(Algorithm algo, Protocol proto, const CollRequest& req, const PlanContext& ctx);

// What runs this request on this communicator.
Selection select(const CollRequest& req, const PlanContext& ctx);
// The plan of this rank for the request, cut as `sel` says.
Plan buildPlan(const CollRequest& req, const PlanContext& ctx, const Selection& sel);

// select(req, ctx).algorithm.
Algorithm selectAlgorithm(const CollRequest& req, const PlanContext& ctx);
// The Simple-protocol selection of `algo` for this request (the model's channels and chunk).
Selection selectionFor(const CollRequest& req, const PlanContext& ctx, Algorithm algo);
// buildPlan(req, ctx, selectionFor(req, ctx, algo)).
Plan buildPlan(const CollRequest& req, const PlanContext& ctx, Algorithm algo);

// The cost model's prediction (microseconds) for running `reqs` one after another on this
// communicator, each with what select() picks for it: what ncclGroupSimulateEnd reports.
// Where the model rules out the algorithm that would run (NCCL_ALGO forcing one), the
// fastest candidate the model prices at that size stands in.
double estimateMicros(const std::vector<CollRequest>& reqs, const PlanContext& ctx);

}  // namespace loom
