// NCCL tuner plugins (src/engine/tuner_plugin.h) through the public API: Loom's test
// plugin of each ABI version (tests/engine/test_tuner_plugin.cc) steers what a real
// communicator runs, results stay exact, and a plugin that fails or answers ranks
// differently fails the init on every rank, saying why.
#include <gtest/gtest.h>
#include <nccl.h>

#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "algo/cost_model.h"
#include "algo/select.h"
#include "algo/simulate.h"
#include "api/comm.h"
#include "base/error.h"
#include "base/log.h"
#include "core/core_util.h"
#include "core/rank_harness.h"
#include "engine/tuner_plugin.h"
#include "topo/load.h"

namespace loomtest {
namespace {

using loom::Algorithm;
using loom::Collective;
using loom::Protocol;

std::string pluginPath(const std::string& v) {
  return std::string(LOOM_TEST_TUNER_PLUGIN_DIR) + "/libnccl-tuner-loomtest-v" + v + ".so";
}

class TunerPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_ = ::testing::TempDir() + "loom-tuner-" + std::to_string(getpid()) + ".log";
    remove(log_.c_str());
  }
  void TearDown() override { remove(log_.c_str()); }
  std::vector<std::string> lines(const std::string& prefix) const {
    std::ifstream in(log_);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);)
      if (l.rfind(prefix, 0) == 0) out.push_back(l);
    return out;
  }
  std::string log_;
  EnvGuard logEnv_{"LOOM_TEST_TUNER_LOG", nullptr};
  EnvGuard mode_{"LOOM_TEST_TUNER_MODE", nullptr};
  EnvGuard plugin_{"NCCL_TUNER_PLUGIN", nullptr};
  // On a GPU machine stock NCCL's shadow communicators would load the plugin too.
  EnvGuard fallback_{"LOOM_NCCL_FALLBACK", "off"};
};

// What the communicator would run for an all-reduce of `bytes`.
loom::Selection allReduce(ncclComm_t comm, size_t bytes) {
  return loom::select({Collective::kAllReduce, bytes / 4, 4, 0}, comm->core->planContext());
}

// An all-reduce of `count` floats whose result is exact whatever the order of the sums.
std::string exactAllReduce(int rank, int nranks, ncclComm_t comm, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((rank + 1) * (i % 13));
  RANK_NCCL(ncclAllReduce(v.data(), v.data(), count, ncclFloat32, ncclSum, comm, nullptr));
  const float sum = static_cast<float>(nranks * (nranks + 1) / 2);
  for (size_t i = 0; i < count; ++i) RANK_CHECK(v[i] == sum * static_cast<float>(i % 13), "[%zu] = %g", i, v[i]);
  return "";
}

// Without a plugin the model does not take the tree at 1 MiB on 4 ranks of one host; each
// version's plugin makes it the choice with 3 channels, and the all-reduce stays exact.
TEST_F(TunerPluginTest, EachVersionSteersTheAllReduce) {
  {
    EnvGuard none("NCCL_TUNER_PLUGIN", "none");
    auto f = runRanks(Mode::kThreads, 4, [](int, int, ncclComm_t comm) -> std::string {
      loom::Selection s = allReduce(comm, 1 << 20);
      RANK_CHECK(s.algorithm != Algorithm::kTree || s.channels != 3, "the model alone picks Tree with 3 channels");
      return "";
    });
    ASSERT_TRUE(f.empty()) << joinFailures(f);
  }
  for (const char* v : {"2", "3", "4", "5", "6"}) {
    SCOPED_TRACE(std::string("v") + v);
    remove(log_.c_str());
    EnvGuard p("NCCL_TUNER_PLUGIN", pluginPath(v).c_str());
    EnvGuard m("LOOM_TEST_TUNER_MODE", "tree");
    EnvGuard l("LOOM_TEST_TUNER_LOG", log_.c_str());
    auto f = runRanks(Mode::kThreads, 4, [](int rank, int nranks, ncclComm_t comm) -> std::string {
      loom::Selection s = allReduce(comm, 1 << 20);
      RANK_CHECK(s.algorithm == Algorithm::kTree && s.channels == 3, "all-reduce of 1 MiB runs %s with %d channels",
                 loom::algorithmName(s.algorithm), s.channels);
      // Other collectives keep the model's choice.
      loom::Selection g = loom::select({Collective::kAllGather, 1 << 18, 4, 0}, comm->core->planContext());
      RANK_CHECK(g.algorithm == Algorithm::kRing, "all-gather runs %s", loom::algorithmName(g.algorithm));
      RANK_TRY(exactAllReduce(rank, nranks, comm, 1 << 18));
      return exactAllReduce(rank, nranks, comm, 1000);
    });
    ASSERT_TRUE(f.empty()) << joinFailures(f);
    // Each communicator initialised the plugin for itself and finalised it when destroyed.
    std::vector<std::string> inits = lines("init v" + std::string(v) + " nranks 4 nnodes 1");
    EXPECT_EQ(inits.size(), 4u);
    EXPECT_EQ(lines("finalize").size(), 4u);
    // Asked once per communicator, collective (the five NCCL asks about) and size class.
    const std::vector<std::string> asked = lines("coll ");
    EXPECT_EQ(asked.size(), 4u * 5 * loom::kSizeBuckets);
    const std::string mib = "coll 4 bytes 1048576 ";
    bool seen = false;
    for (const std::string& a : asked) {
      if (a.rfind(mib, 0) != 0) continue;
      seen = true;
      if (std::string(v) == "2") {
        EXPECT_NE(a.find("collnet 0 nvls 0 pipeops 1 channels 0"), std::string::npos) << a;
      } else {
        // NCCL's shape, Loom's ring and tree priced; host memory runs Simple only, and NCCL's
        // other algorithms are ignored.
        EXPECT_NE(a.find("algos 7 protos 3"), std::string::npos) << a;
        EXPECT_EQ(a.find("ring_simple -1.000"), std::string::npos) << a;
        EXPECT_EQ(a.find("tree_simple -1.000"), std::string::npos) << a;
        EXPECT_NE(a.find("ring_ll -1.000 pat_simple -1.000 channels 0"), std::string::npos) << a;
      }
    }
    EXPECT_TRUE(seen) << "the plugin was never asked about a 1 MiB all-reduce";
    if (std::string(v) >= "5") {
      ASSERT_EQ(inits.size(), 4u);
      EXPECT_NE(inits[0].find("commid set nvl 1 4 4 constants 0"), std::string::npos) << inits[0];
    }
  }
}

// Entries the plugin rules out (-1) are never chosen, whatever the size.
TEST_F(TunerPluginTest, RuledOutRingIsNeverChosen) {
  EnvGuard p("NCCL_TUNER_PLUGIN", pluginPath("4").c_str());
  EnvGuard m("LOOM_TEST_TUNER_MODE", "no_ring");
  auto f = runRanks(Mode::kThreads, 3, [](int rank, int nranks, ncclComm_t comm) -> std::string {
    for (size_t bytes = 4; bytes <= (size_t{1} << 30); bytes *= 2)
      RANK_CHECK(allReduce(comm, bytes).algorithm != Algorithm::kRing, "%zu bytes run Ring", bytes);
    RANK_TRY(exactAllReduce(rank, nranks, comm, 3));
    return exactAllReduce(rank, nranks, comm, size_t{3} << 20);
  });
  ASSERT_TRUE(f.empty()) << joinFailures(f);
}

// The ranking 2 ranks get with NCCL_TUNER_PLUGIN=`plugin` and LOOM_TEST_TUNER_MODE=`mode`.
uint64_t rankingWith(const std::string& plugin, const char* mode) {
  EnvGuard p("NCCL_TUNER_PLUGIN", plugin.c_str());
  EnvGuard m("LOOM_TEST_TUNER_MODE", mode);
  uint64_t digest = 0;
  auto f = runRanks(Mode::kThreads, 2, [&digest](int rank, int nranks, ncclComm_t comm) -> std::string {
    if (rank == 0) digest = comm->core->planContext().digest();
    return exactAllReduce(rank, nranks, comm, 4096);
  });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
  return digest;
}

// A getCollInfo that fails, or a plugin that picks what Loom cannot run here (LL on host
// memory), leaves the model's ranking as it is.
TEST_F(TunerPluginTest, FailuresAndChoicesLoomCannotRunKeepTheModelsRanking) {
  const uint64_t model = rankingWith("none", "");
  EXPECT_EQ(rankingWith(pluginPath("5"), "coll_fails"), model);
  EXPECT_EQ(rankingWith(pluginPath("2"), "coll_fails"), model);
  EXPECT_EQ(rankingWith(pluginPath("4"), "ll"), model);
  EXPECT_EQ(rankingWith(pluginPath("2"), "ll"), model);
  EXPECT_NE(rankingWith(pluginPath("4"), "tree"), model);
}

// Equal costs go as NCCL takes them: the first in its order (Tree before Ring).
TEST_F(TunerPluginTest, TiesGoAsInNccl) {
  EnvGuard p("NCCL_TUNER_PLUGIN", pluginPath("5").c_str());
  EnvGuard m("LOOM_TEST_TUNER_MODE", "tie");
  auto f = runRanks(Mode::kThreads, 3, [](int rank, int nranks, ncclComm_t comm) -> std::string {
    for (size_t bytes : {size_t{64}, size_t{1} << 20, size_t{64} << 20}) {
      loom::Selection s = allReduce(comm, bytes);
      RANK_CHECK(s.algorithm == Algorithm::kTree, "%zu bytes run %s", bytes, loom::algorithmName(s.algorithm));
    }
    return exactAllReduce(rank, nranks, comm, 5000);
  });
  ASSERT_TRUE(f.empty()) << joinFailures(f);
}

// A plugin's init that fails on one rank fails the init on every rank, each saying whose.
TEST_F(TunerPluginTest, InitFailureOnOneRankFailsEveryRank) {
  EnvGuard p("NCCL_TUNER_PLUGIN", pluginPath("5").c_str());
  RankOptions opt;
  opt.timeoutSec = 60;
  opt.beforeInit = [](int rank) {
    if (rank == 1) setenv("LOOM_TEST_TUNER_MODE", "init_fails", 1);
  };
  auto f = runRanks(Mode::kProcesses, 3, [](int, int, ncclComm_t) { return std::string(); }, opt);
  ASSERT_EQ(f.size(), 3u) << joinFailures(f);
  for (const std::string& e : f) {
    if (e.rfind("rank 1:", 0) == 0) {
      EXPECT_NE(e.find("tuner plugin LoomTestTuner (v5, "), std::string::npos) << e;
      EXPECT_NE(e.find("init returned ncclInternalError"), std::string::npos) << e;
      EXPECT_NE(e.find("internal error"), std::string::npos) << e;  // the plugin's own code
    } else {
      EXPECT_NE(e.find("rank 1's NCCL tuner plugin failed to initialise"), std::string::npos) << e;
      EXPECT_NE(e.find("remote process exited or there was a network error"), std::string::npos) << e;
    }
  }
}

// Ranks whose plugins answer differently (or where only some load one) would run different
// plans: their init fails on every rank, naming the plugins.
TEST_F(TunerPluginTest, RanksThatRankDifferentlyFailTheInit) {
  for (const char* other : {"", "none"}) {
    SCOPED_TRACE(other);
    EnvGuard p("NCCL_TUNER_PLUGIN", pluginPath("3").c_str());
    RankOptions opt;
    opt.timeoutSec = 60;
    const std::string otherMode = other;
    opt.beforeInit = [otherMode](int rank) {
      if (rank != 2) setenv("LOOM_TEST_TUNER_MODE", "tree", 1);
      else if (otherMode == "none") setenv("NCCL_TUNER_PLUGIN", "none", 1);
    };
    auto f = runRanks(Mode::kProcesses, 3, [](int, int, ncclComm_t) { return std::string(); }, opt);
    ASSERT_EQ(f.size(), 3u) << joinFailures(f);
    for (const std::string& e : f) {
      EXPECT_NE(e.find("rank 2 ranks the algorithms differently from rank 0 (tuner plugin: rank 0 LoomTestTuner (v3, "),
                std::string::npos)
          << e;
      if (otherMode == "none") {
        EXPECT_NE(e.find(", rank 2 none)"), std::string::npos) << e;
      }
      EXPECT_NE(e.find("invalid usage"), std::string::npos) << e;
    }
  }
}

// ---- v6 getChunkSize ----

size_t bucketChunk(const loom::PlanContext& ctx, Collective c, int bucket, Algorithm a, Protocol p) {
  return ctx.ranking[static_cast<size_t>(c)][static_cast<size_t>(bucket)]
      .chunk[static_cast<size_t>(a)][static_cast<size_t>(p)];
}

// Elements per iteration of the plan this rank's all-reduce of `count` floats ran (the plan
// cache's entry for it: found, not built anew).
std::string ranPerIter(ncclComm_t comm, size_t count, size_t* perIter) {
  loom::PlanCache& cache = comm->core->planCache();
  const size_t misses = cache.misses();
  auto cp = cache.get({Collective::kAllReduce, count, 4, 0}, comm->core->planContext());
  RANK_CHECK(cache.misses() == misses, "the all-reduce of %zu floats left no plan in the cache", count);
  RANK_CHECK(cp->plan.sizeFree() && !cp->plan.channels[0].loops.empty(), "%zu floats: not a size-free plan", count);
  *perIter = cp->plan.channels[0].loops[0].perIter;
  return "";
}

// An H100 host's 8 GPUs as the cost model sees them, ranked with the v6 test plugin as a
// communicator of 8 ranks would (as loom-topo does).
struct GpuJob {
  GpuJob() {
    static const loom::algo::NodeModel model = loom::algo::buildNodeModel(
        loom::topo::loadSystemFile(std::string(LOOM_TOPO_FIXTURES) + "/dgx_h100.xml"), 8, false);
    node = model;
    tuner = loom::TunerPlugin::open(1, 8, 1, 8, 8);
    job = std::make_unique<loom::JobContexts>(loom::JobContexts::contiguous(8, 1), node, 256 << 10, 8, tuner.get());
  }
  loom::algo::NodeModel node;
  std::unique_ptr<loom::TunerPlugin> tuner;
  std::unique_ptr<loom::JobContexts> job;  // after `tuner`: its contexts point at it
};

// The chunk a v6 plugin sets is the all-reduce's: the plan each call ran cuts its steps to
// it, on the ring and the tree, at sizes that are not multiples of it, and results stay
// exact. Other collectives keep the model's chunk.
TEST_F(TunerPluginTest, ChunkSizeReachesThePlan) {
  EnvGuard p("NCCL_TUNER_PLUGIN", pluginPath("6").c_str());
  EnvGuard c("LOOM_TEST_TUNER_CHUNK", "numbered");  // 1000 * (1 + 3 * algorithm + protocol)
  struct Case {
    const char* algo;
    Algorithm a;
    size_t chunk;  // NCCL's numbers: Ring 1, Tree 0; Simple 2
    size_t model;  // the model's for host memory (slots of 256 KiB, 8 deep)
  };
  for (const Case& k :
       {Case{"ring", Algorithm::kRing, 6000, 1 << 20}, Case{"tree", Algorithm::kTree, 3000, 512 << 10}}) {
    SCOPED_TRACE(k.algo);
    EnvGuard a("NCCL_ALGO", (std::string("allreduce:") + k.algo).c_str());
    auto f = runRanks(Mode::kThreads, 4, [&k](int rank, int nranks, ncclComm_t comm) -> std::string {
      const loom::PlanContext& ctx = comm->core->planContext();
      for (size_t count : {size_t{1} << 18, size_t{300007}, size_t{1000}}) {
        RANK_TRY(exactAllReduce(rank, nranks, comm, count));
        const loom::Selection s = allReduce(comm, count * 4);
        RANK_CHECK(s.algorithm == k.a && s.chunkBytes == k.chunk, "%zu floats: %s, chunk %zu", count,
                   loom::algorithmName(s.algorithm), s.chunkBytes);
        const size_t model = loom::algo::planShape(ctx.node, Collective::kAllReduce, k.a, Protocol::kSimple,
                                                   count * 4, nranks).chunkBytes;
        RANK_CHECK(model == k.model, "%zu floats: the model's chunk is %zu", count, model);
        // A ring iteration carries one chunk per rank, a tree iteration one chunk.
        size_t perIter = 0;
        RANK_TRY(ranPerIter(comm, count, &perIter));
        const size_t want = (k.a == Algorithm::kRing ? static_cast<size_t>(nranks) : 1) * k.chunk / 4;
        RANK_CHECK(perIter == want, "%zu floats: %zu elements per iteration, not %zu", count, perIter, want);
      }
      const size_t gather = 1 << 16;
      const loom::Selection g = loom::select({Collective::kAllGather, gather, 4, 0}, ctx);
      const size_t model = loom::algo::planShape(ctx.node, Collective::kAllGather, g.algorithm, g.protocol,
                                                 gather * 4 * nranks, nranks).chunkBytes;
      RANK_CHECK(g.chunkBytes == model, "all-gather: chunk %zu, the model's %zu", g.chunkBytes, model);
      return "";
    });
    ASSERT_TRUE(f.empty()) << joinFailures(f);
  }
}

// Every collective NCCL tunes, on the ring and on the tree, in chunks of 3001 bytes (not a
// whole number of doubles: plans cut whole elements) and of 9 bytes (about one double a
// step): results exact, with doubles holding whole numbers.
TEST_F(TunerPluginTest, ChunksOfEveryCollectiveCutWholeElements) {
  EnvGuard p("NCCL_TUNER_PLUGIN", pluginPath("6").c_str());
  for (const char* chunk : {"every:3001", "every:9"})
    for (const char* algo : {"ring", "allreduce:tree"}) {
      SCOPED_TRACE(std::string(chunk) + " " + algo);
      EnvGuard c("LOOM_TEST_TUNER_CHUNK", chunk);
      EnvGuard a("NCCL_ALGO", algo);
      auto f = runRanks(Mode::kThreads, 3, [](int rank, int nranks, ncclComm_t comm) -> std::string {
        const size_t n = 5003;
        auto in = [](int r, size_t i) { return static_cast<double>((r + 1) * 1000 + static_cast<int>(i % 977)); };
        std::vector<double> mine(n), out(n * nranks, -1);
        for (size_t i = 0; i < n; ++i) mine[i] = in(rank, i);
        RANK_NCCL(ncclAllReduce(mine.data(), out.data(), n, ncclFloat64, ncclSum, comm, nullptr));
        for (size_t i = 0; i < n; ++i) {
          double want = 0;
          for (int r = 0; r < nranks; ++r) want += in(r, i);
          RANK_CHECK(out[i] == want, "all-reduce [%zu] = %g, not %g", i, out[i], want);
        }
        RANK_NCCL(ncclAllGather(mine.data(), out.data(), n, ncclFloat64, comm, nullptr));
        for (int r = 0; r < nranks; ++r)
          for (size_t i = 0; i < n; ++i)
            RANK_CHECK(out[r * n + i] == in(r, i), "all-gather block %d [%zu] = %g", r, i, out[r * n + i]);
        std::vector<double> all(n * nranks), part(n, -1);
        for (size_t i = 0; i < all.size(); ++i) all[i] = in(rank, i);
        RANK_NCCL(ncclReduceScatter(all.data(), part.data(), n, ncclFloat64, ncclSum, comm, nullptr));
        for (size_t i = 0; i < n; ++i) {
          double want = 0;
          for (int r = 0; r < nranks; ++r) want += in(r, rank * n + i);
          RANK_CHECK(part[i] == want, "reduce-scatter [%zu] = %g, not %g", i, part[i], want);
        }
        std::vector<double> b(n, -1);
        if (rank == 1) b = mine;
        RANK_NCCL(ncclBroadcast(b.data(), b.data(), n, ncclFloat64, 1, comm, nullptr));
        for (size_t i = 0; i < n; ++i) RANK_CHECK(b[i] == in(1, i), "broadcast [%zu] = %g", i, b[i]);
        std::vector<double> red(n, -1);
        RANK_NCCL(ncclReduce(mine.data(), red.data(), n, ncclFloat64, ncclMax, 2, comm, nullptr));
        if (rank == 2)
          for (size_t i = 0; i < n; ++i) RANK_CHECK(red[i] == in(nranks - 1, i), "reduce [%zu] = %g", i, red[i]);
        return "";
      });
      ASSERT_TRUE(f.empty()) << joinFailures(f);
    }
}

// getChunkSize sees what NCCL passes it: ncclFunc_t, NCCL_ALGO_*, NCCL_PROTO_*, the size
// (class), the channels the plan runs (getCollInfo's where it set them) and the model's
// chunk; only for NCCL's five tuned collectives and its Ring and Tree.
TEST_F(TunerPluginTest, ChunkSizeSeesNcclsNumbers) {
  EnvGuard p("NCCL_TUNER_PLUGIN", pluginPath("6").c_str());
  EnvGuard l("LOOM_TEST_TUNER_LOG", log_.c_str());
  {
    EnvGuard m("LOOM_TEST_TUNER_MODE", "tree");  // all-reduce: 3 channels
    auto f = runRanks(Mode::kThreads, 4, [](int rank, int nranks, ncclComm_t comm) -> std::string {
      return exactAllReduce(rank, nranks, comm, 5000);
    });
    ASSERT_TRUE(f.empty()) << joinFailures(f);
  }
  std::set<int> colls, algos, protos;
  for (const std::string& line : lines("chunk ")) {
    int coll = -1, algo = -1, proto = -1;
    ASSERT_EQ(sscanf(line.c_str(), "chunk coll %d bytes %*s algo %d proto %d", &coll, &algo, &proto), 3) << line;
    colls.insert(coll);
    algos.insert(algo);
    protos.insert(proto);
  }
  EXPECT_EQ(colls, std::set<int>({0, 1, 2, 3, 4}));
  EXPECT_EQ(algos, std::set<int>({0, 1}));  // Tree, Ring
  EXPECT_EQ(protos, std::set<int>({2}));    // Simple: all host memory runs
  // Each of the 4 communicators asked once per candidate: all-reduce's tree and ring on the
  // plugin's 3 channels (the tree's chunk two slots, the ring's half the FIFO); all-gather of
  // 1 MiB in all; a broadcast chain's chunk is its message.
  for (const char* want : {"chunk coll 4 bytes 1048576 algo 0 proto 2 channels 3 in 524288",
                           "chunk coll 4 bytes 1048576 algo 1 proto 2 channels 3 in 1048576",
                           "chunk coll 2 bytes 1048576 algo 1 proto 2 channels 1 in 1048576",
                           "chunk coll 0 bytes 4096 algo 1 proto 2 channels 1 in 4096"})
    EXPECT_EQ(lines(want).size(), 4u) << want;

  // A GPU host: the three protocols, each its own NCCL number, every chunk the plugin's.
  EnvGuard c("LOOM_TEST_TUNER_CHUNK", "numbered");
  GpuJob gpu;
  const loom::PlanContext& ctx = (*gpu.job)[0];
  for (int a : {0, 1})
    for (int pr : {0, 1, 2}) {
      const Algorithm algo = a == 0 ? Algorithm::kTree : Algorithm::kRing;
      const Protocol proto = pr == 0 ? Protocol::kLL : pr == 1 ? Protocol::kLL128 : Protocol::kSimple;
      EXPECT_EQ(bucketChunk(ctx, Collective::kAllReduce, 20, algo, proto), size_t{1000} * (1 + 3 * a + pr))
          << loom::algorithmName(algo) << "/" << loom::protocolName(proto);
    }
  // Loom's own algorithms are not NCCL's to tune.
  EXPECT_EQ(bucketChunk(ctx, Collective::kAllReduce, 20, Algorithm::kHalvingDoubling, Protocol::kSimple), 0u);
  const loom::algo::PlanShape ring =
      loom::algo::planShape(gpu.node, Collective::kAllReduce, Algorithm::kRing, Protocol::kSimple, 1 << 20, 8);
  const std::string asked = loom::strprintf("chunk coll 4 bytes 1048576 algo 1 proto 2 channels %d in %zu",
                                            ring.channels, ring.chunkBytes);
  EXPECT_EQ(lines(asked).size(), 1u) << asked;
  EXPECT_GT(ring.channels, 1);
  // NCCL_PROTO=Simple: the LL and LL128 cells are not asked and keep the model's chunk.
  EnvGuard simpleOnly("NCCL_PROTO", "Simple");
  GpuJob simple;
  for (int a : {0, 1}) {
    const Algorithm algo = a == 0 ? Algorithm::kTree : Algorithm::kRing;
    const loom::PlanContext& sc = (*simple.job)[0];
    EXPECT_EQ(bucketChunk(sc, Collective::kAllReduce, 20, algo, Protocol::kLL), 0u) << loom::algorithmName(algo);
    EXPECT_EQ(bucketChunk(sc, Collective::kAllReduce, 20, algo, Protocol::kLL128), 0u) << loom::algorithmName(algo);
    EXPECT_EQ(bucketChunk(sc, Collective::kAllReduce, 20, algo, Protocol::kSimple), size_t{1000} * (3 + 3 * a));
  }
}

// A chunk larger than the buffers allow a step is clamped to what they do: half a FIFO for
// the host-memory ring, a protocol's slot on GPUs (as NCCL clamps to its buffers).
TEST_F(TunerPluginTest, OverLargeChunksAreClampedToTheBuffers) {
  EnvGuard p("NCCL_TUNER_PLUGIN", pluginPath("6").c_str());
  EnvGuard c("LOOM_TEST_TUNER_CHUNK", "1073741824");
  {
    EnvGuard a("NCCL_ALGO", "allreduce:ring");
    auto f = runRanks(Mode::kThreads, 3, [](int rank, int nranks, ncclComm_t comm) -> std::string {
      const size_t count = size_t{3} << 20;
      RANK_TRY(exactAllReduce(rank, nranks, comm, count));
      const loom::Selection s = allReduce(comm, count * 4);
      RANK_CHECK(s.chunkBytes == (1 << 20), "chunk %zu, not half of a 2 MiB FIFO", s.chunkBytes);
      size_t perIter = 0;
      RANK_TRY(ranPerIter(comm, count, &perIter));
      RANK_CHECK(perIter == static_cast<size_t>(nranks) * (1 << 20) / 4, "%zu elements per iteration", perIter);
      return "";
    });
    ASSERT_TRUE(f.empty()) << joinFailures(f);
  }
  EnvGuard ring("NCCL_ALGO", "allreduce:ring");  // NCCL's to tune, not Loom's own algorithms
  GpuJob gpu;
  const loom::PlanContext& ctx = (*gpu.job)[0];
  std::set<size_t> ceilings;
  for (Algorithm a : {Algorithm::kRing, Algorithm::kTree})
    for (Protocol pr : {Protocol::kLL, Protocol::kLL128, Protocol::kSimple}) {
      SCOPED_TRACE(std::string(loom::algorithmName(a)) + "/" + loom::protocolName(pr));
      const size_t ceiling = loom::algo::chunkCeiling(gpu.node, Collective::kAllReduce, a, pr, 8);
      const size_t model = loom::algo::planShape(gpu.node, Collective::kAllReduce, a, pr, 1 << 20, 8).chunkBytes;
      EXPECT_LT(model, ceiling);  // the model shrinks 1 MiB's chunks: the clamp is not the model's value
      // NCCL_ALGO rules the tree out: its cells are not asked and keep the model's chunk.
      EXPECT_EQ(bucketChunk(ctx, Collective::kAllReduce, 20, a, pr), a == Algorithm::kRing ? ceiling : 0);
      ceilings.insert(ceiling);
    }
  EXPECT_EQ(ceilings, std::set<size_t>({16384, 122880, 524288}));  // LL, LL128, Simple
  // The plans with the clamped chunks still give every rank the exact sum.
  const loom::CollRequest req{Collective::kAllReduce, (size_t{2} << 20) / 4, 4, 0};
  const loom::SimReport sim = loom::simulate(req, *gpu.job);
  EXPECT_EQ(sim.error, "");
  EXPECT_TRUE(sim.dataChecked);
  EXPECT_EQ(sim.selection.chunkBytes,
            loom::algo::chunkCeiling(gpu.node, Collective::kAllReduce, sim.selection.algorithm,
                                     sim.selection.protocol, 8));
}

// On the GPU model small chunks mean more steps, and the plans stay exact.
TEST_F(TunerPluginTest, SmallChunksAddStepsAndStayExact) {
  EnvGuard p("NCCL_TUNER_PLUGIN", pluginPath("6").c_str());
  EnvGuard ring("NCCL_ALGO", "allreduce:ring");
  const loom::CollRequest req{Collective::kAllReduce, (size_t{2} << 20) / 4, 4, 0};
  loom::SimReport model, tuned;
  {
    GpuJob gpu;
    model = loom::simulate(req, *gpu.job);
  }
  {
    EnvGuard c("LOOM_TEST_TUNER_CHUNK", "numbered");
    GpuJob gpu;
    tuned = loom::simulate(req, *gpu.job);
  }
  ASSERT_EQ(model.error, "");
  ASSERT_EQ(tuned.error, "");
  EXPECT_TRUE(tuned.dataChecked);
  EXPECT_EQ(tuned.selection.algorithm, model.selection.algorithm);
  EXPECT_LT(tuned.selection.chunkBytes, model.selection.chunkBytes);
  EXPECT_EQ(tuned.selection.chunkBytes % 1000, 0u);  // the plugin's, not a model's multiple of 128
  EXPECT_GT(tuned.stats[0].steps, 2 * model.stats[0].steps);
}

// NCCL_DEBUG=WARN into a file while it lives; text() puts the logging back as it was and
// returns what was logged.
class WarnLog {
 public:
  explicit WarnLog(const std::string& path)
      : path_(path),
        level_(std::make_unique<EnvGuard>("NCCL_DEBUG", "WARN")),
        file_(std::make_unique<EnvGuard>("NCCL_DEBUG_FILE", path.c_str())) {
    remove(path_.c_str());
    loom::logReset();
  }
  ~WarnLog() { text(); }
  std::string text() {
    if (level_) {
      level_.reset();
      file_.reset();
      loom::logReset();
      std::ifstream in(path_);
      std::stringstream ss;
      ss << in.rdbuf();
      text_ = ss.str();
      remove(path_.c_str());
    }
    return text_;
  }

 private:
  std::string path_, text_;
  std::unique_ptr<EnvGuard> level_, file_;
};

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// 0, the chunk handed back as it came, or a failing getChunkSize leave the model's chunks
// (the ranking is the one without a plugin); a failure is reported once per communicator.
TEST_F(TunerPluginTest, ZeroOwnValueOrFailureKeepTheModelsChunk) {
  EnvGuard l("LOOM_TEST_TUNER_LOG", log_.c_str());
  const uint64_t model = rankingWith("none", "");
  for (const char* chunk : {"0", static_cast<const char*>(nullptr), "fail"}) {
    SCOPED_TRACE(chunk ? chunk : "unset");
    remove(log_.c_str());
    EnvGuard c("LOOM_TEST_TUNER_CHUNK", chunk);
    WarnLog warnings(log_ + ".warn");
    EXPECT_EQ(rankingWith(pluginPath("6"), ""), model);
    EXPECT_FALSE(lines("chunk coll 4 ").empty()) << "getChunkSize was not asked";
    const std::string w = warnings.text();
    EXPECT_EQ(occurrences(w, "getChunkSize("), chunk && std::string(chunk) == "fail" ? 2u : 0u) << w;
    if (chunk && std::string(chunk) == "fail") {
      EXPECT_NE(w.find("returned ncclInternalError; the cost model's chunk stands"), std::string::npos) << w;
    }
  }
  // The rank comparison covers chunks: a plugin that sets them ranks differently.
  EnvGuard c("LOOM_TEST_TUNER_CHUNK", "numbered");
  EXPECT_NE(rankingWith(pluginPath("6"), ""), model);
}

// NCCL_TUNER_PLUGIN=none, or a name that does not load, leaves the model alone; unset with
// no libnccl-tuner.so, the net plugin's library serves if it exports a tuner.
TEST(TunerPluginLoader, NamesAreTriedAsGivenThenAsLibncclTuner) {
  using V = std::vector<std::string>;
  EXPECT_EQ(loom::tunerLibraryNames(nullptr), V({"libnccl-tuner.so"}));
  EXPECT_EQ(loom::tunerLibraryNames(""), V({"libnccl-tuner.so"}));
  EXPECT_EQ(loom::tunerLibraryNames("ofi"), V({"ofi", "libnccl-tuner-ofi.so"}));
  EXPECT_EQ(loom::tunerLibraryNames("libmine.so"), V({"libmine.so"}));
  EXPECT_EQ(loom::tunerLibraryNames("/opt/t/x.so"), V({"/opt/t/x.so"}));
}

// STATIC_PLUGIN names the program itself (this test exports no tuner); loom-info's words.
TEST_F(TunerPluginTest, StaticPluginLooksInTheProgram) {
  EnvGuard p("NCCL_TUNER_PLUGIN", "STATIC_PLUGIN");
  std::string path;
  const std::string why = loom::processTunerPlugin(&path);
  EXPECT_TRUE(path.empty());
  EXPECT_EQ(why, "none: STATIC_PLUGIN loads but exports no ncclTunerPlugin_v2..v6 symbol");
  EnvGuard none("NCCL_TUNER_PLUGIN", "none");
  EXPECT_EQ(loom::processTunerPlugin(&path), "none (NCCL_TUNER_PLUGIN=none)");
}

TEST_F(TunerPluginTest, LoaderAsNcclLoadsIt) {
  EnvGuard l("LOOM_TEST_TUNER_LOG", log_.c_str());
  EnvGuard m("LOOM_TEST_TUNER_MODE", "tree");
  auto treeOf = [](std::vector<int>* picks) {
    return [picks](int rank, int, ncclComm_t comm) -> std::string {
      loom::Selection s = allReduce(comm, 1 << 20);
      (*picks)[rank] = s.algorithm == Algorithm::kTree && s.channels == 3;
      return "";
    };
  };
  for (const char* spec : {"none", "NONE", "nosuch", "/no/such/libnccl-tuner.so"}) {
    SCOPED_TRACE(spec);
    EnvGuard p("NCCL_TUNER_PLUGIN", spec);
    std::vector<int> picks(2, -1);
    auto f = runRanks(Mode::kThreads, 2, treeOf(&picks));
    ASSERT_TRUE(f.empty()) << joinFailures(f);
    EXPECT_EQ(picks, std::vector<int>({0, 0}));
  }
  EXPECT_TRUE(lines("init").empty());
  {
    const std::string netPlugin = std::string(LOOM_TEST_TUNER_PLUGIN_DIR) + "/libnccl-net-loomtest-tuner.so";
    EnvGuard net("NCCL_NET_PLUGIN", netPlugin.c_str());
    std::vector<int> picks(2, -1);
    auto f = runRanks(Mode::kThreads, 2, treeOf(&picks));
    ASSERT_TRUE(f.empty()) << joinFailures(f);
    EXPECT_EQ(picks, std::vector<int>({1, 1}));
    EXPECT_EQ(lines("init v5 nranks 2 nnodes 1").size(), 2u);
  }
}

}  // namespace
}  // namespace loomtest
