// Shrink and continue (issue 6, items 1 and 3): four ranks (processes) reduce in a loop,
// rank 2 is SIGKILLed mid-run, every survivor's call fails promptly with ncclRemoteError
// naming a peer and its address, ncclCommGetAsyncError reports it, and the survivors
// ncclCommShrink the dead rank away and keep reducing correctly on three ranks.
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <string>
#include <vector>

#include "core/core_util.h"
#include "fault/fault_util.h"

namespace loomtest {
namespace {

using namespace fault;

constexpr int kRanks = 4;
constexpr int kVictim = 2;
constexpr int kItersAfterShrink = 8;

struct Board {
  RankSlot ranks[kRanks];
  std::atomic<int64_t> killNs{0};
};

// Each iteration's input differs, so a stale buffer cannot pass for a result.
std::string reduceOnce(ncclComm_t comm, int rank, int nranks, int it, std::vector<float>& buf,
                       ncclResult_t* rc) {
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>((rank + 1) * (it % 7 + 1) + i % 5);
  *rc = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
  if (*rc != ncclSuccess) return "";
  float ranksSum = static_cast<float>(nranks * (nranks + 1) / 2);
  for (size_t i = 0; i < buf.size(); ++i) {
    float want = ranksSum * (it % 7 + 1) + nranks * static_cast<float>(i % 5);
    RANK_CHECK(buf[i] == want, "iteration %d: [%zu] = %g, expected %g", it, i, buf[i], want);
  }
  return "";
}

std::string survivor(const ncclUniqueId& id, int rank, Board* b) {
  ncclComm_t comm = nullptr;
  RANK_NCCL(ncclCommInitRank(&comm, kRanks, id, rank));
  RankSlot& me = b->ranks[rank];
  std::vector<float> buf(1 << 18);
  ncclResult_t rc = ncclSuccess;
  int it = 0;
  int64_t start = monoNs();
  for (; msBetween(start, monoNs()) < 60000; ++it) {
    RANK_TRY(reduceOnce(comm, rank, kRanks, it, buf, &rc));
    if (rc != ncclSuccess) break;
    me.iterations = it + 1;
  }
  RANK_CHECK(rc != ncclSuccess, "never noticed the death of rank %d (%d iterations)", kVictim, it);
  std::string msg = ncclGetLastError(comm);
  postError(me, rc, msg.c_str());
  // What the survivor was told. A wrong answer here is reported at the end: the rank still
  // takes part in the shrink, so its peers are not left waiting for it.
  auto checkFailure = [&]() -> std::string {
    RANK_CHECK(b->killNs.load() != 0 && me.errorNs >= b->killNs,
               "the all-reduce failed before rank %d was killed: %s", kVictim, msg.c_str());
    RANK_CHECK(rc == ncclRemoteError, "the failure is %s, not ncclRemoteError: %s",
               ncclGetErrorString(rc), msg.c_str());
    RANK_CHECK(namesPeerAndAddress(msg, rank), "the message names no peer rank and address: %s",
               msg.c_str());
    ncclResult_t async = ncclSuccess;
    RANK_NCCL(ncclCommGetAsyncError(comm, &async));
    RANK_CHECK(async == rc, "ncclCommGetAsyncError reports %s after the call failed with %s",
               ncclGetErrorString(async), ncclGetErrorString(rc));
    // Later calls on the failed communicator fail at once rather than hang.
    float one = 1, out = 0;
    int64_t t0 = monoNs();
    RANK_CHECK(ncclAllReduce(&one, &out, 1, ncclFloat, ncclSum, comm, nullptr) != ncclSuccess,
               "an all-reduce on the failed communicator succeeded");
    RANK_CHECK(msBetween(t0, monoNs()) < 1000, "a call on the failed communicator took %.0f ms",
               msBetween(t0, monoNs()));
    return "";
  };
  std::string problems = checkFailure();

  int exclude[] = {kVictim};
  ncclComm_t small = nullptr;
  RANK_NCCL(ncclCommShrink(comm, exclude, 1, &small, nullptr, NCCL_SHRINK_DEFAULT));
  int n = 0, newRank = -1;
  RANK_NCCL(ncclCommCount(small, &n));
  RANK_NCCL(ncclCommUserRank(small, &newRank));
  int want = rank < kVictim ? rank : rank - 1;
  RANK_CHECK(n == kRanks - 1 && newRank == want, "shrunk communicator: rank %d of %d, expected %d of %d",
             newRank, n, want, kRanks - 1);
  // Survivors may have stopped at different iterations (one finished the call the kill
  // interrupted, another did not): count afresh.
  for (int j = 0; j < kItersAfterShrink; ++j) {
    RANK_TRY(reduceOnce(small, newRank, n, j, buf, &rc));
    RANK_CHECK(rc == ncclSuccess, "all-reduce %d after the shrink: %s", j, ncclGetLastError(small));
  }
  RANK_NCCL(ncclCommDestroy(small));
  RANK_NCCL(ncclCommDestroy(comm));
  return problems;
}

std::string victim(const ncclUniqueId& id, Board* b) {
  ncclComm_t comm = nullptr;
  RANK_NCCL(ncclCommInitRank(&comm, kRanks, id, kVictim));
  std::vector<float> buf(1 << 18);
  ncclResult_t rc;
  for (int it = 0;; ++it) {  // until killed
    RANK_TRY(reduceOnce(comm, kVictim, kRanks, it, buf, &rc));
    if (rc != ncclSuccess) return std::string("victim's all-reduce failed: ") + ncclGetLastError(comm);
    b->ranks[kVictim].iterations = it + 1;
  }
}

class ShrinkTest : public testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    if (GetParam() == Transport::kSocket) shmOff_.emplace("NCCL_SHM_DISABLE", "1");
  }
  std::optional<EnvGuard> shmOff_;
};

TEST_P(ShrinkTest, KillRankThenShrinkAndKeepReducing) {
  SharedBoard<Board> b;
  LateId id;  // made after the forks
  std::vector<Child> kids(kRanks);
  for (int r = 0; r < kRanks; ++r)
    kids[r] = forkChild([&, r] { return r == kVictim ? victim(id, &*b) : survivor(id, r, &*b); });
  ASSERT_EQ(id.make(), ncclSuccess);
  // Kill once every rank has done a few iterations: the survivors are mid-loop.
  bool running = waitFor([&] {
    for (int r = 0; r < kRanks; ++r)
      if (b->ranks[r].iterations < 5) return false;
    return true;
  }, 30000);
  b->killNs = monoNs();
  kill(kids[kVictim].pid, SIGKILL);
  reapKilled(kids[kVictim]);
  EXPECT_TRUE(running) << "the ranks never got going";
  double worstMs = 0;
  for (int r = 0; r < kRanks; ++r) {
    if (r == kVictim) continue;
    EXPECT_EQ(waitChild(kids[r], 60), "") << "rank " << r;
    if (b->ranks[r].errorNs) worstMs = std::max(worstMs, msBetween(b->killNs, b->ranks[r].errorNs));
  }
  EXPECT_LT(worstMs, 10000) << "detection took too long";
  printf("shrink (%s): worst detection %.1f ms; e.g. rank 0 saw: %s\n", transportName(GetParam()),
         worstMs, b->ranks[0].message);
}

INSTANTIATE_TEST_SUITE_P(Fault, ShrinkTest, testing::Values(Transport::kShm, Transport::kSocket),
                         [](const auto& info) { return std::string(transportName(info.param)); });

}  // namespace
}  // namespace loomtest
