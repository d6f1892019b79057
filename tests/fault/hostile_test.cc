// Hostile connections to the ranks' own listeners (issue 6, item 4): while four ranks
// (processes) initialize and while they run collectives that open new connections, a
// stranger connects to every TCP port each rank listens on (bootstrap and transport) and
// sends garbage, nothing, half a hello, oversized headers, hellos with made-up MACs and a
// correctly signed hello meant for another rank. The job must complete with correct
// results and without stalling, and every stranger, silent ones included, must be cut off
// by the rank itself (while it idles: no job activity needed) within the hello time-out,
// with one line in the rank's log saying so.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <nccl.h>

#include <atomic>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/log.h"
#include "core/core_util.h"
#include "fault/fault_util.h"
#include "fault/hostile.h"

namespace loomtest {
namespace {

using namespace fault;

constexpr int kRanks = 4;

struct Board {
  RankSlot ranks[kRanks];
  std::atomic<int64_t> initMs[kRanks];
  std::atomic<int64_t> workMs[kRanks];
  std::atomic<int> go{0};
  std::atomic<int> release{0};  // the test has looked at its strangers: ranks may exit
};

enum Stage { kStarted = 1, kInitDone = 2, kFinished = 3 };

// Collectives that need connections beyond the ring made at init (all-to-all, sends to
// ranks two away), so the listeners are used again while strangers are queued on them.
std::string workload(ncclComm_t comm, int rank) {
  const int n = kRanks;
  std::vector<float> f(1 << 20);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>((rank + 1) * (i % 1000));
  RANK_NCCL(ncclAllReduce(f.data(), f.data(), f.size(), ncclFloat, ncclSum, comm, nullptr));
  for (size_t i = 0; i < f.size(); ++i)
    RANK_CHECK(f[i] == 10.0f * (i % 1000), "all-reduce [%zu] = %g", i, f[i]);

  const size_t per = 50000;
  std::vector<int32_t> out(per * n), in(per * n, -1);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < per; ++i) out[p * per + i] = rank * 1000000 + p * 1000 + static_cast<int32_t>(i % 1000);
  RANK_NCCL(ncclAlltoAll(out.data(), in.data(), per, ncclInt32, comm, nullptr));
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < per; ++i)
      RANK_CHECK(in[p * per + i] == p * 1000000 + rank * 1000 + static_cast<int32_t>(i % 1000),
                 "all-to-all from rank %d [%zu] = %d", p, i, in[p * per + i]);

  std::vector<int64_t> g(30000 * n, -1), mine(30000);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = rank * 100000 + static_cast<int64_t>(i);
  RANK_NCCL(ncclAllGather(mine.data(), g.data(), mine.size(), ncclInt64, comm, nullptr));
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < mine.size(); ++i)
      RANK_CHECK(g[p * mine.size() + i] == p * 100000 + static_cast<int64_t>(i), "all-gather [%d][%zu]", p, i);

  std::vector<uint8_t> s(300000), r(300000, 0);
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(rank * 31 + i);
  int to = (rank + 2) % n, from = (rank + n - 2) % n;
  RANK_NCCL(ncclGroupStart());
  RANK_NCCL(ncclSend(s.data(), s.size(), ncclUint8, to, comm, nullptr));
  RANK_NCCL(ncclRecv(r.data(), r.size(), ncclUint8, from, comm, nullptr));
  RANK_NCCL(ncclGroupEnd());
  for (size_t i = 0; i < r.size(); ++i)
    RANK_CHECK(r[i] == static_cast<uint8_t>(from * 31 + i), "recv from rank %d [%zu] = %d", from, i, r[i]);
  return "";
}

// Listeners of this process (the job's root, and those of earlier tests), which the ranks
// inherit through fork(): not theirs to defend.
std::set<int> parentPorts() {
  std::set<int> out;
  for (const Endpoint& ep : listenersOf(getpid())) out.insert(ep.port);
  return out;
}

std::string rankBody(const ncclUniqueId& id, int rank, Board* b, int lateRank, int lateMs) {
  RankSlot& me = b->ranks[rank];
  loom::logReset();  // the log settings of this test, not those the parent started with
  if (rank == lateRank) sleepMs(lateMs);  // the others wait in the rendezvous, listening
  me.stage = kStarted;
  int64_t t0 = monoNs();
  ncclComm_t comm = nullptr;
  RANK_NCCL(ncclCommInitRank(&comm, kRanks, id, rank));
  b->initMs[rank] = static_cast<int64_t>(msBetween(t0, monoNs()));
  me.stage = kInitDone;
  RANK_CHECK(waitFor([&] { return b->go.load() != 0; }, 60000), "the test never said go");
  int64_t t1 = monoNs();
  std::string e = workload(comm, rank);
  b->workMs[rank] = static_cast<int64_t>(msBetween(t1, monoNs()));
  me.stage = kFinished;
  // Stay up until the test has checked which strangers were cut off: once a process exits,
  // the kernel resets whatever waits on its listeners anyway.
  waitFor([&] { return b->release.load() != 0; }, 60000);
  RANK_NCCL(ncclCommDestroy(comm));
  return e;
}

constexpr int kHelloTimeoutSec = 1;

// Lines of a rank's log that report a stranger turned away.
int droppedLines(const std::string& path, std::string* sample) {
  std::ifstream in(path);
  std::string line;
  int n = 0;
  while (std::getline(in, line))
    if (line.find("NCCL WARN") != std::string::npos && line.find("dropped") != std::string::npos) {
      if (sample->empty()) *sample = line;
      ++n;
    }
  return n;
}

class HostileTest : public testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    if (GetParam() == Transport::kSocket) shmOff_.emplace("NCCL_SHM_DISABLE", "1");
    logDir_ = testing::TempDir() + "loom_hostile_" + std::to_string(getpid()) + "_" +
              transportName(GetParam());
    mkdir(logDir_.c_str(), 0700);
    logFile_.emplace("NCCL_DEBUG_FILE", (logDir_ + "/%p.log").c_str());
  }
  void TearDown() override {
    for (const auto& f : dirEntries(logDir_)) unlink((logDir_ + "/" + f).c_str());
    rmdir(logDir_.c_str());
  }
  std::optional<EnvGuard> shmOff_;
  std::string logDir_;
  std::optional<EnvGuard> logFile_;
  EnvGuard stall_{"LOOM_TIMEOUT", "60"};
  EnvGuard hello_{"LOOM_HELLO_TIMEOUT", std::to_string(kHelloTimeoutSec).c_str()};
  EnvGuard debug_{"NCCL_DEBUG", "WARN"};
  // The RAS socket speaks NCCL's unauthenticated text protocol to anyone on the host by
  // design (RasQuery sends it garbage): strangers here are for Loom's own listeners.
  EnvGuard ras_{"NCCL_RAS_ENABLE", "0"};
};

TEST_P(HostileTest, StrangersOnEveryListenerDuringInitAndCollectives) {
  SharedBoard<Board> b;
  LateId id;  // made after the forks
  const std::set<int> inherited = parentPorts();
  const int late = kRanks - 1;
  std::vector<Child> kids(kRanks);
  for (int r = 0; r < kRanks; ++r) kids[r] = forkChild([&, r] { return rankBody(id, r, &*b, late, 1500); });
  ASSERT_EQ(id.make(), ncclSuccess);
  loom::JobId job = loom::JobId::decode(id.get().internal);

  std::vector<HostileConn> conns;
  std::map<std::pair<int, int>, int> seen;  // (rank, port) -> phase it was first attacked in
  auto attackAll = [&](int phase, bool onlyNew) {
    for (int r = 0; r < kRanks; ++r) {
      if (phase == 1 && r == late) continue;
      for (const Endpoint& ep : listenersOf(kids[r].pid)) {
        if (inherited.count(ep.port)) continue;
        if (onlyNew && seen.count({r, ep.port})) continue;
        seen.emplace(std::make_pair(r, ep.port), phase);
        for (Attack a : kAllAttacks) {
          HostileConn c = attack(job, ep, r, kRanks, a, phase);
          if (c.fd >= 0 || a == Attack::kConnectClose) conns.push_back(c);
        }
      }
    }
  };
  // Phase 1: the early ranks sit in the rendezvous with only their bootstrap listener
  // open (the transport listener comes after it), well before the late rank arrives.
  int64_t forked = monoNs();
  while (msBetween(forked, monoNs()) < 1000 && b->ranks[late].stage.load() < kStarted) {
    attackAll(1, true);
    sleepMs(5);
  }
  // Phase 2: every listener of every rank, before collectives that connect anew.
  bool inited = waitFor([&] {
    for (int r = 0; r < kRanks; ++r)
      if (b->ranks[r].stage < kInitDone) return false;
    return true;
  }, 60000);
  if (inited) attackAll(2, false);
  b->go = 1;
  // Phase 3: more while the collectives run.
  for (int round = 0; round < 3 && inited; ++round) {
    sleepMs(50);
    attackAll(3, false);
  }
  int64_t lastAttack = monoNs();
  bool finished = waitFor([&] {
    for (int r = 0; r < kRanks; ++r)
      if (b->ranks[r].stage < kFinished) return false;
    return true;
  }, 90000);
  // The ranks now idle (alive, listening, touching neither listener): whatever is still
  // connected must be cut off by their acceptors within the hello time-out.
  std::string lingering;
  waitFor([&] {
    lingering.clear();
    for (auto& c : conns)
      if (!closedByPeer(c.fd))
        lingering += std::string(attackName(c.kind)) + " (phase " + std::to_string(c.phase) +
                     ") to rank " + std::to_string(c.rank) + " port " + std::to_string(c.port) + "; ";
    return lingering.empty();
  }, (kHelloTimeoutSec + 5) * 1000, 20);
  double allCutMs = msBetween(lastAttack, monoNs());
  EXPECT_EQ(lingering, "") << "strangers still connected to live ranks " << allCutMs
                           << " ms after the last one arrived";
  int made[4] = {}, perRank[kRanks] = {};
  for (auto& c : conns) {
    made[c.phase]++;
    if (c.kind != Attack::kConnectClose) perRank[c.rank]++;
  }
  b->release = 1;
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(waitChild(kids[r], 120), "") << "rank " << r;
  for (auto& c : conns)
    if (c.fd >= 0) close(c.fd);
  EXPECT_TRUE(inited && finished);
  EXPECT_GT(made[1], 0) << "no stranger reached a rank during the rendezvous (test timing?)";
  EXPECT_GT(made[2], 0);
  // Each stranger that got as far as sending (or withholding) a hello is logged once.
  std::string sample;
  for (int r = 0; r < kRanks; ++r) {
    std::string log = logDir_ + "/" + std::to_string(kids[r].pid) + ".log";
    EXPECT_EQ(droppedLines(log, &sample), perRank[r]) << "rank " << r << "'s log " << log;
  }
  int64_t initWorst = 0, workWorst = 0;
  for (int r = 0; r < kRanks; ++r) {
    initWorst = std::max<int64_t>(initWorst, b->initMs[r]);
    workWorst = std::max<int64_t>(workWorst, b->workMs[r]);
  }
  printf("hostile (%s): %zu listeners, strangers per phase %d/%d/%d, all cut off %.0f ms after "
         "the last arrived; slowest init %lld ms (1500 ms is the late rank), slowest "
         "collectives %lld ms; e.g. %s\n",
         transportName(GetParam()), seen.size(), made[1], made[2], made[3], allCutMs,
         static_cast<long long>(initWorst), static_cast<long long>(workWorst), sample.c_str());
  EXPECT_LT(initWorst, 30000);
  EXPECT_LT(workWorst, 30000);
}

// Idle strangers cost the job nothing but a descriptor: four of them queued on rank 0's
// bootstrap listener during the rendezvous and on every transport listener before new
// connections are made must not stall init or the collectives by seconds each.
TEST(FaultHostile, IdleStrangersDoNotStallTheJob) {
  EnvGuard shmOff("NCCL_SHM_DISABLE", "1");
  EnvGuard stall("LOOM_TIMEOUT", "60");
  SharedBoard<Board> b;
  LateId id;  // made after the forks
  const std::set<int> inherited = parentPorts();
  const int late = 1, lateMs = 1000, idlePerListener = 4;
  std::vector<Child> kids(kRanks);
  for (int r = 0; r < kRanks; ++r) kids[r] = forkChild([&, r] { return rankBody(id, r, &*b, late, lateMs); });
  ASSERT_EQ(id.make(), ncclSuccess);
  loom::JobId job = loom::JobId::decode(id.get().internal);
  std::vector<HostileConn> conns;
  std::set<int> portsBefore;
  waitFor([&] { return !listenersOf(kids[0].pid).empty() || b->ranks[late].stage.load() != 0; }, 5000, 1);
  for (const Endpoint& ep : listenersOf(kids[0].pid)) {
    if (inherited.count(ep.port)) continue;
    portsBefore.insert(ep.port);
    for (int i = 0; i < idlePerListener; ++i) conns.push_back(attack(job, ep, 0, kRanks, Attack::kIdle, 1));
  }
  bool inited = waitFor([&] {
    for (int r = 0; r < kRanks; ++r)
      if (b->ranks[r].stage < kInitDone) return false;
    return true;
  }, 60000);
  // The transport listeners (made after the rendezvous); the bootstrap ones are left alone.
  for (int r = 0; r < kRanks && inited; ++r)
    for (const Endpoint& ep : listenersOf(kids[r].pid)) {
      if ((r == 0 && portsBefore.count(ep.port)) || inherited.count(ep.port)) continue;
      for (int i = 0; i < idlePerListener; ++i) conns.push_back(attack(job, ep, r, kRanks, Attack::kIdle, 2));
    }
  b->go = 1;
  b->release = 1;
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(waitChild(kids[r], 120), "") << "rank " << r;
  for (auto& c : conns)
    if (c.fd >= 0) close(c.fd);
  ASSERT_TRUE(inited);
  EXPECT_FALSE(portsBefore.empty()) << "rank 0 was not listening during the rendezvous";
  int64_t init0 = b->initMs[0], workWorst = 0;
  for (int r = 0; r < kRanks; ++r) workWorst = std::max<int64_t>(workWorst, b->workMs[r]);
  printf("idle strangers: %zu; rank 0 init %lld ms (%d ms waiting for the late rank), "
         "slowest collectives %lld ms\n",
         conns.size(), static_cast<long long>(init0), lateMs, static_cast<long long>(workWorst));
  EXPECT_LT(init0, lateMs + 4000) << "idle connections on the bootstrap listener stalled init";
  EXPECT_LT(workWorst, 4000) << "idle connections on the transport listeners stalled the collectives";
}

INSTANTIATE_TEST_SUITE_P(Fault, HostileTest, testing::Values(Transport::kShm, Transport::kSocket),
                         [](const auto& info) { return std::string(transportName(info.param)); });

}  // namespace
}  // namespace loomtest
