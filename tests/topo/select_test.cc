// The one selector (algo/select): its choice is the cost model's ranking (the same one
// tune() gives loom-topo's table), NCCL_ALGO / NCCL_PROTO force it, channels and chunk
// size come from the model's plan shape and reach the plan, a tuner hook can change the
// choice, and estimateMicros is the model's prediction for what runs.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "algo/select.h"
#include "algo/simulate.h"
#include "algo/tree.h"
#include "base/error.h"
#include "topo/search.h"
#include "topo_test_util.h"

namespace loom {
namespace {

using topo::test::loadFixture;

// Sets an environment variable for one scope (nullptr: unset).
class Env {
 public:
  Env(const char* name, const char* value) : name_(name) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~Env() { unsetenv(name_); }
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

 private:
  const char* name_;
};

const topo::System& cpuOnly() {
  static const topo::System s = loadFixture("cpu_only.xml");
  return s;
}
const topo::System& h100() {
  static const topo::System s = loadFixture("dgx_h100.xml");
  return s;
}

// A host-memory job of `nranks` on `nhosts` hosts, as a communicator would tune it.
JobContexts hostJob(int nranks, int nhosts, size_t slot = 256 << 10, int depth = 8,
                    algo::TunerHook* hook = nullptr) {
  const int local = (nranks + nhosts - 1) / nhosts;
  return JobContexts(JobContexts::contiguous(nranks, nhosts), algo::buildNodeModel(cpuOnly(), local, true), slot,
                     depth, hook);
}

constexpr Collective kPlanned[] = {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                                   Collective::kBroadcast, Collective::kReduce};

TEST(Select, ChoiceIsTheFirstServableCandidateOfTheModelsRanking) {
  for (auto [n, hosts] : {std::pair{2, 1}, {4, 1}, {8, 1}, {4, 2}, {6, 3}}) {
    JobContexts job = hostJob(n, hosts);
    const PlanContext& ctx = job[0];
    for (Collective coll : kPlanned)
      for (size_t bytes = 8; bytes <= (size_t{64} << 20); bytes *= 8) {
        CollRequest req{coll, bytes / 4, 4, 0};
        const Selection sel = select(req, ctx);
        // The model's ranking at this size, from the same cost table tune() ranks.
        const algo::Ranking ranked =
            algo::rankCosts(algo::costTable(ctx.node, coll, modelBytes(coll, bytes, n), n, hosts));
        const algo::Ranked* want = nullptr;
        for (const algo::Ranked& x : ranked)
          if (canServe(x.algo, x.proto, req, ctx)) {
            want = &x;
            break;
          }
        ASSERT_NE(want, nullptr);
        EXPECT_EQ(sel.algorithm, want->algo) << collectiveName(coll) << " " << bytes << " on " << n << "/" << hosts;
        EXPECT_EQ(sel.protocol, Protocol::kSimple);  // the CPU executor has nothing else
        EXPECT_EQ(selectAlgorithm(req, ctx), sel.algorithm);
      }
  }
}

// loom-topo's table used tune(); it now uses select(). Both rank the same cost table, so
// wherever the engine can run tune()'s pick they agree, protocols included (GPU memory).
TEST(Select, AgreesWithTuneWhereTheExecutorCanServe) {
  for (int hosts : {1, 4}) {
    const int n = 8 * hosts;
    JobContexts job(JobContexts::contiguous(n, hosts), algo::buildNodeModel(h100(), 8, false));
    for (Collective coll : kPlanned)
      for (size_t bytes = 1024; bytes <= (size_t{1} << 30); bytes *= 4) {
        algo::TuningChoice t = algo::tune(h100(), {coll, bytes, n, hosts, false});
        const size_t perRank = (coll == Collective::kAllGather || coll == Collective::kReduceScatter) ? bytes / n : bytes;
        CollRequest req{coll, perRank / 4, 4, 0};
        if (!canServe(t.algorithm, t.protocol, req, job[0])) continue;
        const Selection sel = select(req, job[0]);
        EXPECT_EQ(sel.algorithm, t.algorithm) << collectiveName(coll) << " " << bytes;
        EXPECT_EQ(sel.protocol, t.protocol) << collectiveName(coll) << " " << bytes;
        EXPECT_EQ(sel.channels, t.channels) << collectiveName(coll) << " " << bytes;
        EXPECT_EQ(sel.chunkBytes, t.chunkBytes) << collectiveName(coll) << " " << bytes;
      }
  }
}

TEST(Select, NcclAlgoAndProtoForceTheChoice) {
  {
    Env algo("NCCL_ALGO", "tree");
    JobContexts job = hostJob(4, 1);
    EXPECT_EQ(select({Collective::kAllReduce, 1 << 20, 4}, job[0]).algorithm, Algorithm::kTree);
    // Tree has no all-gather: the best that can serve runs, never nothing.
    EXPECT_EQ(select({Collective::kAllGather, 1 << 20, 4}, job[0]).algorithm, Algorithm::kRing);
  }
  {
    Env algo("NCCL_ALGO", "allreduce:direct");
    JobContexts job = hostJob(4, 1);
    EXPECT_EQ(select({Collective::kAllReduce, 1024, 4}, job[0]).algorithm, Algorithm::kDirect);
    // One-shot only while the message fits a FIFO (256 KiB x 8).
    EXPECT_NE(select({Collective::kAllReduce, size_t{4} << 20, 4}, job[0]).algorithm, Algorithm::kDirect);
  }
  {
    Env algo("NCCL_ALGO", "hier");
    JobContexts job = hostJob(4, 2);
    for (Collective coll : kPlanned)
      EXPECT_EQ(select({coll, 16, 4}, job[0]).algorithm, Algorithm::kHierarchical) << collectiveName(coll);
  }
  {
    // Host memory has only Simple slots: NCCL_PROTO=LL cannot apply and Simple runs.
    Env proto("NCCL_PROTO", "LL");
    JobContexts job = hostJob(4, 1);
    EXPECT_EQ(select({Collective::kAllReduce, 1 << 20, 4}, job[0]).protocol, Protocol::kSimple);
    // GPU memory: the protocol NCCL_PROTO asks for.
    JobContexts gpu(JobContexts::contiguous(8, 1), algo::buildNodeModel(h100(), 8, false));
    EXPECT_EQ(select({Collective::kAllReduce, 1 << 28, 4}, gpu[0]).protocol, Protocol::kLL);
  }
  JobContexts gpu(JobContexts::contiguous(8, 1), algo::buildNodeModel(h100(), 8, false));
  EXPECT_EQ(select({Collective::kAllReduce, 1 << 28, 4}, gpu[0]).protocol, Protocol::kSimple);
}

// The rules the plan builders used to hard-code (ring steps of half a FIFO, the tree's
// two-slot chunks on two channels, hierarchical on two channels from 1 MiB) now come from
// the cost model's plan shape, and follow the communicator's FIFO shape.
TEST(Select, ChannelsAndChunkComeFromTheModel) {
  JobContexts job = hostJob(4, 1, 64 << 10, 4);  // FIFOs of 4 x 64 KiB
  const PlanContext& ctx = job[0];
  for (Collective coll : kPlanned)
    for (size_t bytes : {size_t{8}, size_t{300000}, size_t{8} << 20}) {
      CollRequest req{coll, bytes / 4, 4, 0};
      const Selection sel = select(req, ctx);
      const algo::PlanShape shape =
          algo::planShape(ctx.node, coll, sel.algorithm, sel.protocol, modelBytes(coll, bytes, 4), 4);
      EXPECT_EQ(sel.channels, shape.channels);
      EXPECT_EQ(sel.chunkBytes, shape.chunkBytes);
    }
  CollRequest ar{Collective::kAllReduce, (size_t{8} << 20) / 4, 4, 0};
  Selection ring = selectionFor(ar, ctx, Algorithm::kRing);
  EXPECT_EQ(ring.channels, 1);
  EXPECT_EQ(ring.chunkBytes, size_t{128} << 10);  // half of 4 x 64 KiB
  Plan p = expandPlan(buildPlan(ar, ctx, ring), ar.count, ar.eltSize);
  ASSERT_EQ(p.channels.size(), 1u);
  size_t largest = 0;
  for (const Step& s : p.channels[0].steps) largest = std::max(largest, s.bytes);
  EXPECT_LE(largest, ring.chunkBytes);
  Selection tree = selectionFor(ar, ctx, Algorithm::kTree);
  EXPECT_EQ(tree.channels, 2);
  EXPECT_EQ(tree.chunkBytes, size_t{128} << 10);  // two slots
  EXPECT_EQ(buildPlan(ar, ctx, tree).str(), treeAllReduce(4, 0, 4, size_t{128} << 10).str());

  JobContexts two = hostJob(4, 2);
  for (Collective coll : {Collective::kAllReduce, Collective::kBroadcast, Collective::kReduce}) {
    EXPECT_EQ(selectionFor({coll, (1 << 20) / 4 - 1, 4}, two[0], Algorithm::kHierarchical).channels, 1);
    Selection big = selectionFor({coll, (1 << 20) / 4, 4}, two[0], Algorithm::kHierarchical);
    EXPECT_EQ(big.channels, 2) << collectiveName(coll);
    EXPECT_EQ(buildPlan({coll, (1 << 20) / 4, 4}, two[0], big).channels.size(), 2u);
  }

  // GPU memory: NCCL's channel counts; the plan has them and still runs.
  JobContexts gpu(JobContexts::contiguous(8, 1), algo::buildNodeModel(h100(), 8, false));
  CollRequest large{Collective::kAllReduce, (size_t{64} << 20) / 4, 4, 0};
  Selection g = select(large, gpu[0]);
  EXPECT_EQ(g.channels, 16);
  SimReport sim = simulate(large, gpu, g);
  EXPECT_EQ(sim.error, "");
  for (const Plan& plan : sim.plans) EXPECT_EQ(plan.channels.size(), 16u);
}

// NCCL's channel bounds, read as NCCL reads them: on GPUs they bound the communicator's
// channel pool (the tighter maximum, then the larger minimum), which a large message runs
// on and a small one runs below; NCCL_MAX_NCHANNELS 0 means 1, a negative minimum none, a
// CTA minimum over the CTA maximum is lowered to it, NCCL_MAX_NRINGS is the legacy name.
// Host plans take only the maximum (they have no pool; a minimum would multiply their
// FIFOs). Plans at the bounded counts still run exactly.
TEST(Select, ChannelBoundsAsNccl) {
  CollRequest large{Collective::kAllReduce, (size_t{64} << 20) / 4, 4, 0};
  CollRequest small{Collective::kAllReduce, (size_t{8} << 10) / 4, 4, 0};
  auto gpu = [&](const CollRequest& req) {
    JobContexts job(JobContexts::contiguous(8, 1), algo::buildNodeModel(h100(), 8, false));
    Selection g = select(req, job[0]);
    SimReport sim = simulate(req, job, g);
    EXPECT_EQ(sim.error, "");
    for (const Plan& plan : sim.plans) EXPECT_EQ(plan.channels.size(), static_cast<size_t>(g.channels));
    return g.channels;
  };
  const int model = gpu(large), modelSmall = gpu(small);
  EXPECT_EQ(model, 16);
  EXPECT_LT(modelSmall, model);
  struct Case {
    std::vector<std::pair<const char*, const char*>> env;
    int large;
  };
  for (const Case& c : {Case{{{"NCCL_MAX_NCHANNELS", "4"}}, 4}, Case{{{"NCCL_MAX_NCHANNELS", "4"}, {"NCCL_MAX_CTAS", "2"}}, 2},
                        Case{{{"NCCL_MAX_NRINGS", "3"}}, 3}, Case{{{"NCCL_MAX_NRINGS", "3"}, {"NCCL_MAX_NCHANNELS", "5"}}, 5},
                        Case{{{"NCCL_MAX_NCHANNELS", "0"}}, 1}, Case{{{"NCCL_MAX_CTAS", "-1"}}, 16},
                        Case{{{"NCCL_MIN_NCHANNELS", "32"}}, 32}, Case{{{"NCCL_MIN_NCHANNELS", "-5"}}, 16},
                        Case{{{"NCCL_MIN_CTAS", "24"}}, 24}, Case{{{"NCCL_MIN_CTAS", "16"}, {"NCCL_MAX_CTAS", "8"}}, 8},
                        Case{{{"NCCL_MIN_NCHANNELS", "6"}, {"NCCL_MAX_CTAS", "4"}}, 6},
                        Case{{{"NCCL_MIN_NCHANNELS", "1000"}}, 64}}) {
    std::string what;
    std::vector<std::unique_ptr<Env>> set;
    for (auto [k, v] : c.env) {
      set.push_back(std::make_unique<Env>(k, v));
      what += std::string(k) + "=" + v + " ";
    }
    SCOPED_TRACE(what);
    EXPECT_EQ(gpu(large), c.large);
    EXPECT_LE(gpu(small), std::max(modelSmall, 1)) << "a small message keeps to fewer channels";
  }
  // Host memory: the tree's two channels become one under a maximum of 1; a minimum leaves
  // the ring's one channel alone. Exact either way.
  CollRequest ar{Collective::kAllReduce, (size_t{8} << 20) / 4, 4, 0};
  auto host = [&](Algorithm a) {
    JobContexts job = hostJob(4, 1);
    Selection sel = selectionFor(ar, job[0], a);
    SimReport sim = simulate(ar, job, sel);
    EXPECT_EQ(sim.error, "");
    EXPECT_EQ(sim.plans[0].channels.size(), static_cast<size_t>(sel.channels));
    return sel.channels;
  };
  EXPECT_EQ(host(Algorithm::kTree), 2);
  {
    Env m("NCCL_MAX_NCHANNELS", "1");
    EXPECT_EQ(host(Algorithm::kTree), 1);
  }
  {
    Env m("NCCL_MIN_NCHANNELS", "8"), c("LOOM_MIN_CTAS", "8");
    EXPECT_EQ(host(Algorithm::kRing), 1);
    EXPECT_EQ(host(Algorithm::kTree), 2);
  }
  // One rank has no channels to bound: its choice is the unbounded one.
  auto one = [] { return select({Collective::kAllReduce, 1 << 20, 4, 0}, hostJob(1, 1)[0]).channels; };
  const int unbounded = one();
  Env m("NCCL_MAX_NCHANNELS", "0");
  EXPECT_EQ(one(), unbounded);
  Env bad("NCCL_MAX_CTAS", "many");
  try {
    PlanContext().loadChannelBounds();
    ADD_FAILURE() << "NCCL_MAX_CTAS=many accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("MAX_CTAS=many"), std::string::npos) << e.what();
  }
}

// A stand-in for an NCCL tuner plugin: makes the tree the fastest all-reduce and asks for
// three channels.
class FavourTree : public algo::TunerHook {
 public:
  int calls = 0;
  void adjust(algo::CostTable& t) override {
    ++calls;
    if (t.coll != Collective::kAllReduce) return;
    t.at(Algorithm::kTree, Protocol::kSimple) = 0.01;
    t.channels = 3;
  }
};

TEST(Select, TunerHookCanRewriteTheCostTable) {
  CollRequest req{Collective::kAllReduce, (size_t{1} << 20) / 4, 4, 0};
  JobContexts plain = hostJob(4, 1);
  Selection before = select(req, plain[0]);
  EXPECT_NE(before.algorithm, Algorithm::kTree);

  FavourTree hook;
  JobContexts tuned = hostJob(4, 1, 256 << 10, 8, &hook);
  EXPECT_EQ(hook.calls, kCollectiveCount * kSizeBuckets);  // once per collective and size class
  Selection after = select(req, tuned[0]);
  EXPECT_EQ(after.algorithm, Algorithm::kTree);
  EXPECT_EQ(after.channels, 3);
  SimReport sim = simulate(req, tuned);
  EXPECT_EQ(sim.error, "");
  EXPECT_EQ(sim.plans[0].channels.size(), 3u);
  // Other collectives keep the model's choice.
  CollRequest ag{Collective::kAllGather, 1 << 20, 4, 0};
  EXPECT_EQ(select(ag, tuned[0]).algorithm, select(ag, plain[0]).algorithm);
  // NCCL_MAX_NCHANNELS bounds the hook's count too.
  Env m("NCCL_MAX_NCHANNELS", "2");
  JobContexts capped = hostJob(4, 1, 256 << 10, 8, &hook);
  EXPECT_EQ(select(req, capped[0]).channels, 2);
}

TEST(Select, EstimateMicrosIsTheModelsPredictionForWhatRuns) {
  JobContexts job = hostJob(4, 2);
  const PlanContext& ctx = job[0];
  double prev = 0;
  for (size_t bytes = 8; bytes <= (size_t{256} << 20); bytes *= 4) {
    CollRequest req{Collective::kAllReduce, bytes / 4, 4, 0};
    const double us = estimateMicros({req}, ctx);
    EXPECT_GT(us, prev) << bytes;  // larger sizes take longer
    prev = us;
    const Selection sel = select(req, ctx);
    algo::Estimate e = algo::estimate(ctx.node, req.coll, sel.algorithm, sel.protocol, bytes, 4, 2);
    ASSERT_TRUE(e.feasible);
    EXPECT_DOUBLE_EQ(us, e.us);
  }
  // A group: the operations one after another.
  CollRequest a{Collective::kAllReduce, 1 << 20, 4, 0}, b{Collective::kAllGather, 1 << 16, 4, 0};
  EXPECT_DOUBLE_EQ(estimateMicros({a, b}, ctx), estimateMicros({a}, ctx) + estimateMicros({b}, ctx));
  EXPECT_EQ(estimateMicros({}, ctx), 0.0);
  // NCCL_ALGO forcing an algorithm the model rules out: the best the model prices stands in.
  Env algo("NCCL_ALGO", "tree");
  JobContexts forced = hostJob(4, 2);
  CollRequest req{Collective::kAllReduce, 1 << 20, 4, 0};
  ASSERT_EQ(select(req, forced[0]).algorithm, Algorithm::kTree);
  EXPECT_GT(estimateMicros({req}, forced[0]), 0.0);
}

// Per-channel rings come from the topology search: on four GPUs joined pairwise by one
// NVLink each (nvlink_mesh4.xml: no single ring uses every link) the search finds several
// rings; channel c rides the c-th (each host's ranks in that GPU order, hosts in a row),
// and the collectives are exact on those rings.
TEST(Select, ChannelsRideTheRingsOfTheTopologySearch) {
  const topo::System mesh = loadFixture("nvlink_mesh4.xml");
  const topo::RingSet found = topo::searchRings(mesh, {0, 1, 2, 3});
  const algo::NodeModel node = algo::buildNodeModel(mesh, 4, false);
  ASSERT_GE(found.rings.size(), 2u);
  ASSERT_EQ(node.ringOrders.size(), found.rings.size());
  for (size_t k = 0; k < found.rings.size(); ++k) EXPECT_EQ(node.ringOrders[k], found.rings[k].gpus);
  JobContexts job({0, 0, 0, 0, 1, 1, 1, 1}, node);  // two such hosts
  for (int r = 0; r < 8; ++r) {
    const PlanContext& ctx = job[r];
    ASSERT_GE(ctx.rings.size(), 2u);
    for (size_t k = 0; k < ctx.rings.size(); ++k) {
      std::vector<int> want;
      for (int host : {0, 1})
        for (int g : node.ringOrders[k]) want.push_back(4 * host + g);
      EXPECT_EQ(ctx.rings[k].order, want) << "rank " << r << " ring " << k;
      EXPECT_EQ(ctx.rings[k].order[static_cast<size_t>(ctx.rings[k].pos)], r);
    }
    EXPECT_NE(ctx.ring(0).order, ctx.ring(1).order);
    EXPECT_EQ(&ctx.ring(static_cast<int>(ctx.rings.size())), &ctx.ring(0));  // channels wrap round
  }
  // A two-channel ring plan: channel c sends to its ring's successor.
  for (Collective coll : kPlanned) {
    CollRequest req{coll, 100003, 4, 1};
    Selection sel{Algorithm::kRing, Protocol::kSimple, 2, 64 << 10};
    for (int r = 0; r < 8; ++r) {
      const Plan p = expandPlan(buildPlan(req, job[r], sel), req.count, req.eltSize);
      ASSERT_EQ(p.channels.size(), 2u);
      for (int c = 0; c < 2; ++c)
        for (const Step& s : p.channels[static_cast<size_t>(c)].steps) {
          if (s.sendPeer >= 0) {
            EXPECT_EQ(s.sendPeer, job[r].ring(c).next()) << collectiveName(coll);
          }
        }
    }
    const SimReport rep = simulate(req, job, sel);
    EXPECT_EQ(rep.error, "") << collectiveName(coll);
    EXPECT_TRUE(rep.dataChecked);
  }
  // Host memory has no GPU order: one ring, each host's ranks in local order.
  JobContexts host({0, 0, 1, 1}, algo::buildNodeModel(cpuOnly(), 2, true));
  ASSERT_EQ(host[3].rings.size(), 1u);
  EXPECT_EQ(host[3].rings[0].order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(host[3].rings[0].pos, 3);
}

}  // namespace
}  // namespace loom
