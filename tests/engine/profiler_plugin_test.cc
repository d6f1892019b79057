// NCCL profiler plugins (src/engine/profiler_plugin.h) through the public API: Loom's test
// plugin (tests/engine/test_profiler_plugin.cc) logs every call, and the events of real
// communicators' calls must come as NCCL makes them: the hierarchy (GroupApi > CollApi /
// P2pApi > Coll / P2p > KernelCh, v4's Group > Coll), the fields (function, counts, types,
// buffers, peers, per-collective sequence numbers, channels), the states, every event
// stopped, the activation mask obeyed, and a failed init leaving only that rank without.
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/time.h"
#include "core/core_util.h"
#include "core/rank_harness.h"
#include "engine/profiler_abi.h"
#include "engine/profiler_plugin.h"

namespace loomtest {
namespace {

namespace abi = loom::profabi;

std::string pluginPath(int v) {
  return std::string(LOOM_TEST_PROFILER_PLUGIN_DIR) + "/libnccl-profiler-loomtest-v" + std::to_string(v) + ".so";
}

struct Event {
  int id = 0, ctx = 0, type = 0, parent = 0, rank = -1;
  std::map<std::string, std::string> f;  // the descriptor's fields, as logged
  std::vector<std::pair<int, uint64_t>> states;
  int startLine = -1, stopLine = -1;
  int stops = 0, lastStateLine = -1;
  std::string get(const std::string& k) const {
    auto it = f.find(k);
    return it == f.end() ? "<none>" : it->second;
  }
  long num(const std::string& k) const { return std::stol(get(k)); }
};

struct Log {
  std::map<int, Event> events;                 // by id
  std::map<int, std::map<std::string, std::string>> inits;  // by context
  std::map<int, int> finalizeLine;             // by context
  int lines = 0;

  std::vector<const Event*> of(int type, int ctx = -1) const {
    std::vector<const Event*> v;
    for (const auto& [id, e] : events)
      if (e.type == type && (ctx < 0 || e.ctx == ctx)) v.push_back(&e);
    return v;
  }
  std::vector<const Event*> children(int parent, int type) const {
    std::vector<const Event*> v;
    for (const auto& [id, e] : events)
      if (e.parent == parent && e.type == type) v.push_back(&e);
    return v;
  }
  int ctxOfRank(int rank) const {
    for (const auto& [ctx, f] : inits)
      if (f.at("rank") == std::to_string(rank)) return ctx;
    return -1;
  }
};

std::map<std::string, std::string> fields(std::istringstream& in) {
  std::map<std::string, std::string> f;
  for (std::string kv; in >> kv;) {
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) f[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return f;
}

Log readLog(const std::string& path) {
  Log log;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l); ++log.lines) {
    std::istringstream s(l);
    std::string what;
    s >> what;
    auto f = fields(s);
    if (what == "init") {
      log.inits[std::stoi(f["ctx"])] = f;
    } else if (what == "finalize") {
      log.finalizeLine[std::stoi(f["ctx"])] = log.lines;
    } else if (what == "start") {
      Event e;
      e.id = std::stoi(f["ev"]);
      e.ctx = std::stoi(f["ctx"]);
      e.type = std::stoi(f["type"]);
      e.parent = std::stoi(f["parent"]);
      e.rank = std::stoi(f["rank"]);
      e.f = f;
      e.startLine = log.lines;
      log.events[e.id] = e;
    } else if (what == "state") {
      Event& e = log.events[std::stoi(f["ev"])];
      e.states.push_back({std::stoi(f["state"]), std::stoull(f["ptimer"])});
      e.lastStateLine = log.lines;
    } else if (what == "stop") {
      Event& e = log.events[std::stoi(f["ev"])];
      e.stopLine = log.lines;
      ++e.stops;
    }
  }
  return log;
}

// Every event started and stopped once, in that order, its states between, before its
// context's finalize.
void expectAllStopped(const Log& log) {
  for (const auto& [id, e] : log.events) {
    EXPECT_GE(e.startLine, 0) << "event " << id << " stopped or updated but never started";
    EXPECT_GT(e.stopLine, e.startLine) << "event " << id << " (type " << e.type << ") not stopped after its start";
    EXPECT_EQ(e.stops, 1) << "event " << id << " (type " << e.type << ") stopped " << e.stops << " times";
    EXPECT_LT(e.lastStateLine, e.stopLine) << "event " << id << " updated after its stop";
    auto fin = log.finalizeLine.find(e.ctx);
    ASSERT_NE(fin, log.finalizeLine.end()) << "context " << e.ctx << " never finalised";
    EXPECT_LT(e.stopLine, fin->second) << "event " << id << " stopped after its context's finalize";
  }
}

// A Coll or P2p event's channel events: channels 0..n-1 (n: its nch), each started with the
// host clock, its KernelChStop state at or after that, within [from, to].
void expectChannels(const Log& log, const Event& task, uint64_t from, uint64_t to) {
  const auto ch = log.children(task.id, abi::kKernelCh);
  ASSERT_EQ(static_cast<long>(ch.size()), task.num("nch")) << "task event " << task.id;
  for (size_t i = 0; i < ch.size(); ++i) {
    const Event& k = *ch[i];
    EXPECT_EQ(k.num("channel"), static_cast<long>(i));
    const uint64_t t0 = std::stoull(k.get("ptimer"));
    ASSERT_EQ(k.states.size(), 1u) << "channel event " << k.id;
    EXPECT_EQ(k.states[0].first, abi::kStateKernelChStop);
    EXPECT_GE(k.states[0].second, t0);
    EXPECT_GE(t0, from);
    EXPECT_LE(k.states[0].second, to);
    EXPECT_GT(k.startLine, task.startLine);
  }
}

class ProfilerPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_ = ::testing::TempDir() + "loom-profiler-" + std::to_string(getpid()) + ".log";
    remove(log_.c_str());
    setenv("LOOM_TEST_PROFILER_LOG", log_.c_str(), 1);
  }
  void TearDown() override { remove(log_.c_str()); }
  std::string log_;
  EnvGuard logEnv_{"LOOM_TEST_PROFILER_LOG", nullptr};
  EnvGuard mask_{"LOOM_TEST_PROFILER_MASK", nullptr};
  EnvGuard fail_{"LOOM_TEST_PROFILER_FAIL_INIT", nullptr};
  EnvGuard plugin_{"NCCL_PROFILER_PLUGIN", nullptr};
  // On a GPU machine stock NCCL's shadow communicators would load the plugin too.
  EnvGuard fallback_{"LOOM_NCCL_FALLBACK", "off"};
};

// The buffers of each rank's first all-reduce, for the Coll event's fields.
struct Buffers {
  const void* send[4] = {};
  void* recv[4] = {};
};

// Three lone calls per rank: all-reduce, broadcast (root 1), all-reduce; results exact.
std::string threeCalls(int rank, int nranks, ncclComm_t comm, Buffers* b) {
  std::vector<float> in(1000), out(1000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(rank + 1);
  b->send[rank] = in.data();
  b->recv[rank] = out.data();
  RANK_NCCL(ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat32, ncclSum, comm, nullptr));
  for (float v : out) RANK_CHECK(v == nranks * (nranks + 1) / 2.0f, "all-reduce gave %g", v);
  std::vector<int32_t> bc(10, rank == 1 ? 42 : 0);
  RANK_NCCL(ncclBroadcast(bc.data(), bc.data(), bc.size(), ncclInt32, 1, comm, nullptr));
  for (int32_t v : bc) RANK_CHECK(v == 42, "broadcast gave %d", v);
  RANK_NCCL(ncclAllReduce(out.data(), out.data(), out.size(), ncclFloat32, ncclMax, comm, nullptr));
  return "";
}

TEST_F(ProfilerPluginTest, LoneCallsMakeNcclsEventTree) {
  // Plugin versions 5 and 6 on the CPU executor, and the plan interpreter's LL protocol.
  for (auto [v, interp] : {std::pair{5, false}, std::pair{6, false}, std::pair{5, true}}) {
    SCOPED_TRACE("plugin v" + std::to_string(v) + (interp ? ", LOOM_EXECUTOR=interp" : ""));
    remove(log_.c_str());
    EnvGuard plugin("NCCL_PROFILER_PLUGIN", pluginPath(v).c_str());
    EnvGuard executor("LOOM_EXECUTOR", interp ? "interp" : nullptr);
    EnvGuard proto("LOOM_INTERP_PROTO", interp ? "ll" : nullptr);
    Buffers b;
    const uint64_t from = loom::realtimeNs();
    auto f = runRanks(Mode::kThreads, 2, [&](int r, int n, ncclComm_t c) { return threeCalls(r, n, c, &b); });
    const uint64_t to = loom::realtimeNs();
    ASSERT_TRUE(f.empty()) << joinFailures(f);
    const Log log = readLog(log_);
    ASSERT_EQ(log.inits.size(), 2u);
    EXPECT_EQ(log.inits.begin()->second.at("hash"), log.inits.rbegin()->second.at("hash")) << "one communicator";
    for (const auto& [ctx, init] : log.inits) {
      EXPECT_EQ(init.at("nranks"), "2");
      EXPECT_EQ(init.at("nnodes"), "1");
    }
    expectAllStopped(log);
    for (int rank = 0; rank < 2; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      const int ctx = log.ctxOfRank(rank);
      const auto groups = log.of(abi::kGroupApi, ctx);
      ASSERT_EQ(groups.size(), 3u) << "one GroupApi per lone call";
      const char* funcs[] = {"AllReduce", "Broadcast", "AllReduce"};
      for (int i = 0; i < 3; ++i) {
        const Event& g = *groups[i];
        EXPECT_EQ(g.num("depth"), 1) << "a lone call's implicit group";
        EXPECT_EQ(g.parent, 0);
        ASSERT_EQ(g.states.size(), 2u);
        EXPECT_EQ(g.states[0].first, abi::kStateGroupStartApiStop);
        EXPECT_EQ(g.states[1].first, abi::kStateGroupEndApiStart);
        const auto api = log.children(g.id, abi::kCollApi);
        ASSERT_EQ(api.size(), 1u);
        const Event& a = *api[0];
        EXPECT_EQ(a.get("func"), funcs[i]);
        EXPECT_EQ(a.num("count"), i == 1 ? 10 : 1000);
        EXPECT_EQ(a.get("dtype"), i == 1 ? "ncclInt32" : "ncclFloat32");
        EXPECT_EQ(a.num("root"), i == 1 ? 1 : 0);
        EXPECT_EQ(a.num("captured"), 0);
        const auto tasks = log.children(a.id, abi::kColl);
        ASSERT_EQ(tasks.size(), 1u);
        const Event& t = *tasks[0];
        EXPECT_EQ(t.rank, rank);
        EXPECT_EQ(t.get("func"), funcs[i]);
        // As NCCL: a broadcast counted in bytes of ncclInt8.
        EXPECT_EQ(t.num("count"), i == 1 ? 40 : 1000);
        EXPECT_EQ(t.get("dtype"), i == 1 ? "ncclInt8" : "ncclFloat32");
        EXPECT_EQ(t.num("seq"), i == 2 ? 1 : 0) << "NCCL's numbers, per collective";
        EXPECT_EQ(t.get("proto"), interp ? "LL" : "SIMPLE");
        EXPECT_TRUE(std::set<std::string>({"RING", "TREE", "HALVING_DOUBLING", "DIRECT", "HIERARCHICAL"})
                        .count(t.get("algo")))
            << t.get("algo");
        EXPECT_GE(t.num("nch"), 1);
        if (i == 0) {
          std::ostringstream s, r;
          s << b.send[rank];
          r << b.recv[rank];
          EXPECT_EQ(t.get("send"), s.str());
          EXPECT_EQ(t.get("recv"), r.str());
        }
        // The legacy group, around the task's queueing.
        const auto legacy = log.of(abi::kGroup, ctx);
        const int group = std::stoi(t.get("group"));
        ASSERT_TRUE(std::any_of(legacy.begin(), legacy.end(), [&](const Event* e) { return e->id == group; }));
        const Event& lg = log.events.at(group);
        EXPECT_LT(lg.startLine, t.startLine);
        EXPECT_GT(lg.stopLine, t.stopLine);
        // The call ends before its launch, which the group end's state precedes and its
        // stop follows.
        EXPECT_LT(a.stopLine, t.startLine);
        EXPECT_LT(g.startLine, a.startLine);
        EXPECT_GT(g.stopLine, t.stopLine);
        expectChannels(log, t, from, to);
      }
    }
  }
}

TEST_F(ProfilerPluginTest, AGroupIsOneGroupApiEventOverItsCalls) {
  EnvGuard plugin("NCCL_PROFILER_PLUGIN", pluginPath(5).c_str());
  const uint64_t from = loom::realtimeNs();
  auto f = runRanks(Mode::kThreads, 2, [&](int rank, int nranks, ncclComm_t comm) -> std::string {
    const int peer = 1 - rank;
    std::vector<double> x(300, rank + 1.0), y(300, 0), s(77, rank * 10.0), r(77, -1);
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat64, ncclSum, comm, nullptr));
    RANK_NCCL(ncclSend(s.data(), s.size(), ncclFloat64, peer, comm, nullptr));
    RANK_NCCL(ncclRecv(r.data(), r.size(), ncclFloat64, peer, comm, nullptr));
    RANK_NCCL(ncclGroupEnd());
    for (double v : y) RANK_CHECK(v == 3.0, "all-reduce gave %g", v);
    for (double v : r) RANK_CHECK(v == peer * 10.0, "received %g", v);
    (void)nranks;
    return "";
  });
  const uint64_t to = loom::realtimeNs();
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  const Log log = readLog(log_);
  expectAllStopped(log);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const int ctx = log.ctxOfRank(rank);
    const auto groups = log.of(abi::kGroupApi, ctx);
    ASSERT_EQ(groups.size(), 1u);
    const Event& g = *groups[0];
    EXPECT_EQ(g.num("depth"), 2) << "inside ncclGroupStart";
    ASSERT_EQ(g.states.size(), 2u);
    const auto colls = log.children(g.id, abi::kCollApi);
    const auto p2ps = log.children(g.id, abi::kP2pApi);
    ASSERT_EQ(colls.size(), 1u);
    ASSERT_EQ(p2ps.size(), 2u);
    EXPECT_EQ(p2ps[0]->get("func"), "Send");
    EXPECT_EQ(p2ps[1]->get("func"), "Recv");
    for (const Event* a : p2ps) {
      EXPECT_EQ(a->num("count"), 77);
      EXPECT_EQ(a->get("dtype"), "ncclFloat64");
      const auto t = log.children(a->id, abi::kP2p);
      ASSERT_EQ(t.size(), 1u);
      EXPECT_EQ(t[0]->get("func"), a->get("func"));
      EXPECT_EQ(t[0]->num("peer"), 1 - rank);
      EXPECT_EQ(t[0]->num("count"), 77);
      EXPECT_EQ(t[0]->num("nch"), 1);
      // Every call of the group ended before the group's tasks were queued.
      EXPECT_GT(t[0]->startLine, colls[0]->stopLine);
      EXPECT_GT(t[0]->startLine, a->stopLine);
      expectChannels(log, *t[0], from, to);
    }
    const auto t = log.children(colls[0]->id, abi::kColl);
    ASSERT_EQ(t.size(), 1u);
    EXPECT_EQ(t[0]->num("count"), 300);
    EXPECT_EQ(t[0]->num("seq"), 0);
    expectChannels(log, *t[0], from, to);
    // One legacy group over the launch's three tasks.
    ASSERT_EQ(log.of(abi::kGroup, ctx).size(), 1u);
  }
}

// What the activation mask turns on, as NCCL decides it: a task event brings its parents,
// channel events only where asked.
TEST_F(ProfilerPluginTest, TheActivationMaskChoosesTheEvents) {
  EnvGuard plugin("NCCL_PROFILER_PLUGIN", pluginPath(5).c_str());
  struct Case {
    int mask;
    std::vector<int> made, notMade;
  };
  const std::vector<Case> cases = {
      {0, {}, {abi::kGroupApi, abi::kCollApi, abi::kGroup, abi::kColl, abi::kKernelCh}},
      {abi::kColl, {abi::kGroupApi, abi::kCollApi, abi::kGroup, abi::kColl}, {abi::kKernelCh}},
      {abi::kCollApi, {abi::kGroupApi, abi::kCollApi}, {abi::kGroup, abi::kColl, abi::kKernelCh}},
      {abi::kGroupApi, {abi::kGroupApi}, {abi::kCollApi, abi::kGroup, abi::kColl, abi::kKernelCh}},
      {abi::kKernelCh, {abi::kGroupApi, abi::kCollApi, abi::kGroup, abi::kColl, abi::kKernelCh}, {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("mask " + std::to_string(c.mask));
    remove(log_.c_str());
    EnvGuard mask("LOOM_TEST_PROFILER_MASK", std::to_string(c.mask).c_str());
    Buffers b;
    auto f = runRanks(Mode::kThreads, 2, [&](int r, int n, ncclComm_t comm) { return threeCalls(r, n, comm, &b); });
    ASSERT_TRUE(f.empty()) << joinFailures(f);
    const Log log = readLog(log_);
    EXPECT_EQ(log.inits.size(), 2u);
    EXPECT_EQ(log.finalizeLine.size(), 2u);
    for (int type : c.made) EXPECT_EQ(log.of(type).size(), 6u) << "type " << type;
    for (int type : c.notMade) EXPECT_EQ(log.of(type).size(), 0u) << "type " << type;
    expectAllStopped(log);
  }
}

// Ranks as processes: one communicator hash, and NCCL's sequence numbers alike.
TEST_F(ProfilerPluginTest, RanksAsProcessesNumberTheirCollectivesAlike) {
  EnvGuard plugin("NCCL_PROFILER_PLUGIN", pluginPath(5).c_str());
  auto f = runRanks(Mode::kProcesses, 3, [&](int rank, int nranks, ncclComm_t comm) -> std::string {
    Buffers b;
    for (int i = 0; i < 2; ++i) RANK_TRY(threeCalls(rank, nranks, comm, &b));
    std::vector<int64_t> v(5, rank);
    RANK_NCCL(ncclAllReduce(v.data(), v.data(), v.size(), ncclInt64, ncclSum, comm, nullptr));
    for (int64_t x : v) RANK_CHECK(x == 3, "all-reduce gave %lld", static_cast<long long>(x));
    return "";
  });
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  // (Each process numbers its own events and contexts: a rank's are told by `rank`.)
  std::ifstream in(log_);
  std::map<int, std::vector<std::string>> seqs;  // rank -> "func:seq" of its Coll events
  std::set<std::string> hashes;
  for (std::string l; std::getline(in, l);) {
    std::istringstream s(l);
    std::string what;
    s >> what;
    auto fl = fields(s);
    if (what == "init") hashes.insert(fl["hash"]);
    if (what == "start" && std::stoi(fl["type"]) == abi::kColl)
      seqs[std::stoi(fl["rank"])].push_back(fl["func"] + ":" + fl["seq"]);
  }
  EXPECT_EQ(hashes.size(), 1u);
  ASSERT_EQ(seqs.size(), 3u);
  const std::vector<std::string> want = {"AllReduce:0", "Broadcast:0", "AllReduce:1", "AllReduce:2",
                                         "Broadcast:1", "AllReduce:3", "AllReduce:4"};
  for (const auto& [rank, s] : seqs) EXPECT_EQ(s, want) << "rank " << rank;
}

TEST_F(ProfilerPluginTest, Version4GetsTaskEventsUnderGroups) {
  EnvGuard plugin("NCCL_PROFILER_PLUGIN", pluginPath(4).c_str());
  const uint64_t from = loom::realtimeNs();
  Buffers b;
  auto f = runRanks(Mode::kThreads, 2, [&](int r, int n, ncclComm_t c) { return threeCalls(r, n, c, &b); });
  const uint64_t to = loom::realtimeNs();
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  const Log log = readLog(log_);
  expectAllStopped(log);
  EXPECT_EQ(log.of(abi::kGroupApi).size() + log.of(abi::kCollApi).size(), 0u) << "v4 has no API events";
  const auto groups = log.of(abi::kGroup);
  ASSERT_EQ(groups.size(), 6u);
  for (const Event* g : groups) {
    const auto t = log.children(g->id, abi::kColl);
    ASSERT_EQ(t.size(), 1u) << "a v4 task's parent is its group";
    EXPECT_EQ(t[0]->rank, g->rank);
    expectChannels(log, *t[0], from, to);
  }
}

TEST_F(ProfilerPluginTest, AFailedInitLeavesThatRankWithoutEvents) {
  EnvGuard plugin("NCCL_PROFILER_PLUGIN", pluginPath(5).c_str());
  EnvGuard fail("LOOM_TEST_PROFILER_FAIL_INIT", "1");
  Buffers b;
  auto f = runRanks(Mode::kThreads, 2, [&](int r, int n, ncclComm_t c) { return threeCalls(r, n, c, &b); });
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  const Log log = readLog(log_);
  ASSERT_EQ(log.inits.size(), 1u);
  EXPECT_EQ(log.inits.begin()->second.at("rank"), "0");
  for (const auto& [id, e] : log.events) EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(log.of(abi::kColl).size(), 3u);
  expectAllStopped(log);
}

// An all-to-all is one call, whatever groups Loom makes of it: depth 1 alone, as NCCL's
// (whose tasks are its sends and receives, each with its P2pApi event), 2 in the caller's group.
TEST_F(ProfilerPluginTest, AnAllToAllIsOneCallsGroup) {
  EnvGuard plugin("NCCL_PROFILER_PLUGIN", pluginPath(5).c_str());
  auto f = runRanks(Mode::kThreads, 2, [&](int rank, int nranks, ncclComm_t comm) -> std::string {
    std::vector<int32_t> in(8), out(8, -1);
    for (int i = 0; i < 8; ++i) in[i] = rank * 100 + i;
    RANK_NCCL(ncclAlltoAll(in.data(), out.data(), 4, ncclInt32, comm, nullptr));
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclAlltoAll(in.data(), out.data(), 4, ncclInt32, comm, nullptr));
    RANK_NCCL(ncclGroupEnd());
    for (int p = 0; p < nranks; ++p)
      for (int i = 0; i < 4; ++i) RANK_CHECK(out[p * 4 + i] == p * 100 + rank * 4 + i, "[%d] = %d", p * 4 + i, out[p * 4 + i]);
    return "";
  });
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  const Log log = readLog(log_);
  expectAllStopped(log);
  for (int rank = 0; rank < 2; ++rank) {
    const auto groups = log.of(abi::kGroupApi, log.ctxOfRank(rank));
    ASSERT_EQ(groups.size(), 2u);
    EXPECT_EQ(groups[0]->num("depth"), 1);
    EXPECT_EQ(groups[1]->num("depth"), 2);
    for (const Event* g : groups) EXPECT_EQ(log.children(g->id, abi::kP2pApi).size(), 4u) << "a send and a receive per rank";
  }
}

// A communicator aborted inside a group: its plugin context is finalised with it, and the
// group's end touches none of its events after that (before, it recorded and stopped the
// group's event through the freed communicator).
TEST_F(ProfilerPluginTest, AnAbortInsideAGroupLeavesItsEventsAlone) {
  EnvGuard plugin("NCCL_PROFILER_PLUGIN", pluginPath(5).c_str());
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  std::vector<float> x(16, 1.0f);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(x.data(), x.data(), x.size(), ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  ASSERT_EQ(ncclCommAbort(comm), ncclSuccess);
  EXPECT_NE(ncclGroupEnd(), ncclSuccess);
  const Log log = readLog(log_);
  ASSERT_EQ(log.finalizeLine.size(), 1u);
  const int fin = log.finalizeLine.begin()->second;
  ASSERT_EQ(log.of(abi::kGroupApi).size(), 1u);
  for (const auto& [id, e] : log.events) {
    EXPECT_LT(e.stopLine, fin) << "event " << id << " stopped after its context was finalised";
    EXPECT_LT(e.lastStateLine, fin) << "event " << id << " updated after its context was finalised";
  }
  EXPECT_EQ(log.lines, fin + 1) << "nothing after the finalize";
}

// An operation that fails while it runs (its communicator aborted from another thread while
// it waits for a peer that never comes) stops the channel events it started.
TEST_F(ProfilerPluginTest, AFailedOperationStopsItsChannelEvents) {
  EnvGuard plugin("NCCL_PROFILER_PLUGIN", pluginPath(5).c_str());
  ncclComm_t comms[2];
  ASSERT_EQ(ncclCommInitAll(comms, 2, nullptr), ncclSuccess);
  std::vector<float> x(1024, 1.0f);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ncclCommAbort(comms[0]);
  });
  EXPECT_NE(ncclAllReduce(x.data(), x.data(), x.size(), ncclFloat32, ncclSum, comms[0], nullptr), ncclSuccess);
  t.join();
  EXPECT_EQ(ncclCommDestroy(comms[1]), ncclSuccess);
  const Log log = readLog(log_);
  const auto colls = log.of(abi::kColl);
  ASSERT_EQ(colls.size(), 1u);
  const auto ch = log.children(colls[0]->id, abi::kKernelCh);
  ASSERT_GE(ch.size(), 1u) << "the operation began";
  for (const Event* k : ch) {
    EXPECT_EQ(k->stops, 1);
    ASSERT_EQ(k->states.size(), 1u);
    EXPECT_EQ(k->states[0].first, abi::kStateKernelChStop);
  }
  expectAllStopped(log);
}

TEST(ProfilerPluginLoader, NamesAsNccl) {
  EXPECT_EQ(loom::profilerLibraryNames(nullptr), std::vector<std::string>{"libnccl-profiler.so"});
  EXPECT_EQ(loom::profilerLibraryNames("inspector"),
            (std::vector<std::string>{"inspector", "libnccl-profiler-inspector.so"}));
  EXPECT_EQ(loom::profilerLibraryNames("/x/libp.so"), std::vector<std::string>{"/x/libp.so"});
  std::string path;
  {
    EnvGuard none("NCCL_PROFILER_PLUGIN", "NONE");
    EXPECT_EQ(loom::processProfilerPlugin(&path), "none (NCCL_PROFILER_PLUGIN=none)");
    EXPECT_EQ(path, "");
  }
  {
    EnvGuard missing("NCCL_PROFILER_PLUGIN", "/nonexistent/libnccl-profiler-x.so");
    EXPECT_NE(loom::processProfilerPlugin(&path).find("does not load"), std::string::npos);
    EXPECT_EQ(path, "");
  }
  {
    // As NCCL: STATIC_PLUGIN is the program itself (this test exports no profiler); empty is unset.
    EnvGuard self("NCCL_PROFILER_PLUGIN", "STATIC_PLUGIN"), net("NCCL_NET_PLUGIN", "none");
    EXPECT_EQ(loom::processProfilerPlugin(&path), "none: STATIC_PLUGIN loads but exports no ncclProfiler_v4..v6 symbol");
    EnvGuard empty("NCCL_PROFILER_PLUGIN", "");
    EXPECT_NE(loom::processProfilerPlugin(&path).find("libnccl-profiler.so does not load"), std::string::npos);
  }
  {
    EnvGuard v3("NCCL_PROFILER_PLUGIN", pluginPath(3).c_str());
    EXPECT_EQ(loom::processProfilerPlugin(&path),
              "none: " + pluginPath(3) + " exports only ncclProfiler_v3 or older, which Loom does not load");
    EXPECT_EQ(path, "");
  }
  {
    EnvGuard v6("NCCL_PROFILER_PLUGIN", pluginPath(6).c_str());
    EXPECT_EQ(loom::processProfilerPlugin(&path), "loomtest-v6 (v6, " + pluginPath(6) + ")");
    EXPECT_EQ(path, pluginPath(6));
  }
}

}  // namespace
}  // namespace loomtest
