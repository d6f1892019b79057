// ncclCommRevoke and NCCL_SHRINK_ABORT from another thread (issue 6, item 3): a call stuck
// on a peer that never joins the collective returns within 1 s, and the revoked
// communicator can still be split or shrunk among its live ranks, whose new communicator
// then reduces correctly. Three ranks as processes; ranks 0 and 1 get stuck because
// rank 2 never enters their all-reduce.
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "core/core_util.h"
#include "fault/fault_util.h"

namespace loomtest {
namespace {

using namespace fault;

constexpr int kRanks = 3;

struct Board {
  RankSlot ranks[kRanks];
  std::atomic<int> unblocked{0};  // ranks 0 and 1 whose stuck call has returned
  std::atomic<int> phase{0};
};

enum class After { kSplit, kShrinkWithoutDeadRank };
// How the stuck call is stopped: ncclCommRevoke then a later split/shrink, or
// ncclCommShrink(NCCL_SHRINK_ABORT) itself from the other thread.
enum class Stop { kRevoke, kShrinkAbort };

// Checks an all-reduce and a broadcast on `comm` (new ranks `rank` of `nranks`).
std::string checkWorks(ncclComm_t comm, int rank, int nranks, int salt) {
  int count = 0, me = -1;
  RANK_NCCL(ncclCommCount(comm, &count));
  RANK_NCCL(ncclCommUserRank(comm, &me));
  RANK_CHECK(count == nranks && me == rank, "new communicator: rank %d of %d, expected %d of %d",
             me, count, rank, nranks);
  std::vector<int32_t> v(300001);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (rank + 1) * static_cast<int32_t>(i % 1000 + salt);
  RANK_NCCL(ncclAllReduce(v.data(), v.data(), v.size(), ncclInt32, ncclSum, comm, nullptr));
  int32_t s = nranks * (nranks + 1) / 2;
  for (size_t i = 0; i < v.size(); ++i)
    RANK_CHECK(v[i] == s * static_cast<int32_t>(i % 1000 + salt), "[%zu] = %d", i, v[i]);
  std::vector<int64_t> w(70000, rank == nranks - 1 ? 7 : 0);
  RANK_NCCL(ncclBroadcast(w.data(), w.data(), w.size(), ncclInt64, nranks - 1, comm, nullptr));
  for (size_t i = 0; i < w.size(); ++i) RANK_CHECK(w[i] == 7, "broadcast [%zu] = %lld", i, (long long)w[i]);
  return "";
}

std::string stuckRank(const ncclUniqueId& id, int rank, Board* b, Stop stop, After after) {
  ncclComm_t comm = nullptr;
  RANK_NCCL(ncclCommInitRank(&comm, kRanks, id, rank));
  std::vector<float> buf(1 << 20, 1.0f);
  std::atomic<int64_t> stopAt{0};
  std::atomic<int> stopRc{-1};
  ncclComm_t shrunk = nullptr;
  int exclude[] = {2};
  std::thread stopper([&] {
    sleepMs(200);
    stopAt = monoNs();
    if (stop == Stop::kRevoke) {
      stopRc = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
    } else {
      stopRc = ncclCommShrink(comm, exclude, 1, &shrunk, nullptr, NCCL_SHRINK_ABORT);
    }
  });
  ncclResult_t rc = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
  int64_t returned = monoNs();
  std::string msg = ncclGetLastError(nullptr);
  b->unblocked.fetch_add(1);
  stopper.join();
  RANK_CHECK(rc != ncclSuccess, "the all-reduce without rank 2 succeeded");
  RANK_CHECK(returned >= stopAt.load(), "the all-reduce failed before it was stopped: %s", msg.c_str());
  RANK_CHECK(msBetween(stopAt, returned) < 1000, "the stuck call returned %.0f ms after the %s",
             msBetween(stopAt, returned), stop == Stop::kRevoke ? "revoke" : "shrink");
  if (stop == Stop::kShrinkAbort) {
    RANK_CHECK(stopRc == ncclSuccess, "ncclCommShrink(NCCL_SHRINK_ABORT) returned %s: %s",
               ncclGetErrorString(static_cast<ncclResult_t>(stopRc.load())), ncclGetLastError(comm));
    RANK_CHECK(shrunk != nullptr, "ncclCommShrink gave no communicator");
    RANK_TRY(checkWorks(shrunk, rank, 2, 3));
    RANK_NCCL(ncclCommDestroy(shrunk));
    RANK_NCCL(ncclCommDestroy(comm));
    return "";
  }
  RANK_CHECK(stopRc == ncclSuccess, "ncclCommRevoke returned %d", stopRc.load());
  // Wait until rank 2 has revoked too (and, for a shrink, has been killed).
  RANK_CHECK(waitFor([&] { return b->phase.load() >= 1; }, 20000), "the test never moved on");
  ncclComm_t next = nullptr;
  if (after == After::kSplit) {
    RANK_NCCL(ncclCommSplit(comm, 0, kRanks - rank, &next, nullptr));  // reversed order
    RANK_CHECK(next != nullptr, "split gave no communicator");
    RANK_TRY(checkWorks(next, kRanks - 1 - rank, kRanks, 5));
  } else {
    RANK_NCCL(ncclCommShrink(comm, exclude, 1, &next, nullptr, NCCL_SHRINK_DEFAULT));
    RANK_CHECK(next != nullptr, "shrink gave no communicator");
    RANK_TRY(checkWorks(next, rank, 2, 9));
  }
  RANK_NCCL(ncclCommDestroy(next));
  RANK_NCCL(ncclCommDestroy(comm));
  return "";
}

// Rank 2 joins and never takes part in the all-reduce. It revokes its own communicator
// once the others are unblocked and joins the split; for a shrink it is killed instead.
std::string absentRank(const ncclUniqueId& id, Board* b, Stop stop, After after) {
  ncclComm_t comm = nullptr;
  RANK_NCCL(ncclCommInitRank(&comm, kRanks, id, 2));
  b->ranks[2].stage = 1;
  RANK_CHECK(waitFor([&] { return b->unblocked.load() == 2; }, 30000), "ranks 0/1 never returned");
  if (stop == Stop::kShrinkAbort || after == After::kShrinkWithoutDeadRank) {
    // Excluded: stays alive until the survivors are done, then leaves without a word.
    RANK_CHECK(waitFor([&] { return b->phase.load() >= 2; }, 60000), "survivors never finished");
    ncclCommAbort(comm);
    return "";
  }
  RANK_NCCL(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  b->phase = 1;
  ncclComm_t next = nullptr;
  RANK_NCCL(ncclCommSplit(comm, 0, 0, &next, nullptr));
  RANK_TRY(checkWorks(next, 0, kRanks, 5));  // key 0: first
  RANK_NCCL(ncclCommDestroy(next));
  RANK_NCCL(ncclCommDestroy(comm));
  return "";
}

void runCase(Stop stop, After after) {
  SharedBoard<Board> b;
  LateId id;  // made after the forks
  std::vector<Child> kids;
  for (int r = 0; r < 2; ++r) kids.push_back(forkChild([&, r] { return stuckRank(id, r, &*b, stop, after); }));
  Child absent = forkChild([&] { return absentRank(id, &*b, stop, after); });
  ASSERT_EQ(id.make(), ncclSuccess);
  if (stop == Stop::kRevoke && after == After::kShrinkWithoutDeadRank) {
    // Rank 2 dies once the others are unblocked; they shrink it away.
    if (waitFor([&] { return b->unblocked.load() == 2; }, 30000)) {
      kill(absent.pid, SIGKILL);
      reapKilled(absent);
    }
    b->phase = 1;
  }
  std::string e[2];
  for (int r = 0; r < 2; ++r) e[r] = waitChild(kids[r], 60);
  b->phase = 2;
  if (absent.fd >= 0) {
    EXPECT_EQ(waitChild(absent, 30), "") << "rank 2";
  }
  EXPECT_EQ(e[0], "") << "rank 0";
  EXPECT_EQ(e[1], "") << "rank 1";
}

TEST(FaultRevoke, UnblocksStuckCallThenSplitWorks) { runCase(Stop::kRevoke, After::kSplit); }

TEST(FaultRevoke, UnblocksStuckCallThenShrinkWithoutKilledRank) {
  runCase(Stop::kRevoke, After::kShrinkWithoutDeadRank);
}

TEST(FaultRevoke, ShrinkAbortFromAnotherThreadStopsStuckCall) {
  runCase(Stop::kShrinkAbort, After::kShrinkWithoutDeadRank);
}

}  // namespace
}  // namespace loomtest
