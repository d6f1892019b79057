#include "algo/select.h"

#include <algorithm>

#include "algo/direct.h"
#include "algo/halving_doubling.h"
#include "algo/hierarchical.h"
#include "algo/tree.h"
#include "algo/tuner.h"
#include "base/config.h"
#include "base/error.h"
#include "base/log.h"

namespace loom {

namespace {
// NCCL's channel knobs (NRINGS their legacy names; -2: unset) bound the communicator's
// channels; the CTA knobs (NCCL 2.17+; <= 0: unset) bound them too. Job-wide: ranks with
// other bounds would run other plans.
IntKnob kMinNrings("LOOM_MIN_NRINGS", "NCCL_MIN_NRINGS", -2, "Legacy name of NCCL_MIN_NCHANNELS", KnobScope::kJob);
IntKnob kMaxNrings("LOOM_MAX_NRINGS", "NCCL_MAX_NRINGS", -2, "Legacy name of NCCL_MAX_NCHANNELS", KnobScope::kJob);
IntKnob kMinNchannels("LOOM_MIN_NCHANNELS", "NCCL_MIN_NCHANNELS", -2,
                      "Fewest channels of a GPU communicator's largest messages (-2: unset; as NCCL)", KnobScope::kJob);
IntKnob kMaxNchannels("LOOM_MAX_NCHANNELS", "NCCL_MAX_NCHANNELS", -2,
                      "Most channels a plan runs (-2: unset; below 1: 1; as NCCL)", KnobScope::kJob);
IntKnob kMinCtas("LOOM_MIN_CTAS", "NCCL_MIN_CTAS", 0,
                 "Fewest channels (CUDA blocks) of a GPU communicator's largest messages (<= 0: unset; as NCCL)",
                 KnobScope::kJob);
IntKnob kMaxCtas("LOOM_MAX_CTAS", "NCCL_MAX_CTAS", 0, "Most channels (CUDA blocks) a plan runs (<= 0: unset; as NCCL)",
                 KnobScope::kJob);

// The knob's value where set (`unset` its sentinel), then its legacy name's, else `def`.
int64_t eitherOf(const IntKnob& k, const IntKnob& legacy, int64_t unset, int64_t def) {
  const int64_t v = k.get(), l = legacy.get();
  return v != unset ? v : l != unset ? l : def;
}
}  // namespace

void PlanContext::loadChannelBounds(int configMin, int configMax) {
  // As NCCL's ncclMinNchannels / ncclMaxNchannels and its CTA checks (init.cc): the
  // environment's CTA bounds replace the config's.
  const int64_t minN = std::clamp<int64_t>(eitherOf(kMinNchannels, kMinNrings, -2, 0), 0, kMaxPlanChannels);
  const int64_t maxN = std::clamp<int64_t>(eitherOf(kMaxNchannels, kMaxNrings, -2, kMaxPlanChannels), 1,
                                           kMaxPlanChannels);
  const int64_t envMin = kMinCtas.get(), envMax = kMaxCtas.get();
  minCtasFromConfig = envMin <= 0 && configMin > 0;
  maxCtasFromConfig = envMax <= 0 && configMax > 0;
  const int64_t minC0 = envMin > 0 ? envMin : std::max(configMin, 0);
  const int64_t maxC0 = envMax > 0 ? envMax : std::max(configMax, 0);
  const int64_t maxC = maxC0 > 0 ? std::min<int64_t>(maxC0, kMaxPlanChannels) : kMaxPlanChannels;
  const int64_t minC = std::min(minC0 > 0 ? std::min<int64_t>(minC0, kMaxPlanChannels) : 1, maxC);
  minCtas = minC0 > 0 ? static_cast<int>(minC) : 0;
  maxCtas = maxC0 > 0 ? static_cast<int>(maxC) : 0;
  maxChannels = static_cast<int>(std::min(maxN, maxC));
  minChannels = static_cast<int>(std::max(minN, minC));
}

const std::vector<const KnobBase*>& channelBoundKnobs() {
  static const std::vector<const KnobBase*> v = {&kMinNchannels, &kMaxNchannels, &kMinCtas,
                                                 &kMaxCtas,      &kMinNrings,    &kMaxNrings};
  return v;
}

PlanContext::PlanContext() {
  for (auto& a : allowed) a.fill(true);
  for (auto& p : allowedProtocols) p.fill(true);
  node.hostMemory = true;  // the CPU executor, until loadTuning says otherwise
  for (auto& perSize : ranking)
    for (Ranking& r : perSize) {
      size_t i = 0;
      for (int a = 0; a < kAlgoCount; ++a)
        for (int p = 0; p < kProtoCount; ++p)
          r.order[i++] = {-1, static_cast<Algorithm>(a), static_cast<Protocol>(p)};
    }
}

void PlanContext::loadAlgoFilter() {
  for (int c = 0; c < kCollectiveCount; ++c) {
    const Collective coll = static_cast<Collective>(c);
    algo::AlgoFilter f = algo::filterFromEnv(coll);
    // AlltoAll, Gather, Scatter and SendRecv have one algorithm, which NCCL_ALGO does not
    // govern (as in NCCL).
    const bool p2p = coll == Collective::kAlltoAll || coll == Collective::kGather || coll == Collective::kScatter ||
                     coll == Collective::kSendRecv;
    if (!p2p) allowed[c] = f.algorithms;
    allowedProtocols[c] = f.protocols;
  }
}

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

namespace {

int bucketOf(size_t bytes) {
  int k = 0;
  while (k + 1 < kSizeBuckets && (size_t{1} << k) < bytes) ++k;
  return k;
}

int hostsOf(const PlanContext& ctx) { return std::max(1, ctx.layout.nhosts()); }

// Whether NCCL_ALGO and NCCL_PROTO allow `x` for `coll`.
bool allowedFor(const PlanContext& ctx, Collective coll, const algo::Ranked& x) {
  const size_t c = static_cast<size_t>(coll);
  return ctx.allowed[c][static_cast<size_t>(x.algo)] && ctx.allowedProtocols[c][static_cast<size_t>(x.proto)];
}

// The channels a plan runs: a tuner hook's count when it set one, else the model's, at most
// the GPU model's channel pool (bounded at loadTuning; NCCL caps a tuner's count at its
// communicator's channels too) or, in host memory, maxChannels.
int planChannels(const PlanContext& ctx, int model, int hook) {
  if (ctx.nranks <= 1) return model;
  const int most = ctx.node.hostMemory ? ctx.maxChannels : std::max(1, ctx.node.maxChannels);
  return std::min(hook > 0 ? std::min(hook, kMaxPlanChannels) : model, most);
}

// The model's plan shape for `algo`/`proto` at this request's exact size, with a tuner
// hook's channel count and chunk for the size class where it set them.
Selection shapeOf(const CollRequest& req, const PlanContext& ctx, Algorithm algo, Protocol proto,
                  const PlanContext::Ranking& r) {
  const size_t bytes = modelBytes(req.coll, req.count * req.eltSize, ctx.nranks);
  const algo::PlanShape s = algo::planShape(ctx.node, req.coll, algo, proto, bytes, ctx.nranks);
  Selection sel{algo, proto, planChannels(ctx, s.channels, r.channels), s.chunkBytes};
  const size_t tuned = r.chunk[static_cast<size_t>(algo)][static_cast<size_t>(proto)];
  if (tuned > 0 && ctx.nranks > 1) sel.chunkBytes = tuned;
  return sel;
}

// The hook's chunk for each candidate of `t`'s size class that its table leaves feasible,
// asked about the plan that size would run (the model's chunk, the channels), and clamped
// to what the executor's buffers allow. 0 or the model's own value leave the model's chunk,
// which then follows each call's exact size; any other answer holds for the whole class.
void tuneChunks(const PlanContext& ctx, algo::TunerHook& hook, const algo::CostTable& t, PlanContext::Ranking& r) {
  if (ctx.nranks <= 1) return;
  for (const algo::Ranked& x : r.order) {
    // Only what may run: candidates the table leaves, NCCL_ALGO / NCCL_PROTO allow and the
    // executor runs (the device executor: Simple only).
    if (x.us < 0 || !allowedFor(ctx, t.coll, x) || !algo::protocolRuns(ctx.node, x.proto, hostsOf(ctx))) continue;
    const algo::PlanShape s = algo::planShape(ctx.node, t.coll, x.algo, x.proto, t.bytes, ctx.nranks);
    const algo::ChunkQuery q{t.coll, t.bytes, x.algo, x.proto, planChannels(ctx, s.channels, r.channels),
                             s.chunkBytes};
    size_t want = hook.chunkBytes(q);
    if (want == 0 || want == s.chunkBytes) continue;
    const size_t ceiling = algo::chunkCeiling(ctx.node, t.coll, x.algo, x.proto, ctx.nranks);
    if (want > ceiling) {
      LOOM_INFO(kLogTuning, "%s of %zu bytes, %s/%s: the tuner's chunk of %zu bytes exceeds the %zu bytes the "
                "buffers allow a step; clamping", collectiveName(t.coll), t.bytes, algorithmName(x.algo),
                protocolName(x.proto), want, ceiling);
      want = ceiling;
    }
    r.chunk[static_cast<size_t>(x.algo)][static_cast<size_t>(x.proto)] = want;
  }
}

const PlanContext::Ranking& rankingOf(const CollRequest& req, const PlanContext& ctx) {
  const size_t bytes = modelBytes(req.coll, req.count * req.eltSize, ctx.nranks);
  return ctx.ranking[static_cast<size_t>(req.coll)][static_cast<size_t>(bucketOf(bytes))];
}

void logChoice(const CollRequest& req, const PlanContext& ctx, const PlanContext::Ranking& r,
               const Selection& sel) {
  const size_t c = static_cast<size_t>(req.coll);
  std::string why;
  for (const algo::Ranked& x : r.order) {
    // Protocols this executor has no use for would only bury the candidates.
    if (!algo::protocolRuns(ctx.node, x.proto, hostsOf(ctx))) continue;
    const char* note = !ctx.allowed[c][static_cast<size_t>(x.algo)]            ? " (excluded by NCCL_ALGO)"
                       : !ctx.allowedProtocols[c][static_cast<size_t>(x.proto)] ? " (excluded by NCCL_PROTO)"
                       : !canServe(x.algo, x.proto, req, ctx)                   ? " (cannot serve this call)"
                                                                                : "";
    if (x.us < 0)
      why += strprintf(", %s/%s ruled out by the model%s", algorithmName(x.algo), protocolName(x.proto), note);
    else
      why += strprintf(", %s/%s %.1f us%s", algorithmName(x.algo), protocolName(x.proto), x.us, note);
  }
  LOOM_INFO(kLogTuning,
            "%s of %zu bytes per rank, %d ranks on %d host(s) -> %s/%s, %d channel(s), chunk %zu; predicted: %s; "
            "model: %s",
            collectiveName(req.coll), req.count * req.eltSize, ctx.nranks, ctx.layout.nhosts(),
            algorithmName(sel.algorithm), protocolName(sel.protocol), sel.channels, sel.chunkBytes,
            why.empty() ? "-" : why.c_str() + 2, ctx.modelNotes.c_str());
}

}  // namespace

void PlanContext::loadRings() {
  // A host's local rank i sits on GPU i % g of the g GPUs an order covers (the cost
  // model's assumption); host memory has no order: local order.
  const std::vector<std::vector<int>> none{{}};
  const auto& orders = node.ringOrders.empty() ? none : node.ringOrders;
  rings.clear();
  for (const std::vector<int>& gpus : orders) {
    Ring r;
    for (const std::vector<int>& host : layout.hosts) {
      const size_t g = gpus.size();
      if (g == 0) {
        r.order.insert(r.order.end(), host.begin(), host.end());
        continue;
      }
      for (int gpu : gpus)
        for (size_t i = static_cast<size_t>(gpu); i < host.size(); i += g) r.order.push_back(host[i]);
    }
    if (static_cast<int>(r.order.size()) != nranks)
      LOOM_THROW(kInternalError, "channel ring covers %zu of %d ranks", r.order.size(), nranks);
    r.pos = static_cast<int>(std::find(r.order.begin(), r.order.end(), rank) - r.order.begin());
    // Orders that place this job's ranks alike are one ring.
    bool seen = false;
    for (const Ring& o : rings) seen |= o.order == r.order;
    if (!seen) rings.push_back(std::move(r));
  }
}

uint64_t PlanContext::digest() const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (const auto& coll : ranking)
    for (const Ranking& r : coll) {
      mix(static_cast<uint64_t>(r.channels));
      for (const algo::Ranked& x : r.order) mix(static_cast<uint64_t>(x.algo) * 8 + static_cast<uint64_t>(x.proto));
      for (const auto& perAlgo : r.chunk)
        for (size_t c : perAlgo) mix(c);
    }
  return h;
}

void PlanContext::loadTuning(const algo::NodeModel& hostModel, algo::TunerHook* hook) {
  node = hostModel;
  tuner = hook;
  // NCCL's channel bounds set the GPU communicator's channel pool: its largest messages run
  // on at least minChannels, smaller ones on fewer, as NCCL drops channels for them. Host
  // plans have no pool (their one or two channels run on one thread): only the maximum
  // bounds them (planChannels).
  if (!node.hostMemory) node.maxChannels = std::max(std::min(node.maxChannels, maxChannels), minChannels);
  node.fifoSlotBytes = slotBytes;
  node.fifoDepth = depth;
  modelNotes = strprintf("%s, %d rank(s) per host over %s at %.1f GB/s, hosts joined by %s at %.2f GB/s",
                         node.hostMemory ? "host memory" : "GPU memory", node.localRanks,
                         algo::linkClassName(node.intra), node.ringBw, algo::linkClassName(node.inter), node.netBw);
  if (!node.notes.empty()) modelNotes += "; " + node.notes;
  const int nnodes = hostsOf(*this);
  for (int c = 0; c < kCollectiveCount; ++c)
    for (int k = 0; k < kSizeBuckets; ++k) {
      const Collective coll = static_cast<Collective>(c);
      // Bucket k holds requests whose model size (modelBytes) rounds up to 2^k: price it there.
      algo::CostTable t = algo::costTable(node, coll, size_t{1} << k, nranks, nnodes);
      if (hook) hook->adjust(t);
      Ranking& r = ranking[static_cast<size_t>(c)][static_cast<size_t>(k)];
      r.order = algo::rankCosts(t);
      r.channels = std::max(0, t.channels);
      r.chunk = {};
      if (hook) tuneChunks(*this, *hook, t, r);
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

bool canServe(Algorithm algo, Protocol proto, const CollRequest& req, const PlanContext& ctx) {
  return algo::protocolRuns(ctx.node, proto, hostsOf(ctx)) && canServe(algo, req, ctx);
}

Selection select(const CollRequest& req, const PlanContext& ctx) {
  const PlanContext::Ranking& r = rankingOf(req, ctx);
  for (const algo::Ranked& x : r.order)
    if (allowedFor(ctx, req.coll, x) && canServe(x.algo, x.proto, req, ctx)) {
      Selection sel = shapeOf(req, ctx, x.algo, x.proto, r);
      if (logEnabled(LogLevel::kInfo, kLogTuning)) logChoice(req, ctx, r, sel);
      return sel;
    }
  // NCCL_ALGO / NCCL_PROTO left nothing that can serve: run correctly anyway and say so.
  for (const algo::Ranked& x : r.order)
    if (canServe(x.algo, x.proto, req, ctx)) {
      LOOM_INFO(kLogTuning, "%s of %zu bytes: no allowed algorithm can serve it; using %s/%s",
                collectiveName(req.coll), req.count * req.eltSize, algorithmName(x.algo), protocolName(x.proto));
      return shapeOf(req, ctx, x.algo, x.proto, r);
    }
  LOOM_THROW(kInternalError, "no algorithm serves %s", collectiveName(req.coll));
}

Algorithm selectAlgorithm(const CollRequest& req, const PlanContext& ctx) { return select(req, ctx).algorithm; }

Selection selectionFor(const CollRequest& req, const PlanContext& ctx, Algorithm algo) {
  return shapeOf(req, ctx, algo, Protocol::kSimple, rankingOf(req, ctx));
}

Plan buildPlan(const CollRequest& req, const PlanContext& ctx, Algorithm algo) {
  return buildPlan(req, ctx, selectionFor(req, ctx, algo));
}

Plan buildPlan(const CollRequest& req, const PlanContext& ctx, const Selection& sel) {
  const std::vector<Ring>& ring = ctx.rings;
  const size_t n = req.count, e = req.eltSize;
  const int ch = std::max(1, sel.channels);
  // An uncut step carries the whole buffer (the ring's size-free plans take 0 for that).
  const size_t chunk = sel.chunkBytes > 0 ? sel.chunkBytes : std::max<size_t>(n * e, 1);
  if (sel.algorithm == Algorithm::kHierarchical) {
    switch (req.coll) {
      case Collective::kAllReduce: return hierarchicalAllReduce(ctx.layout, n, e, chunk, ch);
      case Collective::kAllGather: return hierarchicalAllGather(ctx.layout, n, e, chunk, ch);
      case Collective::kReduceScatter: return hierarchicalReduceScatter(ctx.layout, n, e, chunk, ch);
      case Collective::kBroadcast: return hierarchicalBroadcast(ctx.layout, req.root, n, e, chunk, ch);
      case Collective::kReduce: return hierarchicalReduce(ctx.layout, req.root, n, e, chunk, ch);
      default: break;
    }
  }
  switch (req.coll) {
    case Collective::kAllReduce:
      switch (sel.algorithm) {
        case Algorithm::kTree: return treeAllReduce(ctx.nranks, ctx.rank, e, sel.chunkBytes, ch);
        case Algorithm::kHalvingDoubling:
          return splitByChannel(ch, n, e, [&](size_t part) {
            return halvingDoublingAllReduce(ctx.nranks, ctx.rank, part, e, chunk);
          });
        case Algorithm::kDirect:
          return splitByChannel(ch, n, e, [&](size_t part) { return directAllReduce(ctx.nranks, ctx.rank, part, e); });
        default: return ringAllReduce(ring, e, sel.chunkBytes, ch);
      }
    case Collective::kAllGather: return ringAllGather(ring, ctx.rank, e, sel.chunkBytes, ch);
    case Collective::kReduceScatter: return ringReduceScatter(ring, ctx.rank, e, sel.chunkBytes, ch);
    case Collective::kBroadcast: return ringBroadcast(ring, ctx.rank, req.root, e, sel.chunkBytes, ch);
    case Collective::kReduce: return ringReduce(ring, ctx.rank, req.root, e, sel.chunkBytes, ch);
    default: break;
  }
  LOOM_THROW(kInternalError, "%s has no plan builder", collectiveName(req.coll));
}

double estimateMicros(const std::vector<CollRequest>& reqs, const PlanContext& ctx) {
  const int nnodes = hostsOf(ctx);
  double total = 0;
  for (const CollRequest& req : reqs) {
    const Selection sel = select(req, ctx);
    const size_t bytes = modelBytes(req.coll, req.count * req.eltSize, ctx.nranks);
    algo::Estimate e = algo::estimate(ctx.node, req.coll, sel.algorithm, sel.protocol, bytes, ctx.nranks, nnodes);
    if (e.feasible) {
      total += e.us;
      continue;
    }
    const algo::CostTable t = algo::costTable(ctx.node, req.coll, bytes, ctx.nranks, nnodes);
    const algo::Ranked best = algo::rankCosts(t)[0];
    total += std::max(0.0, best.us);
  }
  return total;
}

}  // namespace loom
