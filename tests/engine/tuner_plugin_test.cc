// NCCL tuner plugins (src/engine/tuner_plugin.h) through the public API: Loom's test
// plugin of each ABI version (tests/engine/test_tuner_plugin.cc) steers what a real
// communicator runs, results stay exact, and a plugin that fails or answers ranks
// differently fails the init on every rank, saying why.
#include <gtest/gtest.h>
#include <nccl.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "algo/select.h"
#include "api/comm.h"
#include "core/core_util.h"
#include "core/rank_harness.h"
#include "engine/tuner_plugin.h"

namespace loomtest {
namespace {

using loom::Algorithm;
using loom::Collective;

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
