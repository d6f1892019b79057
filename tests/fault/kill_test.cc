// SIGKILL during ncclCommInitRank and inside a group (issue 6, item 1): every survivor's
// call returns within 10 s of the kill, with an error if it needed the dead rank, and
// never crashes. Four ranks as processes.
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <random>
#include <string>
#include <vector>

#include "bootstrap/unique_id.h"
#include "core/core_util.h"
#include "fault/fault_util.h"

namespace loomtest {
namespace {

using namespace fault;

constexpr int kRanks = 4;
constexpr double kBoundSec = 10;  // issue 6: survivors fail within 10 s by default

struct Board {
  RankSlot ranks[kRanks];
  std::atomic<int64_t> killNs{0};
};

enum Stage { kStarted = 1, kInitDone = 2, kFinished = 3 };

// A rank that initializes and then reduces a few times. Returns "" whether it succeeded
// or failed cleanly; the failure (if any) is posted on the board.
std::string joiningRank(const ncclUniqueId& id, int rank, Board* b, int delayMs,
                        bool afterKill = false) {
  RankSlot& me = b->ranks[rank];
  if (afterKill) waitFor([&] { return b->killNs.load() != 0; }, 30000);
  if (delayMs) sleepMs(delayMs);
  me.stage = kStarted;
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRank(&comm, kRanks, id, rank);
  if (rc != ncclSuccess) {
    RANK_CHECK(comm == nullptr, "failed init left a handle behind");
    postError(me, rc, ncclGetLastError(nullptr));
    return "";
  }
  me.stage = kInitDone;
  std::vector<double> v(50000);
  for (int it = 0; it < 5 && rc == ncclSuccess; ++it) {
    for (auto& x : v) x = rank + it;
    rc = ncclAllReduce(v.data(), v.data(), v.size(), ncclDouble, ncclSum, comm, nullptr);
    if (rc == ncclSuccess)
      for (size_t i = 0; i < v.size(); ++i)
        RANK_CHECK(v[i] == 6 + 4 * it, "[%zu] = %g", i, v[i]);
  }
  if (rc != ncclSuccess) postError(me, rc, ncclGetLastError(comm));
  me.stage = kFinished;
  ncclCommDestroy(comm);
  return "";
}

struct Outcome {
  int hangs = 0, crashes = 0, failedInInit = 0, failedLater = 0, finished = 0, spurious = 0;
  double worstMs = 0;
  std::string details;
};

// Waits for the survivors of one trial and tallies what they did.
void collect(std::vector<Child>& kids, int victim, Board* b, double boundSec, Outcome* o) {
  for (int r = 0; r < kRanks; ++r) {
    if (r == victim) continue;
    bool hung = false;
    std::string e = waitChild(kids[r], boundSec + 2, &hung);
    RankSlot& s = b->ranks[r];
    if (hung) {
      ++o->hangs;
      o->details += "rank " + std::to_string(r) + " hung at stage " + std::to_string(s.stage) + "; ";
      continue;
    }
    if (!e.empty()) {
      ++o->crashes;
      o->details += "rank " + std::to_string(r) + ": " + e + "; ";
      continue;
    }
    if (s.errorNs == 0) {
      ++o->finished;
      continue;
    }
    (s.stage >= kInitDone ? o->failedLater : o->failedInInit)++;
    if (s.errorNs < b->killNs) {
      ++o->spurious;
      o->details += "rank " + std::to_string(r) + " failed before the kill: " + s.message + "; ";
      continue;
    }
    double ms = msBetween(b->killNs, s.errorNs);
    o->worstMs = std::max(o->worstMs, ms);
    if (ms > boundSec * 1000)
      o->details += "rank " + std::to_string(r) + " took " + std::to_string(ms) + " ms: " + s.message + "; ";
  }
}

// The victim reached the root and waits there (the last rank starts late): the root fails
// the rendezvous and every rank waiting on it, and the late rank as well.
TEST(FaultKill, VictimDiesWaitingAtTheRoot) {
  SharedBoard<Board> b;
  LateId id;  // made after the forks
  const int victim = 1, late = 3;
  std::vector<Child> kids(kRanks);
  for (int r = 0; r < kRanks; ++r)
    kids[r] = forkChild([&, r] { return r == late ? joiningRank(id, r, &*b, 200, true) : joiningRank(id, r, &*b, 0); });
  ASSERT_EQ(id.make(), ncclSuccess);
  const int rootPort = loom::JobId::decode(id.get().internal).root.port();
  EXPECT_TRUE(waitFor([&] { return connectedToPort(kids[victim].pid, rootPort); }, 10000, 1))
      << "the victim never reached the root";
  sleepMs(50);
  b->killNs = monoNs();
  kill(kids[victim].pid, SIGKILL);
  reapKilled(kids[victim]);
  Outcome o;
  collect(kids, victim, &*b, kBoundSec, &o);
  EXPECT_EQ(o.hangs + o.crashes + o.spurious, 0) << o.details;
  EXPECT_EQ(o.failedInInit, kRanks - 1) << o.details;
  EXPECT_LT(o.worstMs, kBoundSec * 1000) << o.details;
  // The rank that came after the failure is included in worstMs (measured from the kill).
  printf("victim at the root: worst %.1f ms (rank 3 arrived 200 ms after the kill): %s\n", o.worstMs,
         b->ranks[0].message);
}

// A rank that dies before it ever reaches the root cannot be told from a slow one: the
// others give up after LOOM_BOOTSTRAP_TIMEOUT, with a message that says so.
TEST(FaultKill, VictimDiesBeforeJoiningIsATimeout) {
  EnvGuard timeout("LOOM_BOOTSTRAP_TIMEOUT", "3");
  SharedBoard<Board> b;
  LateId id;  // made after the forks
  const int victim = 2;
  std::vector<Child> kids(kRanks);
  for (int r = 0; r < kRanks; ++r)
    kids[r] = forkChild([&, r] { return joiningRank(id, r, &*b, r == victim ? 60000 : 0); });
  ASSERT_EQ(id.make(), ncclSuccess);
  sleepMs(200);
  b->killNs = monoNs();
  kill(kids[victim].pid, SIGKILL);
  reapKilled(kids[victim]);
  Outcome o;
  collect(kids, victim, &*b, kBoundSec, &o);
  EXPECT_EQ(o.hangs + o.crashes + o.spurious, 0) << o.details;
  EXPECT_EQ(o.failedInInit, kRanks - 1) << o.details;
  EXPECT_LT(o.worstMs, 3000 + 2000) << o.details;
  // The first to time out names the knob; the others may instead hear that it left.
  std::string all;
  for (int r = 0; r < kRanks; ++r)
    if (r != victim) all += std::string(b->ranks[r].message) + "\n";
  EXPECT_NE(all.find("LOOM_BOOTSTRAP_TIMEOUT"), std::string::npos) << all;
}

// The victim dies at a random moment of its init after it has reached the root (the rest
// of init takes a few ms, so the kills land during the rendezvous, the peer exchange,
// connection setup and the first collectives): nobody hangs or crashes, and whoever
// fails does so within the bound.
TEST(FaultKill, VictimDiesDuringInit) {
  std::mt19937 rng(4242);
  Outcome o;
  const int trials = 32;
  int t = 0;
  // A trial that hangs costs the full bound: stop after two, the verdict is clear by then.
  for (; t < trials && o.hangs < 2; ++t) {
    SharedBoard<Board> b;
    LateId id;  // made after the forks
    int victim = static_cast<int>(rng() % kRanks);
    int delayUs = static_cast<int>(rng() % (t % 2 ? 8000 : 2500));
    std::vector<Child> kids(kRanks);
    for (int r = 0; r < kRanks; ++r) kids[r] = forkChild([&, r] { return joiningRank(id, r, &*b, 0); });
    ASSERT_EQ(id.make(), ncclSuccess);
    const int rootPort = loom::JobId::decode(id.get().internal).root.port();
    // Before it reaches the root a dead rank is indistinguishable from a slow one (see
    // VictimDiesBeforeJoiningIsATimeout).
    waitFor([&] { return connectedToPort(kids[victim].pid, rootPort) || b->ranks[victim].stage >= kInitDone; },
            5000, 0);
    usleep(delayUs);
    b->killNs = monoNs();
    kill(kids[victim].pid, SIGKILL);
    reapKilled(kids[victim]);
    collect(kids, victim, &*b, kBoundSec, &o);
  }
  printf("kill during init: %d trials, survivors failed in init %d, later %d, finished %d, "
         "hangs %d, crashes %d, worst detection %.1f ms\n",
         t, o.failedInInit, o.failedLater, o.finished, o.hangs, o.crashes, o.worstMs);
  EXPECT_EQ(o.hangs, 0) << o.details;
  EXPECT_EQ(o.crashes, 0) << o.details;
  EXPECT_EQ(o.spurious, 0) << o.details;
  EXPECT_LT(o.worstMs, kBoundSec * 1000) << o.details;
}

// What a survivor is told (issue 6, item 1): the operation, its sequence number, the peer
// rank, its host and its address.
TEST(FaultKill, ErrorNamesOperationSequencePeerHostAndAddress) {
  SharedBoard<Board> b;
  LateId id;  // made after the forks
  const int n = 3, victim = 1;
  std::vector<Child> kids(n);
  for (int r = 0; r < n; ++r)
    kids[r] = forkChild([&, r] {
      ncclComm_t comm = nullptr;
      RANK_NCCL(ncclCommInitRank(&comm, n, id, r));
      std::vector<float> v(1 << 16, 1.0f);
      ncclResult_t rc = ncclSuccess;
      for (int it = 0; rc == ncclSuccess && it < 100000; ++it) {
        rc = ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, comm, nullptr);
        b->ranks[r].iterations = it + 1;
      }
      postError(b->ranks[r], rc, ncclGetLastError(comm));
      ncclCommDestroy(comm);
      return std::string();
    });
  ASSERT_EQ(id.make(), ncclSuccess);
  waitFor([&] { return b->ranks[0].iterations >= 3 && b->ranks[2].iterations >= 3; }, 30000);
  b->killNs = monoNs();
  kill(kids[victim].pid, SIGKILL);
  reapKilled(kids[victim]);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  for (int r : {0, 2}) {
    EXPECT_EQ(waitChild(kids[r], kBoundSec + 2), "") << "rank " << r;
    std::string msg = b->ranks[r].message;
    EXPECT_EQ(b->ranks[r].errorCode.load(), ncclRemoteError) << msg;
    EXPECT_NE(msg.find("AllReduce"), std::string::npos) << "no operation: " << msg;
    EXPECT_TRUE(namesSequence(msg)) << "no sequence number: " << msg;
    EXPECT_TRUE(namesPeerAndAddress(msg, r)) << "no peer rank and address: " << msg;
    EXPECT_NE(msg.find(host), std::string::npos) << "no host name (" << host << "): " << msg;
  }
}

// Inside a group: every rank sends a block to every other rank and receives one from
// each (ncclGroupStart; sends/recvs; ncclGroupEnd) in a loop until the victim is killed.
std::string groupRank(const ncclUniqueId& id, int rank, Board* b, bool isVictim) {
  RankSlot& me = b->ranks[rank];
  ncclComm_t comm = nullptr;
  RANK_NCCL(ncclCommInitRank(&comm, kRanks, id, rank));
  const size_t n = 200000;
  std::vector<std::vector<int32_t>> out(kRanks, std::vector<int32_t>(n)), in(kRanks, std::vector<int32_t>(n));
  ncclResult_t rc = ncclSuccess;
  int64_t start = monoNs();
  for (int it = 0; msBetween(start, monoNs()) < 60000; ++it) {
    for (int p = 0; p < kRanks; ++p)
      for (size_t i = 0; i < n; i += 997) out[p][i] = rank * 1000 + p * 10 + it;
    RANK_NCCL(ncclGroupStart());
    for (int p = 0; p < kRanks; ++p) {
      if (p == rank) continue;
      ncclSend(out[p].data(), n, ncclInt32, p, comm, nullptr);
      ncclRecv(in[p].data(), n, ncclInt32, p, comm, nullptr);
    }
    rc = ncclGroupEnd();
    if (rc != ncclSuccess) break;
    for (int p = 0; p < kRanks; ++p)
      if (p != rank)
        for (size_t i = 0; i < n; i += 997)
          RANK_CHECK(in[p][i] == p * 1000 + rank * 10 + it, "from rank %d [%zu] = %d", p, i, in[p][i]);
    me.iterations = it + 1;
  }
  if (isVictim) return "the victim's group failed: " + std::string(ncclGetLastError(nullptr));
  RANK_CHECK(rc != ncclSuccess, "the group never failed after the kill");
  postError(me, rc, ncclGetLastError(nullptr));
  RANK_CHECK(rc == ncclRemoteError, "the group failed with %s: %s", ncclGetErrorString(rc), me.message);
  ncclCommDestroy(comm);
  return "";
}

class GroupKillTest : public testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    if (GetParam() == Transport::kSocket) shmOff_.emplace("NCCL_SHM_DISABLE", "1");
  }
  std::optional<EnvGuard> shmOff_;
};

TEST_P(GroupKillTest, VictimDiesInsideGroup) {
  SharedBoard<Board> b;
  LateId id;  // made after the forks
  const int victim = 1;
  std::vector<Child> kids(kRanks);
  for (int r = 0; r < kRanks; ++r) kids[r] = forkChild([&, r] { return groupRank(id, r, &*b, r == victim); });
  ASSERT_EQ(id.make(), ncclSuccess);
  bool running = waitFor([&] {
    for (int r = 0; r < kRanks; ++r)
      if (b->ranks[r].iterations < 3) return false;
    return true;
  }, 30000);
  EXPECT_TRUE(running) << "the ranks never got going";
  b->killNs = monoNs();
  kill(kids[victim].pid, SIGKILL);
  reapKilled(kids[victim]);
  double worst = 0;
  for (int r = 0; r < kRanks; ++r) {
    if (r == victim) continue;
    EXPECT_EQ(waitChild(kids[r], kBoundSec + 5), "") << "rank " << r;
    if (b->ranks[r].errorNs) worst = std::max(worst, msBetween(b->killNs, b->ranks[r].errorNs));
  }
  EXPECT_LT(worst, kBoundSec * 1000);
  printf("group (%s): worst detection %.1f ms\n", transportName(GetParam()), worst);
}

INSTANTIATE_TEST_SUITE_P(Fault, GroupKillTest, testing::Values(Transport::kShm, Transport::kSocket),
                         [](const auto& info) { return std::string(transportName(info.param)); });

}  // namespace
}  // namespace loomtest
