// The transport registry: a transport registered by the test (loopback_transport.h) is
// chosen ahead of shm where its canConnect() says yes, carries collectives with exact
// results, and is named by the INIT summary; priority order and canConnect() decide each
// pair; a blob or peer-info section over its limit, or ranks offering different
// transports, fail init with an error that says so.
#include <nccl.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "transports/loopback_transport.h"
#include "transports/registry.h"
#include "transports/transport_test_util.h"

namespace loomtest {
namespace {

using TransportRegistry = TransportLogTest;

std::vector<std::string> registeredNames() {
  std::vector<std::string> v;
  for (const auto& s : loom::registeredTransports()) v.push_back(s.name);
  return v;
}

TEST_F(TransportRegistry, BuiltinsAndRegistrationsInPriorityOrder) {
  EXPECT_EQ(registeredNames(), (std::vector<std::string>{"shm", "net", "socket"}));
  uint64_t builtin = loom::transportSetHash(loom::registeredTransports());
  {
    LoopbackOptions late, early, middle;
    late.name = "late";
    late.priority = 300;
    early.name = "early";
    early.priority = 10;
    middle.name = "middle";
    middle.priority = 150;
    loom::TransportRegistration a(loopbackSpec(late)), b(loopbackSpec(early)),
        c(loopbackSpec(middle));
    EXPECT_EQ(registeredNames(),
              (std::vector<std::string>{"early", "shm", "net", "middle", "socket", "late"}));
    EXPECT_NE(loom::transportSetHash(loom::registeredTransports()), builtin);
  }
  EXPECT_EQ(registeredNames(), (std::vector<std::string>{"shm", "net", "socket"}));
  EXPECT_EQ(loom::transportSetHash(loom::registeredTransports()), builtin);
}

TEST_F(TransportRegistry, DuplicateNamesAndTooManyAreRefused) {
  LoopbackOptions shm;
  shm.name = "shm";
  try {
    loom::TransportRegistration dup(loopbackSpec(shm));
    FAIL() << "a second 'shm' was registered";
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.code(), loom::Code::kInvalidUsage);
    EXPECT_NE(std::string(e.what()).find("'shm' is already registered"), std::string::npos) << e.what();
  }
  std::vector<std::unique_ptr<loom::TransportRegistration>> regs;
  for (int i = static_cast<int>(registeredNames().size()); i < loom::kMaxTransports; ++i) {
    LoopbackOptions o;
    o.name = "extra" + std::to_string(i);
    regs.push_back(std::make_unique<loom::TransportRegistration>(loopbackSpec(o)));
  }
  EXPECT_EQ(static_cast<int>(registeredNames().size()), loom::kMaxTransports);
  LoopbackOptions one;
  one.name = "one-too-many";
  try {
    loom::TransportRegistration more(loopbackSpec(one));
    FAIL() << "registered transport number " << loom::kMaxTransports + 1;
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sections for 8"), std::string::npos) << e.what();
  }
}

// Threads of one process: the loopback transport (priority 50) wins over shm for every
// pair, moves every byte, and the INIT line names it.
TEST_F(TransportRegistry, TestTransportChosenAheadOfShm) {
  LoopbackOptions opt;
  loom::TransportRegistration reg(loopbackSpec(opt));
  const int n = 4;
  auto f = runRanks(Mode::kThreads, n, exercise, 60);
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  expectRingTransports(n, [](int, int) { return "loopback"; });
  // Every ring pair at least, and each receiver end met its sender.
  EXPECT_GE(opt.stats->setups.load(), n);
  EXPECT_EQ(opt.stats->setups.load(), opt.stats->connects.load());
  EXPECT_EQ(opt.stats->alive.load(), 0) << "connections outlived their communicators";
}

// canConnect() decides per pair, in priority order: a transport that refuses is asked and
// passed over, loopback takes the pairs it admits (ranks of different parity), shm the
// rest, and a transport behind socket (which serves everyone) is never even asked.
TEST_F(TransportRegistry, PriorityOrderAndCanConnectDecideEachPair) {
  LoopbackOptions refuses, odd, late;
  refuses.name = "refuses";
  refuses.priority = 10;
  refuses.never = true;
  odd.name = "oddpairs";
  odd.priority = 20;
  odd.admit = [](const loom::PeerInfo& a, const loom::PeerInfo& b) { return (a.rank + b.rank) % 2 == 1; };
  late.name = "late";
  late.priority = 300;
  loom::TransportRegistration r1(loopbackSpec(refuses)), r2(loopbackSpec(odd)), r3(loopbackSpec(late));
  const int n = 3;  // ring pairs (0,1) and (1,2) are odd, (2,0) is even
  auto f = runRanks(Mode::kThreads, n, exercise, 60);
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  expectRingTransports(n, [](int r, int p) { return (r + p) % 2 ? "oddpairs" : "shm"; });
  EXPECT_GE(refuses.stats->asked.load(), n);
  EXPECT_EQ(refuses.stats->setups.load(), 0);
  EXPECT_GT(odd.stats->setups.load(), 0);
  EXPECT_EQ(late.stats->asked.load(), 0) << "asked although socket, ahead of it, serves everyone";
}

// Processes: the loopback transport says no (another pid), so the pairs fall through to
// shm, or to socket with shm disabled.
TEST_F(TransportRegistry, TestTransportDeclinesOtherProcesses) {
  LoopbackOptions opt;
  loom::TransportRegistration reg(loopbackSpec(opt));
  RankOptions ranks = processRanks();
  auto f = runRanks(Mode::kProcesses, 3, exercise, ranks);
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  expectRingTransports(3, [](int, int) { return "shm"; });
  clearLogs();
  {
    EnvGuard off("NCCL_SHM_DISABLE", "1");
    auto g = runRanks(Mode::kProcesses, 3, exercise, ranks);
    ASSERT_TRUE(g.empty()) << joinFailures(g);
  }
  auto lines = initLines();
  size_t sockets = 0;
  for (auto& [r, line] : lines) sockets += line.find(":socket") != std::string::npos;
  EXPECT_EQ(sockets, 3u) << "with NCCL_SHM_DISABLE=1 every rank should connect via socket";
}

// A blob of exactly kMaxConnBlobBytes goes through; one byte more fails init, and the
// error names the transport, the size and the limit.
TEST_F(TransportRegistry, BlobSizeLimitIsEnforced) {
  {
    LoopbackOptions fits;
    fits.blobBytes = loom::kMaxConnBlobBytes;
    loom::TransportRegistration reg(loopbackSpec(fits));
    auto f = runRanks(Mode::kThreads, 2, exercise, 60);
    EXPECT_TRUE(f.empty()) << joinFailures(f);
    EXPECT_GT(fits.stats->connects.load(), 0);
  }
  LoopbackOptions big;
  big.name = "bigblob";
  big.blobBytes = loom::kMaxConnBlobBytes + 1;
  loom::TransportRegistration reg(loopbackSpec(big));
  auto f = runRanks(Mode::kThreads, 2, [](int, int, ncclComm_t) { return std::string(); }, 60);
  ASSERT_EQ(f.size(), 2u) << "init should fail on both ranks: " << joinFailures(f);
  std::string all = joinFailures(f);
  std::string made = "transport 'bigblob' made a " + std::to_string(loom::kMaxConnBlobBytes + 1) +
                     "-byte setup blob";
  EXPECT_NE(all.find(made), std::string::npos) << all;
  EXPECT_NE(all.find("at most " + std::to_string(loom::kMaxConnBlobBytes)), std::string::npos) << all;
  EXPECT_EQ(big.stats->connects.load(), 0) << "a sender attached to an oversized blob";
  EXPECT_EQ(big.stats->alive.load(), 0) << "the refused receiver ends were not freed";
}

TEST_F(TransportRegistry, PeerSectionLimitIsEnforced) {
  LoopbackOptions wide;
  wide.name = "wide";
  wide.sectionBytes = loom::kPeerSectionBytes + 72;
  loom::TransportRegistration reg(loopbackSpec(wide));
  auto f = runRanks(Mode::kThreads, 2, [](int, int, ncclComm_t) { return std::string(); }, 60);
  ASSERT_EQ(f.size(), 2u) << joinFailures(f);
  EXPECT_NE(f[0].find("transport 'wide' publishes 200 bytes per rank"), std::string::npos) << f[0];
}

// Sections are indexed by registry order, so ranks must offer the same transports: a rank
// that registered one more is refused by everyone, naming the problem.
TEST_F(TransportRegistry, RanksWithDifferentTransportsAreRefused) {
  RankOptions opt;
  opt.timeoutSec = 60;
  opt.beforeInit = [](int rank) {
    if (rank != 1) return;
    LoopbackOptions extra;
    extra.name = "rank1only";
    static loom::TransportRegistration reg(loopbackSpec(extra));  // this process only
  };
  auto f = runRanks(Mode::kProcesses, 3, [](int, int, ncclComm_t) { return std::string(); }, opt);
  ASSERT_EQ(f.size(), 3u) << joinFailures(f);
  for (const auto& e : f)
    EXPECT_NE(e.find("must offer the same transports"), std::string::npos) << e;
}

}  // namespace
}  // namespace loomtest
