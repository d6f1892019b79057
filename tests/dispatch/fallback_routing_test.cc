// The fallback at work: a communicator's shadow over stock NCCL, and each call routed by
// its buffers (device memory to stock NCCL, host memory to Loom).
//
// Two executables run this file (tests/dispatch/CMakeLists.txt):
//  - dispatch_fallback_stand_in_test: the stand-in CUDA driver gives the ranks devices and
//    marks chosen host allocations as device memory; the stand-in stock NCCL
//    (stand_in_nccl.cc) moves their data and logs what reaches it (the StandInStock suite);
//  - dispatch_fallback_real_stock_test: the same stand-in driver, but the machine's real
//    stock NCCL, which has no GPU here: the RealStock suite checks that its own error
//    reaches every rank cleanly. Where a GPU exists, stock NCCL would succeed instead, so
//    that suite skips, saying so.
#include "dispatch/nccl_extra_abi.h"
#include "dispatch/routing_fixture.h"

namespace {

using namespace routing;

#ifdef LOOM_STAND_IN_NCCL_PATH

const auto kStream0 = reinterpret_cast<cudaStream_t>(0x5100);
const auto kStream1 = reinterpret_cast<cudaStream_t>(0x5101);

TEST_F(StandInStock, DeviceCallsGoToStockAndHostCallsStayWithLoom) {
  const int liveBefore = log_.live();
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  std::string init = log_.str();
  // Rank 0 took one id; both shadows joined it, non-blocking, as ranks 0 and 1 of 2, each
  // on its rank's device (made current on the init thread).
  EXPECT_EQ(countOf(init, "GetUniqueId"), 1u) << init;
  EXPECT_TRUE(has(init, "rank=0 nranks=2 blocking=0 device=0")) << init;
  EXPECT_TRUE(has(init, "rank=1 nranks=2 blocking=0 device=1")) << init;
  EXPECT_EQ(log_.live(), liveBefore + 2);
  log_.clear();

  constexpr size_t n = 1000;
  float* s0 = deviceFloats(n, 0, 1), *r0 = deviceFloats(n, 0, -1);
  float* s1 = deviceFloats(n, 1, 10), *r1 = deviceFloats(n, 1, -1);
  // One thread drives both ranks in a group: stock NCCL gets one group of two calls.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(s0, r0, n, ncclFloat, ncclSum, c[0], kStream0), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(s1, r1, n, ncclFloat, ncclSum, c[1], kStream1), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (size_t i = 0; i < n; ++i) {
    const float want = 11 + 2 * static_cast<float>(i % 7);
    ASSERT_EQ(r0[i], want) << i;
    ASSERT_EQ(r1[i], want) << i;
  }
  std::string calls = log_.str();
  EXPECT_EQ(calls.find("GroupStart"), 0u) << calls;
  EXPECT_TRUE(has(calls, "rank=0 count=1000 op=0 stream=0x5100")) << calls;
  EXPECT_TRUE(has(calls, "rank=1 count=1000 op=0 stream=0x5101")) << calls;
  EXPECT_EQ(countOf(calls, "GroupEnd"), 1u) << calls;
  // Stock's group end answered "in progress" for both non-blocking shadows: both settled.
  for (int k = 0; k < 2; ++k) {
    ncclResult_t e = ncclInternalError;
    ASSERT_EQ(ncclCommGetAsyncError(c[k], &e), ncclSuccess);
    EXPECT_EQ(e, ncclSuccess) << "rank " << k;
  }

  // A thread per rank, outside any group.
  log_.clear();
  std::thread t([&] { EXPECT_EQ(ncclAllReduce(s1, r1, n, ncclFloat, ncclMax, c[1], kStream1),
                                ncclSuccess); });
  EXPECT_EQ(ncclAllReduce(s0, r0, n, ncclFloat, ncclMax, c[0], kStream0), ncclSuccess);
  t.join();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(r0[i], 10 + static_cast<float>(i % 7)) << i;
  EXPECT_EQ(countOf(log_.str(), "AllReduce"), 2u);
  EXPECT_FALSE(has(log_.str(), "Group")) << log_.str();

  // Host buffers: Loom, exactly, and nothing reaches stock NCCL.
  log_.clear();
  std::vector<float> h0(n, 2), h1(n, 5), o0(n), o1(n);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(h0.data(), o0.data(), n, ncclFloat, ncclSum, c[0], nullptr), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(h1.data(), o1.data(), n, ncclFloat, ncclSum, c[1], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(o0, std::vector<float>(n, 7));
  EXPECT_EQ(o1, std::vector<float>(n, 7));
  EXPECT_EQ(log_.str(), "");
}

TEST_F(StandInStock, AllToAllOnDeviceBuffersTravelsAsStockSendsAndReceives) {
  Comms c({2, 3});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  constexpr size_t n = 64;  // per peer
  float* s[2] = {deviceFloats(2 * n, 2, 100), deviceFloats(2 * n, 3, 200)};
  float* r[2] = {deviceFloats(2 * n, 2, 0), deviceFloats(2 * n, 3, 0)};
  log_.clear();
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int k = 0; k < 2; ++k)
    ASSERT_EQ(ncclAlltoAll(s[k], r[k], n, ncclFloat, c[k], kStream0), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  // Rank k's block p is rank p's block k.
  for (int k = 0; k < 2; ++k)
    for (int p = 0; p < 2; ++p)
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(r[k][p * n + i], s[p][k * n + i]) << k << " " << p << " " << i;
  std::string calls = log_.str();
  EXPECT_EQ(countOf(calls, "Send "), 4u) << calls;
  EXPECT_EQ(countOf(calls, "Recv "), 4u) << calls;
}

TEST_F(StandInStock, PreMulSumRunsAsItsTwinOnStock) {
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  float scalar = 3;
  ncclRedOp_t op[2];
  for (int k = 0; k < 2; ++k)
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op[k], &scalar, ncclFloat, ncclScalarHostImmediate, c[k]),
              ncclSuccess);
  EXPECT_EQ(countOf(log_.str(), "RedOpCreatePreMulSum"), 2u) << log_.str();
  constexpr size_t n = 32;
  float* s[2] = {deviceFloats(n, 0, 1), deviceFloats(n, 1, 2)};
  float* r[2] = {deviceFloats(n, 0, 0), deviceFloats(n, 1, 0)};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int k = 0; k < 2; ++k)
    ASSERT_EQ(ncclAllReduce(s[k], r[k], n, ncclFloat, op[k], c[k], kStream0), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(r[0][i], 3 * (3 + 2 * static_cast<float>(i % 7))) << i;
  // Host buffers with the same op: Loom's own pre-multiplied sum.
  std::vector<float> h0(n, 1), h1(n, 2), o0(n), o1(n);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(h0.data(), o0.data(), n, ncclFloat, op[0], c[0], nullptr), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(h1.data(), o1.data(), n, ncclFloat, op[1], c[1], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(o0, std::vector<float>(n, 9));
  for (int k = 0; k < 2; ++k) ASSERT_EQ(ncclRedOpDestroy(op[k], c[k]), ncclSuccess);
  EXPECT_EQ(countOf(log_.str(), "RedOpDestroy"), 2u) << log_.str();
}

TEST_F(StandInStock, StockAsyncErrorReachesGetAsyncErrorOfItsOwnCommunicator) {
  Comms c({0, 1, 2});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  ncclResult_t e = ncclInternalError;
  ASSERT_EQ(ncclCommGetAsyncError(c[1], &e), ncclSuccess);
  EXPECT_EQ(e, ncclSuccess);
  log_.setCommAsyncError(1, 3, ncclRemoteError);  // rank 1's shadow only
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(ncclCommGetAsyncError(c[k], &e), ncclSuccess);
    EXPECT_EQ(e, k == 1 ? ncclRemoteError : ncclSuccess) << "rank " << k;
  }
  log_.setCommAsyncError(1, 3, ncclSuccess);
}

TEST_F(StandInStock, FinalizeDestroyAndAbortReachStock) {
  const int liveBefore = log_.live();
  ncclComm_t comms[2];
  int devs[2] = {0, 1};
  ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess);
  EXPECT_EQ(log_.live(), liveBefore + 2);
  log_.clear();
  ASSERT_EQ(ncclCommFinalize(comms[0]), ncclSuccess);
  // Stock's finalize answered "in progress"; Loom's returned once it had settled.
  ncclResult_t e = ncclInternalError;
  ASSERT_EQ(ncclCommGetAsyncError(comms[0], &e), ncclSuccess);
  EXPECT_EQ(e, ncclSuccess);
  ASSERT_EQ(ncclCommDestroy(comms[0]), ncclSuccess);
  ASSERT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
  std::string calls = log_.str();
  EXPECT_TRUE(has(calls, "CommFinalize")) << calls;
  EXPECT_TRUE(has(calls, "rank=0\nCommDestroy")) << calls;  // finalize, then destroy
  EXPECT_TRUE(has(calls, "CommAbort")) << calls;
  EXPECT_EQ(countOf(calls, "CommDestroy"), 1u) << calls;    // the aborted one is not destroyed
  EXPECT_EQ(log_.live(), liveBefore);
}

TEST_F(StandInStock, SplitChildrenGetShadowsOfTheirOwn) {
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  log_.clear();
  ncclComm_t child[2] = {nullptr, nullptr};
  std::thread t([&] {
    const int before = loom::cuda::currentDevice();
    EXPECT_EQ(ncclCommSplit(c[1], 1, 0, &child[1], nullptr), ncclSuccess);
    // The child's shadow was made on device 1, and this thread's device is as it was.
    EXPECT_EQ(loom::cuda::currentDevice(), before);
  });
  EXPECT_EQ(ncclCommSplit(c[0], 0, 0, &child[0], nullptr), ncclSuccess);
  t.join();
  std::string calls = log_.str();
  EXPECT_EQ(countOf(calls, "GetUniqueId"), 2u) << calls;  // one per child communicator
  EXPECT_EQ(countOf(calls, "rank=0 nranks=1"), 2u) << calls;
  // Each child on its parent's device, whatever the splitting thread had current.
  EXPECT_TRUE(has(calls, "rank=0 nranks=1 blocking=0 device=0")) << calls;
  EXPECT_TRUE(has(calls, "rank=0 nranks=1 blocking=0 device=1")) << calls;
  float* s = deviceFloats(8, 1, 4), *r = deviceFloats(8, 1, 0);
  ASSERT_EQ(ncclAllReduce(s, r, 8, ncclFloat, ncclSum, child[1], kStream1), ncclSuccess);
  EXPECT_EQ(r[3], 7);
  for (ncclComm_t k : child) ASSERT_EQ(ncclCommDestroy(k), ncclSuccess);
}

// ncclCommGrow (NCCL 2.29): the grown communicator is made by an init like any other, so it
// has a shadow of its own, the existing rank's on its parent's device and the new rank's on
// the device current on its thread; device buffers then go to stock NCCL.
TEST_F(StandInStock, GrownCommunicatorGetsAShadowOfItsOwn) {
  Comms c({0});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  ncclUniqueId growId;
  ASSERT_EQ(ncclCommGetUniqueId(c[0], &growId), ncclSuccess) << ncclGetLastError(c[0]);
  ASSERT_TRUE(hooks_.bindStreams());
  log_.clear();
  ncclComm_t grown[2] = {nullptr, nullptr};
  std::thread t([&] {
    const int before = hooks_.exchangeThreadDevice(1);  // this thread's own device
    EXPECT_EQ(ncclCommGrow(nullptr, 2, &growId, 1, &grown[1], nullptr), ncclSuccess)
        << ncclGetLastError(nullptr);
    hooks_.exchangeThreadDevice(before);
  });
  // The existing rank's on its parent's device (0), whatever is current on its thread.
  const int before = hooks_.exchangeThreadDevice(2);
  EXPECT_EQ(ncclCommGrow(c[0], 2, &growId, -1, &grown[0], nullptr), ncclSuccess)
      << ncclGetLastError(nullptr);
  hooks_.exchangeThreadDevice(before);
  t.join();
  ASSERT_NE(grown[0], nullptr);
  ASSERT_NE(grown[1], nullptr);
  std::string calls = log_.str();
  EXPECT_EQ(countOf(calls, "GetUniqueId"), 1u) << calls;  // rank 0's, for the shadow
  EXPECT_TRUE(has(calls, "rank=0 nranks=2 blocking=0 device=0")) << calls;
  EXPECT_TRUE(has(calls, "rank=1 nranks=2 blocking=0 device=1")) << calls;
  float* s0 = deviceFloats(8, 0, 1), *r0 = deviceFloats(8, 0, 0);
  float* s1 = deviceFloats(8, 1, 4), *r1 = deviceFloats(8, 1, 0);
  std::thread t1([&] {
    EXPECT_EQ(ncclAllReduce(s1, r1, 8, ncclFloat, ncclSum, grown[1], kStream1), ncclSuccess);
  });
  EXPECT_EQ(ncclAllReduce(s0, r0, 8, ncclFloat, ncclSum, grown[0], kStream0), ncclSuccess);
  t1.join();
  EXPECT_EQ(r0[3], 1 + 3 + 4 + 3);
  EXPECT_EQ(r1[3], r0[3]);
  EXPECT_TRUE(has(log_.str(), "AllReduce")) << log_.str();
  for (ncclComm_t g : grown) ASSERT_EQ(ncclCommDestroy(g), ncclSuccess);
}

// The caller's ncclConfig_t reaches stock NCCL's communicator (non-blocking whatever it
// says): CTA limits, CGA cluster size, network, traffic class, name. A config from newer
// headers (longer, of NCCL 2.30) is read as far as NCCL 2.28.9's fields; a split given no
// config passes its parent's on, as NCCL's does.
TEST_F(StandInStock, TheCallersConfigReachesStocksCommunicator) {
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  struct Newer {
    ncclConfig_t known;
    int later[8];
  } cfg;
  cfg.known = NCCL_CONFIG_INITIALIZER;
  cfg.known.size = sizeof(Newer);
  cfg.known.version = NCCL_VERSION(2, 30, 7);
  cfg.known.blocking = 1;
  cfg.known.cgaClusterSize = 4;
  cfg.known.minCTAs = 2;
  cfg.known.maxCTAs = 8;
  cfg.known.trafficClass = 3;
  cfg.known.nvlsCTAs = 5;
  std::string net = "Socket", name = "tp-group";
  cfg.known.netName = net.c_str();
  cfg.known.commName = name.c_str();
  for (int i = 0; i < 8; ++i) cfg.later[i] = 100 + i;
  ncclComm_t kids[2] = {nullptr, nullptr}, grandkids[2] = {nullptr, nullptr};
  log_.clear();
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(ncclCommSplit(c[r], 0, r, &kids[r], &cfg.known), ncclSuccess) << ncclGetLastError(c[r]);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  net = name = "gone";  // the caller's strings need not outlive the call
  // Every byte of it: a newer stock NCCL reads the fields Loom does not know.
  const std::string want = "size=" + std::to_string(sizeof(Newer)) +
                           " newer=100,101,102,103,104,105,106,107 cga=4 minCTAs=2 maxCTAs=8 "
                           "net=Socket trafficClass=3 name=tp-group CTAPolicy=-2147483648 "
                           "nvlsCTAs=5";
  std::string calls = log_.str();
  EXPECT_TRUE(has(calls, "CommConfig rank=0 " + want)) << calls;
  EXPECT_TRUE(has(calls, "CommConfig rank=1 " + want)) << calls;
  EXPECT_EQ(countOf(calls, "blocking=0"), 2u) << calls;
  log_.clear();
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(ncclCommSplit(kids[r], 0, r, &grandkids[r], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  calls = log_.str();
  EXPECT_EQ(countOf(calls, want), 2u) << "the parent's config, passed on\n" << calls;
  for (ncclComm_t k : {grandkids[0], grandkids[1], kids[0], kids[1]}) ncclCommDestroy(k);
}

TEST_F(StandInStock, OffKeepsStockOutAndRefusesDeviceBuffers) {
  ScopedFallback off("off");
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  EXPECT_EQ(log_.str(), "");
  std::string msg = refusal(c[0], 0);
  EXPECT_TRUE(has(msg, "ncclAllReduce: sendbuff")) << msg;
  EXPECT_TRUE(has(msg, "LOOM_NCCL_FALLBACK=off")) << msg;
}

TEST_F(StandInStock, OneSharedGpuKeepsStockOutUnderAutoAndFailsInitUnderForce) {
  {
    Comms c({1, 1});
    ASSERT_EQ(c.rc, ncclSuccess) << c.error;
    EXPECT_EQ(log_.str(), "");
    std::string msg = refusal(c[1], 1);
    EXPECT_TRUE(has(msg, "ranks 0 and 1 share CUDA device 1")) << msg;
  }
  ScopedFallback force("force");
  Comms f({1, 1});
  EXPECT_EQ(f.rc, ncclInvalidUsage);
  EXPECT_TRUE(has(f.error, "LOOM_NCCL_FALLBACK=force, but ranks 0 and 1 share CUDA device 1"))
      << f.error;
  Comms g({0, -1});
  EXPECT_EQ(g.rc, ncclInvalidUsage);
  EXPECT_TRUE(has(g.error, "rank 1 has no CUDA device")) << g.error;
  EXPECT_EQ(log_.str(), "");  // decided before stock NCCL was asked for anything
}

TEST_F(StandInStock, UnknownModeIsInvalidArgument) {
  ScopedFallback bad("sometimes");
  Comms c({0, 1});
  EXPECT_EQ(c.rc, ncclInvalidArgument);
  EXPECT_TRUE(has(c.error, "has a malformed LOOM_NCCL_FALLBACK")) << c.error;
}

// Ranks as processes, each with its own environment: a disagreement or a malformed value
// on one rank fails every rank alike, before stock NCCL is asked for anything. The
// fixture makes no communicator first: the ranks are forked before any Loom thread runs.
using StandInStockProcesses = Fixture;
TEST_F(StandInStockProcesses, ThatDisagreeOnTheKnobAllFail) {
  struct Case {
    const char* modes[2];
    const char* expect;
  };
  const Case cases[] = {
      {{"force", "auto"}, "LOOM_NCCL_FALLBACK differs between ranks (rank 0: force, rank 1: auto)"},
      {{"auto", "bogus"}, "rank 1 has a malformed LOOM_NCCL_FALLBACK"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expect);
    loomtest::RankOptions opt;
    opt.timeoutSec = 60;
    opt.beforeInit = [this, &c](int rank) {
      hooks_.setCurrentDevice(rank);
      setenv("LOOM_NCCL_FALLBACK", c.modes[rank], 1);
    };
    auto failures = loomtest::runRanks(
        loomtest::Mode::kProcesses, 2, [](int, int, ncclComm_t) { return std::string(); }, opt);
    ASSERT_EQ(failures.size(), 2u) << loomtest::joinFailures(failures);
    for (const std::string& f : failures) EXPECT_TRUE(has(f, c.expect)) << f;
  }
}

// One rank's stock init fails: under auto every rank gives its shadow up (the others'
// are aborted) and says why; under force every rank's init fails naming that rank.
TEST_F(StandInStock, OneRanksFailedStockInitTakesEveryShadowDown) {
  const int liveBefore = log_.live();
  log_.failInitOfRank(1);
  {
    Comms c({0, 1});
    ASSERT_EQ(c.rc, ncclSuccess) << c.error;
    std::string calls = log_.str();
    EXPECT_TRUE(has(calls, "CommInitRank rank=1 failed")) << calls;
    EXPECT_TRUE(has(calls, "CommAbort id=")) << calls;  // rank 0's shadow
    EXPECT_EQ(log_.live(), liveBefore);
    std::string msg = refusal(c[0], 0);
    EXPECT_TRUE(has(msg, "could not create its communicator on rank 1")) << msg;
    EXPECT_TRUE(has(msg, "this rank's init fails")) << msg;
  }
  {
    ScopedFallback force("force");
    Comms f({0, 1});
    EXPECT_EQ(f.rc, ncclUnhandledCudaError);
    EXPECT_TRUE(has(f.error, "LOOM_NCCL_FALLBACK=force, but stock NCCL")) << f.error;
    EXPECT_TRUE(has(f.error, "on rank 1")) << f.error;
  }
  log_.failInitOfRank(-1);
  EXPECT_EQ(log_.live(), liveBefore);
}

#else  // the machine's real stock NCCL


TEST_F(RealStock, ForceReportsStockNcclsOwnErrorOnEveryRankWithoutHanging) {
  ScopedFallback force("force");
  Comms c({0, 1});
  EXPECT_NE(c.rc, ncclSuccess);
  EXPECT_NE(c.rc, ncclInProgress);
  EXPECT_TRUE(has(c.error, "LOOM_NCCL_FALLBACK=force, but stock NCCL (")) << c.error;
  EXPECT_TRUE(has(c.error, "could not create its communicator on rank 0")) << c.error;
}

TEST_F(RealStock, AutoKeepsLoomAndSaysWhyDeviceBuffersAreRefused) {
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  std::string msg = refusal(c[0], 0);
  EXPECT_TRUE(has(msg, "LOOM_NCCL_FALLBACK=auto, but stock NCCL (")) << msg;
  EXPECT_TRUE(has(msg, "could not create its communicator")) << msg;
  // Host buffers are unaffected.
  std::vector<float> h0(8, 1), h1(8, 2);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(h0.data(), h0.data(), 8, ncclFloat, ncclSum, c[0], nullptr), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(h1.data(), h1.data(), 8, ncclFloat, ncclSum, c[1], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(h0, std::vector<float>(8, 3));
}

// Ranks as processes: the stock id crosses Loom's bootstrap, stock NCCL fails in each
// process, and the outcome exchange still ends every rank promptly with the same error.
TEST_F(RealStock, ForceFailsEveryProcessRankWithoutHanging) {
  ScopedFallback force("force");  // inherited by the forked ranks
  loomtest::RankOptions opt;
  opt.timeoutSec = 60;
  opt.beforeInit = [this](int rank) { hooks_.setCurrentDevice(rank); };
  auto failures = loomtest::runRanks(
      loomtest::Mode::kProcesses, 2, [](int, int, ncclComm_t) { return std::string(); }, opt);
  ASSERT_EQ(failures.size(), 2u) << loomtest::joinFailures(failures);
  for (const std::string& f : failures) {
    EXPECT_TRUE(has(f, "ncclCommInitRank: ")) << f;
    EXPECT_TRUE(has(f, "could not create its communicator on rank 0")) << f;
  }
}

#endif

}  // namespace
