// A non-blocking communicator's ncclCommSplit and ncclCommShrink run as NCCL runs them, as
// a job of their own (api/mgmt_job.h), called alone or recorded in a group: the call (or
// the group's end) returns ncclInProgress at once and the new communicator is there once
// ncclCommGetAsyncError(parent) no longer says ncclInProgress. So one thread drives several
// non-blocking ranks through a split without a group, or in a group each (before, the
// first rank's call waited for the others' colors, which the same thread was to give).
// Calls on a parent meanwhile are refused; an abort ends the job; a failed job is the
// parent's asynchronous error. (ncclCommGrow's: grow_test.cc.)
#include <nccl.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/core_util.h"

namespace loomtest {
namespace {

bool contains(const char* text, const char* what) { return std::string(text).find(what) != std::string::npos; }

// Three ranks, one thread, no group: ranks 0 and 1 split into one communicator with keys
// reversing their order, rank 2 passes NCCL_SPLIT_NOCOLOR. Between the calls rank 0's
// split waits for the others' colors: its state says so, and its other calls are refused.
TEST(CoreJob, OneThreadSplitsItsNonBlockingRanksWithoutAGroup) {
  EnvGuard stall("LOOM_TIMEOUT", "30");  // a call that waits for the others fails, not hangs
  std::vector<ncclComm_t> parents = nonBlockingRanks(3);
  ASSERT_FALSE(HasFailure());
  ncclComm_t marker = reinterpret_cast<ncclComm_t>(uintptr_t{1});
  std::vector<ncclComm_t> children(3, marker);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(ncclCommSplit(parents[0], 0, 2, &children[0], nullptr), ncclInProgress)
      << ncclGetLastError(nullptr);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_EQ(children[0], nullptr) << "the child before the split is done";
  ncclResult_t state = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(parents[0], &state), ncclSuccess);
  EXPECT_EQ(state, ncclInProgress) << "rank 0's split cannot end before the others call";
  std::vector<int32_t> buf(16, 1);
  EXPECT_EQ(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclInt32, ncclSum, parents[0], nullptr),
            ncclInvalidUsage);
  EXPECT_TRUE(contains(ncclGetLastError(nullptr), "still running its non-blocking ncclCommSplit"))
      << ncclGetLastError(nullptr);
  ncclComm_t second = nullptr;
  EXPECT_EQ(ncclCommSplit(parents[0], 0, 0, &second, nullptr), ncclInvalidUsage);
  EXPECT_EQ(second, nullptr);
  ASSERT_EQ(ncclCommSplit(parents[1], 0, 1, &children[1], nullptr), ncclInProgress)
      << ncclGetLastError(nullptr);
  ASSERT_EQ(ncclCommSplit(parents[2], NCCL_SPLIT_NOCOLOR, 0, &children[2], nullptr), ncclInProgress)
      << ncclGetLastError(nullptr);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(settle(parents[r]), ncclSuccess) << r << ": " << ncclGetLastError(parents[r]);
  ASSERT_NE(children[0], nullptr);
  ASSERT_NE(children[1], nullptr);
  EXPECT_EQ(children[2], nullptr) << "no color: no communicator";
  const int wantRank[2] = {1, 0};  // keys 2 and 1
  for (int r = 0; r < 2; ++r) {
    int cr = -1, cn = -1;
    EXPECT_EQ(settle(children[r]), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(children[r], &cr), ncclSuccess);
    ASSERT_EQ(ncclCommCount(children[r], &cn), ncclSuccess);
    EXPECT_EQ(cr, wantRank[r]);
    EXPECT_EQ(cn, 2);
  }
  EXPECT_EQ(allReduceInGroup({children[0], children[1]}, {1, 0}, {3, 3}), "");
  EXPECT_EQ(allReduceInGroup(parents, {0, 1, 2}, {6, 6, 6}), "") << "the parents carry on";
  for (ncclComm_t c : {children[0], children[1]}) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  for (ncclComm_t c : parents) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Rank 1 left out (it never calls): the survivors' shrinks, one thread, no group.
TEST(CoreJob, OneThreadShrinksItsNonBlockingRanksWithoutAGroup) {
  EnvGuard stall("LOOM_TIMEOUT", "30");
  std::vector<ncclComm_t> parents = nonBlockingRanks(3);
  ASSERT_FALSE(HasFailure());
  int excluded[1] = {1};
  std::vector<ncclComm_t> children(3, nullptr);
  for (int r : {2, 0})
    ASSERT_EQ(ncclCommShrink(parents[r], excluded, 1, &children[r], nullptr, NCCL_SHRINK_DEFAULT),
              ncclInProgress) << ncclGetLastError(nullptr);
  for (int r : {0, 2}) EXPECT_EQ(settle(parents[r]), ncclSuccess) << ncclGetLastError(parents[r]);
  ASSERT_NE(children[0], nullptr);
  ASSERT_NE(children[2], nullptr);
  int n = -1, r2 = -1;
  ASSERT_EQ(ncclCommCount(children[2], &n), ncclSuccess);
  ASSERT_EQ(ncclCommUserRank(children[2], &r2), ncclSuccess);
  EXPECT_EQ(n, 2);
  EXPECT_EQ(r2, 1);
  EXPECT_EQ(allReduceInGroup({children[0], children[2]}, {0, 1}, {3, 3}), "");
  for (ncclComm_t c : {children[0], children[2]}) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  for (ncclComm_t c : parents) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// A split whose other rank never calls: the abort of its parent ends it at once; the other
// rank's own split then fails (its peer is gone) and that is its parent's asynchronous
// error, named and explained, with no new communicator.
TEST(CoreJob, AbortEndsAPendingSplitAndAFailedOneIsTheParentsError) {
  EnvGuard stall("LOOM_TIMEOUT", "30");
  std::vector<ncclComm_t> parents = nonBlockingRanks(2);
  ASSERT_FALSE(HasFailure());
  ncclComm_t child0 = nullptr;
  ASSERT_EQ(ncclCommSplit(parents[0], 0, 0, &child0, nullptr), ncclInProgress);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ncclResult_t state = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(parents[0], &state), ncclSuccess);
  EXPECT_EQ(state, ncclInProgress);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ncclCommAbort(parents[0]), ncclSuccess);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_EQ(child0, nullptr);
  ncclComm_t child1 = reinterpret_cast<ncclComm_t>(uintptr_t{1});
  t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(ncclCommSplit(parents[1], 0, 1, &child1, nullptr), ncclInProgress);
  state = settle(parents[1], 30);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0)
      << "a dead peer is found in about a second";
  EXPECT_NE(state, ncclSuccess);
  EXPECT_NE(state, ncclInProgress);
  EXPECT_EQ(child1, nullptr);
  EXPECT_TRUE(contains(ncclGetLastError(parents[1]), "ncclCommSplit")) << ncclGetLastError(parents[1]);
  std::vector<int32_t> buf(16, 1);
  EXPECT_EQ(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclInt32, ncclSum, parents[1], nullptr),
            state) << "the failed split's error stays the parent's";
  EXPECT_EQ(ncclCommDestroy(parents[1]), ncclSuccess);
}

// Recorded in groups: a non-blocking parent's splits run as its job, so one thread may
// split its ranks in two separate groups (each end returns ncclInProgress at once; with
// blocking parents the first end would wait for the second group's colors). The second
// group also records two splits of the same parent, run in order.
TEST(CoreJob, OneThreadSplitsItsNonBlockingRanksInSeparateGroups) {
  EnvGuard stall("LOOM_TIMEOUT", "30");
  std::vector<ncclComm_t> parents = nonBlockingRanks(2);
  ASSERT_FALSE(HasFailure());
  ncclComm_t marker = reinterpret_cast<ncclComm_t>(uintptr_t{1});
  ncclComm_t a[2] = {marker, marker}, b[2] = {marker, marker};
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclCommSplit(parents[r], 0, r, &a[r], nullptr), ncclSuccess);
    ASSERT_EQ(ncclCommSplit(parents[r], r, 0, &b[r], nullptr), ncclSuccess);  // one each
    EXPECT_EQ(ncclGroupEnd(), ncclInProgress) << ncclGetLastError(nullptr);
    if (r == 0) {  // its job waits for rank 1's colors (rank 1's may end at once)
      EXPECT_EQ(a[0], nullptr);
      EXPECT_EQ(b[0], nullptr);
    }
  }
  for (int r = 0; r < 2; ++r) EXPECT_EQ(settle(parents[r]), ncclSuccess) << ncclGetLastError(parents[r]);
  for (int r = 0; r < 2; ++r) {
    ASSERT_NE(a[r], nullptr);
    ASSERT_NE(b[r], nullptr);
    int n = -1;
    ASSERT_EQ(ncclCommCount(b[r], &n), ncclSuccess);
    EXPECT_EQ(n, 1);
  }
  EXPECT_EQ(allReduceInGroup({a[0], a[1]}, {0, 1}, {3, 3}), "");
  EXPECT_EQ(allReduceInGroup({b[0]}, {4}, {5}), "");
  for (ncclComm_t c : {a[0], a[1], b[0], b[1]}) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  for (ncclComm_t c : parents) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// A group with a split and operations on the same non-blocking parents: the operations
// run after the splits (as NCCL runs a group's jobs first), not beside a job that
// exchanges over the same parent.
TEST(CoreJob, AGroupsOperationsRunAfterItsSplits) {
  EnvGuard stall("LOOM_TIMEOUT", "30");
  std::vector<ncclComm_t> parents = nonBlockingRanks(2);
  ASSERT_FALSE(HasFailure());
  ncclComm_t children[2] = {};
  constexpr size_t kCount = 4099;
  std::vector<int32_t> in[2], out[2];
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ncclCommSplit(parents[r], 0, 1 - r, &children[r], nullptr), ncclSuccess);
    in[r].assign(kCount, r + 1);
    out[r].assign(kCount, -1);
    ASSERT_EQ(ncclAllReduce(in[r].data(), out[r].data(), kCount, ncclInt32, ncclSum, parents[r], nullptr),
              ncclSuccess);
  }
  const ncclResult_t end = ncclGroupEnd();
  EXPECT_TRUE(end == ncclSuccess || end == ncclInProgress) << ncclGetLastError(nullptr);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(settle(parents[r]), ncclSuccess) << ncclGetLastError(parents[r]);
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(out[r][i], 3) << r << " [" << i << "]";
    ASSERT_NE(children[r], nullptr);
    EXPECT_EQ(settle(children[r]), ncclSuccess) << ncclGetLastError(children[r]);
  }
  EXPECT_EQ(allReduceInGroup({children[0], children[1]}, {1, 0}, {3, 3}), "");  // keys reversed
  for (ncclComm_t c : children) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  for (ncclComm_t c : parents) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// A parent that failed before its split keeps its own error: the split's failure (its
// peer is gone) does not replace what ncclCommGetAsyncError and ncclGetLastError report.
TEST(CoreJob, AFailedJobLeavesTheParentsEarlierError) {
  EnvGuard stall("LOOM_TIMEOUT", "30");
  std::vector<ncclComm_t> parents = nonBlockingRanks(2);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(ncclCommAbort(parents[1]), ncclSuccess);
  std::vector<int32_t> buf(1024, 1);
  const ncclResult_t failed =
      ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclInt32, ncclSum, parents[0], nullptr);
  ASSERT_NE(failed, ncclSuccess);
  ASSERT_EQ(settle(parents[0]), failed);
  const std::string before = ncclGetLastError(parents[0]);
  ASSERT_TRUE(contains(before.c_str(), "ncclAllReduce")) << before;
  ncclComm_t child = reinterpret_cast<ncclComm_t>(uintptr_t{1});
  ASSERT_EQ(ncclCommSplit(parents[0], 0, 0, &child, nullptr), ncclInProgress) << ncclGetLastError(nullptr);
  EXPECT_EQ(settle(parents[0], 30), failed);
  EXPECT_EQ(child, nullptr);
  EXPECT_EQ(std::string(ncclGetLastError(parents[0])), before);
  EXPECT_EQ(ncclCommDestroy(parents[0]), ncclSuccess);
}

}  // namespace
}  // namespace loomtest
