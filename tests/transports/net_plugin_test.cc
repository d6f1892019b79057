// The NCCL net-plugin loader (issue 12, item 1) against Loom's test plugins, one per ABI
// version (tests/transports/test_net_plugin.cc): NCCL_NET_PLUGIN's forms, the newest
// symbol winning, each version's init/finalize discipline, misbehaving plugins turned into
// clear errors, and collectives across ranks posing as hosts served by a plugin chosen
// without NCCL_NET. (The conformance suite runs over every version: net_backend_test.cc.)
#include <nccl.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/hmac.h"
#include "transports/net/plugin_backend.h"
#include "transports/test_plugins.h"
#include "transports/transport_test_util.h"

namespace loomtest {
namespace {

using loom::PluginLoad;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

loom::NetContext context(int rank) {
  loom::JobId job;
  loom::randomBytes(job.secret, sizeof(job.secret));
  job.jobTag = 42;
  return {job, rank, 2, {"lo", loom::SocketAddr::parse("127.0.0.1:0", "plugin test")}};
}

TEST(NetPluginLoader, EntryNamesAreTriedAsGivenThenAsLibncclNet) {
  using V = std::vector<std::string>;
  EXPECT_EQ(loom::pluginLibraryNames("ofi"), (V{"ofi", "libnccl-net-ofi.so"}));
  EXPECT_EQ(loom::pluginLibraryNames("foo.so"), (V{"foo.so", "libnccl-net-foo.so.so"}));
  EXPECT_EQ(loom::pluginLibraryNames("libnccl-net-x.so"), (V{"libnccl-net-x.so"}));
  EXPECT_EQ(loom::pluginLibraryNames("/opt/p/libx.so.1"), (V{"/opt/p/libx.so.1"}));
}

TEST(NetPluginLoader, UnsetTriesLibncclNetNoneAndEmptyLoadNothing) {
  PluginLoad unset = loom::loadNetPlugins(nullptr);
  EXPECT_FALSE(unset.requested);
  EXPECT_TRUE(unset.plugins.empty()) << "this machine has no libnccl-net.so";
  ASSERT_EQ(unset.failures.size(), 1u);
  EXPECT_TRUE(contains(unset.failures[0], "libnccl-net.so")) << unset.failures[0];
  for (const char* spec : {"none", "NONE", "", ",,"}) {
    PluginLoad l = loom::loadNetPlugins(spec);
    EXPECT_FALSE(l.requested) << spec;
    EXPECT_TRUE(l.plugins.empty() && l.failures.empty()) << spec;
  }
}

TEST(NetPluginLoader, EachVersionLoadsAsItself) {
  for (int v = 6; v <= 11; ++v) {
    std::string path = testPluginPath(std::to_string(v));
    PluginLoad l = loom::loadNetPlugins(path.c_str());
    ASSERT_EQ(l.plugins.size(), 1u) << path << ": " << (l.failures.empty() ? "" : l.failures[0]);
    EXPECT_TRUE(l.requested);
    EXPECT_EQ(l.plugins[0]->version(), v);
    EXPECT_EQ(l.plugins[0]->name(), "LoomTest");
    EXPECT_EQ(l.plugins[0]->path(), path);
    EXPECT_TRUE(contains(l.plugins[0]->describe(), "v" + std::to_string(v))) << l.plugins[0]->describe();
  }
}

TEST(NetPluginLoader, NewestSymbolWins) {
  PluginLoad l = loom::loadNetPlugins(testPluginPath("multi").c_str());
  ASSERT_EQ(l.plugins.size(), 1u);
  EXPECT_EQ(l.plugins[0]->version(), 11);
  EXPECT_EQ(l.plugins[0]->name(), "LoomTest") << "took the v6 table (LoomTestOld)";
}

// A list keeps its order; entries that fail are reported with every name tried and the
// loader's own words, and the others still load.
TEST(NetPluginLoader, ListOrderAndFailuresNamingWhatWasTried) {
  std::string spec = testPluginPath("6") + ",,no-such-plugin," + "libm.so.6," + testPluginPath("11");
  PluginLoad l = loom::loadNetPlugins(spec.c_str());
  ASSERT_EQ(l.plugins.size(), 2u);
  EXPECT_EQ(l.plugins[0]->version(), 6);
  EXPECT_EQ(l.plugins[1]->version(), 11);
  ASSERT_EQ(l.failures.size(), 2u);
  EXPECT_TRUE(contains(l.failures[0], "no-such-plugin") &&
              contains(l.failures[0], "libnccl-net-no-such-plugin.so") &&
              contains(l.failures[0], "cannot open shared object file"))
      << l.failures[0];
  EXPECT_TRUE(contains(l.failures[1], "exports no ncclNetPlugin_v6..v11 symbol")) << l.failures[1];
}

// The test plugin's event log (LOOM_TEST_NET_COUNTS), and how often `what` is in it.
std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

int occurrences(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// v11: a context per communicator, finalised once its last comm is closed; v6-v10: the
// plugin's init runs once per process, however many communicators use it.
TEST(NetPluginLifecycle, V11InitsPerCommunicatorOlderOncePerProcess) {
  std::string counts = testing::TempDir() + "loom_plugin_counts_" + std::to_string(getpid());
  unlink(counts.c_str());
  EnvGuard c("LOOM_TEST_NET_COUNTS", counts.c_str());
  {
    auto a = loom::makePluginNetBackend(testPlugin(11), context(0));
    auto b = loom::makePluginNetBackend(testPlugin(11), context(1));
    loom::NetHandle h;
    auto listen = b->listen(0, &h);
    a.reset();  // the backend goes; its context stays while `listen` (on b) lives
    auto x = loom::makePluginNetBackend(testPlugin(7), context(0));
    auto y = loom::makePluginNetBackend(testPlugin(7), context(1));
  }
  std::string s = readFile(counts);
  auto count = [&](const std::string& what) { return occurrences(s, what); };
  EXPECT_EQ(count("init v11"), 2) << s;
  EXPECT_EQ(count("finalize v11"), 2) << s;
  EXPECT_LE(count("init v7"), 1) << "a legacy plugin was initialised per communicator: " << s;
  unlink(counts.c_str());
}

TEST(NetPluginMisbehaving, InitFailureAndNoDevicesNameThePlugin) {
  {
    EnvGuard m("LOOM_TEST_NET_MODE", "init_fails");
    try {
      loom::makePluginNetBackend(testPlugin(11), context(0));
      FAIL() << "a failed init was accepted";
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::Code::kSystemError);
      EXPECT_TRUE(contains(e.what(), "LoomTest (v11") && contains(e.what(), "init returned ncclSystemError"))
          << e.what();
    }
  }
  EnvGuard m("LOOM_TEST_NET_MODE", "zero_devices");
  try {
    loom::makePluginNetBackend(testPlugin(11), context(0));
    FAIL() << "a plugin without devices was accepted";
  } catch (const loom::Error& e) {
    EXPECT_TRUE(contains(e.what(), "no network device")) << e.what();
  }
}

// A receive the plugin reports larger than its buffer is an error naming both sizes.
TEST(NetPluginMisbehaving, WrongSizeReportIsAnError) {
  EnvGuard m("LOOM_TEST_NET_MODE", "wrong_sizes");
  loom::NetContext c0 = context(0), c1 = c0;
  c1.rank = 1;
  auto a = loom::makePluginNetBackend(testPlugin(11), c0);
  auto b = loom::makePluginNetBackend(testPlugin(11), c1);
  loom::NetHandle h;
  auto listen = b->listen(0, &h);
  std::unique_ptr<loom::NetStage> cs, as;
  std::unique_ptr<loom::NetSendComm> send;
  std::unique_ptr<loom::NetRecvComm> recv;
  for (int i = 0; i < 100000 && !(send && recv); ++i) {
    if (!send) send = a->connect(0, h, cs);
    if (!recv) recv = listen->accept(as);
  }
  ASSERT_TRUE(send && recv);
  auto smr = send->regMr(nullptr, 0, loom::NetMemType::kHost);
  auto rmr = recv->regMr(nullptr, 0, loom::NetMemType::kHost);
  char out[10] = "abcdefghi", in[64];
  loom::NetRequest* s = send->isend(out, sizeof(out), 0, smr.get());
  loom::NetRequest* r = recv->irecv(in, sizeof(in), 0, rmr.get());
  ASSERT_TRUE(s && r);
  size_t bytes = 0;
  try {
    for (int i = 0; i < 1000000; ++i) {
      send->test(s, &bytes);
      if (recv->test(r, &bytes)) break;
    }
    FAIL() << "a 65-byte report for a 64-byte receive was accepted";
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.code(), loom::Code::kInternalError);
    EXPECT_TRUE(contains(e.what(), "65-byte receive into a 64-byte buffer")) << e.what();
  }
}

// ---- through the public API: ranks posing as hosts, the plugin chosen without NCCL_NET ----

using NetPluginJob = TransportLogTest;

std::function<void(int)> ownHosts() {
  return [](int rank) { setenv("LOOM_HOSTID", ("plughost" + std::to_string(rank)).c_str(), 1); };
}

TEST_F(NetPluginJob, EveryVersionServesCollectivesWithoutNcclNet) {
  for (int v : {6, 8, 11}) {
    SCOPED_TRACE("v" + std::to_string(v));
    EnvGuard p("NCCL_NET_PLUGIN", testPluginPath(std::to_string(v)).c_str());
    EnvGuard n("NCCL_NET", nullptr);
    clearLogs();
    auto f = runRanks(Mode::kProcesses, 3, exercise, processRanks(ownHosts()));
    ASSERT_TRUE(f.empty()) << joinFailures(f);
    expectRingTransports(3, [](int, int) { return "net/LoomTest"; });
  }
}

// A rank killed mid-job: the plugin-served survivors fail with ncclRemoteError within
// seconds, naming the peer, and never hang.
TEST_F(NetPluginJob, KilledPeerFailsTheOthersPromptly) {
  EnvGuard p("NCCL_NET_PLUGIN", testPluginPath("11").c_str());
  EnvGuard n("NCCL_NET", nullptr);
  killedPeerFailsTheOthers("LoomTest", processRanks(ownHosts()));
}

// Ranks as threads of one process share the plugin (a v11 context each, a v8 plugin's
// one init), with connects finished on each communicator's proxy thread (also run under
// ThreadSanitizer).
TEST_F(NetPluginJob, RanksAsThreadsShareThePlugin) {
  EnvGuard shmOff("NCCL_SHM_DISABLE", "1");
  EnvGuard n("NCCL_NET", nullptr);
  for (const char* v : {"11", "8"}) {
    SCOPED_TRACE(v);
    EnvGuard p("NCCL_NET_PLUGIN", testPluginPath(v).c_str());
    EnvGuard m("LOOM_TEST_NET_MODE", "connect_after_accept");
    clearLogs();
    auto f = runRanks(Mode::kThreads, 3, exercise, 60);
    ASSERT_TRUE(f.empty()) << joinFailures(f);
    expectRingTransports(3, [](int, int) { return "net/LoomTest"; });
  }
}

// A rank waiting on the network drives it itself (the proxy's pass on its own thread,
// Proxy::pumpIfFree) instead of only waiting for the proxy thread, which still pumps too:
// both test the plugin's requests, and every result is exact.
TEST_F(NetPluginJob, AWaitingRankDrivesTheNetworkItself) {
  std::string counts = testing::TempDir() + "loom_plugin_threads_" + std::to_string(getpid());
  unlink(counts.c_str());
  EnvGuard c("LOOM_TEST_NET_COUNTS", counts.c_str());
  EnvGuard p("NCCL_NET_PLUGIN", testPluginPath("11").c_str());
  EnvGuard n("NCCL_NET", nullptr);
  auto f = runRanks(Mode::kProcesses, 2, [](int rank, int nranks, ncclComm_t comm) {
    for (int i = 0; i < 20; ++i) {
      std::string e = exercise(rank, nranks, comm);
      if (!e.empty()) return e;
    }
    return std::string();
  }, processRanks(ownHosts()));
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  std::string s = readFile(counts);
  EXPECT_EQ(occurrences(s, "test on another thread"), 2) << s;  // each rank's own thread
  EXPECT_EQ(occurrences(s, "test on loom-proxy"), 2) << s;
  unlink(counts.c_str());
}

// A receive that fails to post (here a receiving comm's fourth: its authentication and two
// steps went in, LOOM_FIFO_DEPTH=2) ends the posting, not the receives posted before it:
// the second message, sent after the first was taken, still arrives; the third, whose
// receive could not be posted, fails naming the plugin's irecv.
TEST_F(NetPluginJob, AReceiveThatFailsToPostLeavesThoseBeforeItReceived) {
  EnvGuard p("NCCL_NET_PLUGIN", testPluginPath("11").c_str());
  EnvGuard n("NCCL_NET", nullptr);
  EnvGuard m("LOOM_TEST_NET_MODE", "irecv_fails_from");
  EnvGuard at("LOOM_TEST_NET_FAIL_AT", "3");
  EnvGuard d("LOOM_FIFO_DEPTH", "2");
  auto f = runRanks(Mode::kProcesses, 2, [](int rank, int, ncclComm_t comm) -> std::string {
    for (int i = 0; i < 3; ++i) {
      int32_t v = 100 + i, got = -1;
      if (rank == 0) {
        if (i > 0) usleep(20000);  // after the receiver took the message before
        RANK_NCCL(ncclSend(&v, 1, ncclInt32, 1, comm, nullptr));
        continue;
      }
      ncclResult_t rc = ncclRecv(&got, 1, ncclInt32, 0, comm, nullptr);
      if (i < 2) {
        RANK_CHECK(rc == ncclSuccess && got == v, "receive %d: %s, got %d: %s", i,
                   ncclGetErrorString(rc), got, ncclGetLastError(comm));
        continue;
      }
      RANK_CHECK(rc != ncclSuccess, "receive %d succeeded though its receive failed to post", i);
      std::string why = ncclGetLastError(comm);
      RANK_CHECK(contains(why, "irecv returned ncclSystemError"), "receive %d: %s", i, why.c_str());
    }
    return std::string();
  }, processRanks(ownHosts()));
  ASSERT_TRUE(f.empty()) << joinFailures(f);
}

// Null requests ("call again") are retried; a plugin that calls setenv() in its init while
// other ranks' threads read the environment does no harm.
TEST_F(NetPluginJob, NullRequestsAndSetenvInInitStillGiveExactResults) {
  EnvGuard p("NCCL_NET_PLUGIN", testPluginPath("11").c_str());
  EnvGuard n("NCCL_NET", "loomtest");  // by the plugin's own name, any case
  for (const char* mode : {"null_requests", "setenv"}) {
    SCOPED_TRACE(mode);
    EnvGuard m("LOOM_TEST_NET_MODE", mode);
    auto f = runRanks(Mode::kProcesses, 3, exercise, processRanks(ownHosts()));
    ASSERT_TRUE(f.empty()) << joinFailures(f);
  }
}

// A plugin that does not start gives way to the built-in network (as NCCL does) unless
// NCCL_NET names it: then every rank fails saying why.
TEST_F(NetPluginJob, PluginWithoutDevicesFallsBackUnlessNamed) {
  EnvGuard p("NCCL_NET_PLUGIN", testPluginPath("11").c_str());
  EnvGuard m("LOOM_TEST_NET_MODE", "zero_devices");
  {
    EnvGuard n("NCCL_NET", nullptr);
    clearLogs();
    auto f = runRanks(Mode::kProcesses, 2, exercise, processRanks(ownHosts()));
    ASSERT_TRUE(f.empty()) << joinFailures(f);
    expectRingTransports(2, [](int, int) { return "socket"; });
  }
  EnvGuard n("NCCL_NET", "LoomTest");
  auto f = runRanks(Mode::kProcesses, 2, exercise, processRanks(ownHosts()));
  ASSERT_EQ(f.size(), 2u) << "init succeeded with a plugin that has no device";
  for (const auto& e : f) EXPECT_TRUE(contains(e, "no network device")) << e;
}

// A connect that never completes ends the init with ncclRemoteError naming the pair, not a
// hang.
TEST_F(NetPluginJob, ConnectThatNeverCompletesTimesOut) {
  EnvGuard p("NCCL_NET_PLUGIN", testPluginPath("11").c_str());
  EnvGuard m("LOOM_TEST_NET_MODE", "connect_never");
  EnvGuard t("LOOM_NET_CONNECT_TIMEOUT", "2");
  auto t0 = std::chrono::steady_clock::now();
  auto f = runRanks(Mode::kProcesses, 2, exercise, processRanks(ownHosts()));
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(f.size(), 2u) << "connected through a plugin that never connects";
  for (const auto& e : f)
    EXPECT_TRUE(contains(e, "remote process exited or there was a network error") &&
                contains(e, "with rank") && contains(e, "timed out after 2 s") &&
                contains(e, "LOOM_NET_CONNECT_TIMEOUT"))
        << e;
  EXPECT_LT(sec, 30) << "the time-out took far longer than LOOM_NET_CONNECT_TIMEOUT";
}

// A plugin whose connect completes only after the peer's accept has run (IB-style
// handshakes): Loom makes every connection before accepting any, so the connect is
// finished on the proxy thread while the init goes on to accept.
TEST_F(NetPluginJob, ConnectThatNeedsThePeersAcceptCompletes) {
  EnvGuard p("NCCL_NET_PLUGIN", testPluginPath("11").c_str());
  EnvGuard m("LOOM_TEST_NET_MODE", "connect_after_accept");
  EnvGuard t("LOOM_NET_CONNECT_TIMEOUT", "20");
  clearLogs();
  auto f = runRanks(Mode::kProcesses, 3, exercise, processRanks(ownHosts()));
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  expectRingTransports(3, [](int, int) { return "net/LoomTest"; });
}

// NCCL_NET naming nothing there is lists the plugins and why the others did not load.
TEST_F(NetPluginJob, UnknownNetListsPluginsAndLoadFailures) {
  std::string spec = testPluginPath("9") + ",no-such-plugin";
  EnvGuard p("NCCL_NET_PLUGIN", spec.c_str());
  EnvGuard n("NCCL_NET", "Carrier-Pigeon");
  auto f = runRanks(Mode::kThreads, 2, [](int, int, ncclComm_t) { return std::string(); }, 60);
  ASSERT_EQ(f.size(), 2u);
  for (const auto& e : f)
    EXPECT_TRUE(contains(e, "NCCL_NET=Carrier-Pigeon") && contains(e, "LoomTest") && contains(e, "Socket") &&
                contains(e, "libnccl-net-no-such-plugin.so"))
        << e;
}

}  // namespace
}  // namespace loomtest

namespace loomtest {
namespace {

using NetRails = TransportLogTest;

// Rails (issue 12 item 4): with a 2-device backend (the test plugin; its devices are rails
// with no links between them, so a connection across rails is refused), the ranks of a
// host spread over the devices by local rank: on 2 hosts of 2 ranks, local rank 1's
// connections use device 1, local rank 0's device 0, and both ends of every connection
// use the same device. The results are exact.
TEST_F(NetRails, LocalRanksSpreadOverDevicesRailAligned) {
  std::string counts = dir_ + "/counts";
  EnvGuard p("NCCL_NET_PLUGIN", testPluginPath("11").c_str());
  EnvGuard n("NCCL_NET", nullptr);
  EnvGuard d("LOOM_TEST_NET_DEVICES", "2");
  EnvGuard c("LOOM_TEST_NET_COUNTS", counts.c_str());
  auto f = runRanks(Mode::kProcesses, 4, exercise, processRanks([](int rank) {
    setenv("LOOM_HOSTID", ("railhost" + std::to_string(rank / 2)).c_str(), 1);
  }));
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  expectRails(4, "loomtest-lo", "loomtest-lo1");
  std::string s = readFile(counts);
  auto count = [&](const std::string& what) { return occurrences(s, what); };
  for (int dev : {0, 1}) {
    std::string x = std::to_string(dev);
    EXPECT_GT(count("listen-dev" + x + " "), 0) << "device " << dev << " unused: " << s;
    EXPECT_EQ(count("connect-dev" + x + " "), count("listen-dev" + x + " ")) << s;
  }
  unlink(counts.c_str());
}

// NCCL_CROSS_NIC=1: each end takes its own rail. On 2 hosts of 2 ranks the ring's hops
// between hosts go from local rank 1 to local rank 0, so their senders connect on device 1
// to listeners on device 0: across rails. Where the rails are linked (the test plugin's
// LOOM_TEST_NET_CROSS_RAIL=1) the results are exact and some connect lands on another
// device than its listen; where they are not, the connect's refusal fails every rank with
// an error naming the plugin, not a hang. A value outside 0..2 fails the init.
TEST_F(NetRails, CrossNicOneLetsEachEndUseItsOwnRail) {
  std::string counts = dir_ + "/counts";
  EnvGuard p("NCCL_NET_PLUGIN", testPluginPath("11").c_str());
  EnvGuard n("NCCL_NET", nullptr);
  EnvGuard d("LOOM_TEST_NET_DEVICES", "2");
  EnvGuard c("LOOM_TEST_NET_COUNTS", counts.c_str());
  EnvGuard x("NCCL_CROSS_NIC", "1");
  auto hosts = processRanks([](int rank) {
    setenv("LOOM_HOSTID", ("railhost" + std::to_string(rank / 2)).c_str(), 1);
  });
  {
    EnvGuard linked("LOOM_TEST_NET_CROSS_RAIL", "1");
    auto f = runRanks(Mode::kProcesses, 4, exercise, hosts);
    ASSERT_TRUE(f.empty()) << joinFailures(f);
    std::string s = readFile(counts);
    EXPECT_NE(occurrences(s, "connect-dev1 "), occurrences(s, "listen-dev1 "))
        << "every connect used its listener's device: " << s;
    unlink(counts.c_str());
  }
  auto f = runRanks(Mode::kProcesses, 4, exercise, hosts);
  ASSERT_FALSE(f.empty()) << "connected across rails that have no links";
  bool named = false;
  for (const auto& e : f) named |= contains(e, "LoomTest") || contains(e, "plugin");
  EXPECT_TRUE(named) << joinFailures(f);
  unlink(counts.c_str());
  EnvGuard bad("NCCL_CROSS_NIC", "3");
  f = runRanks(Mode::kProcesses, 2, exercise, processRanks(ownHosts()));
  ASSERT_EQ(f.size(), 2u);
  for (const auto& e : f) EXPECT_TRUE(contains(e, "NCCL_CROSS_NIC=3: expected 0, 1 or 2")) << e;
}

}  // namespace
}  // namespace loomtest
