// ncclCommSplit inside ncclGroupStart/End, as XLA calls it: one thread splits the several
// ranks it drives in one group, and the children exist once the group has ended (each split
// runs then, on a thread of its own, so that the color exchange of ranks one thread drives
// can meet). Colors, keys and NCCL_SPLIT_NOCOLOR as outside a group; ranks as one thread,
// and as two processes of two ranks each; a non-blocking config; a parent aborted before
// the group's end; bad arguments at the call. ncclCommShrink in a group likewise.
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/core_util.h"

namespace loomtest {
namespace {

// Splits the ranks `ranks` of a 4-rank parent, driven by this thread, in one group: ranks
// 0 and 2 color 0, rank 1 color 1, rank 3 no color; keys reverse the order (key = -rank).
std::string splitInGroup(const std::vector<ncclComm_t>& parents, const std::vector<int>& ranks) {
  const size_t k = parents.size();
  std::vector<ncclComm_t> children(k, reinterpret_cast<ncclComm_t>(uintptr_t{1}));
  RANK_NCCL(ncclGroupStart());
  for (size_t j = 0; j < k; ++j) {
    const int r = ranks[j];
    const int color = r == 3 ? NCCL_SPLIT_NOCOLOR : r == 1 ? 1 : 0;
    RANK_NCCL(ncclCommSplit(parents[j], color, -r, &children[j], nullptr));
    RANK_CHECK(children[j] == nullptr, "rank %d: the child exists before the group's end", r);
  }
  RANK_NCCL(ncclGroupEnd());
  // Expected child rank / size: rank 2 -> 0 of 2, rank 0 -> 1 of 2, rank 1 -> 0 of 1.
  const int wantRank[4] = {1, 0, 0, -1}, wantSize[4] = {2, 1, 2, 0};
  std::vector<int> expect(k);
  for (size_t j = 0; j < k; ++j) {
    const int r = ranks[j];
    if (r == 3) {
      RANK_CHECK(children[j] == nullptr, "rank 3 (no color) got a communicator");
      continue;
    }
    RANK_CHECK(children[j] != nullptr, "rank %d got no communicator", r);
    int cr = -1, cn = -1;
    RANK_NCCL(ncclCommUserRank(children[j], &cr));
    RANK_NCCL(ncclCommCount(children[j], &cn));
    RANK_CHECK(cr == wantRank[r] && cn == wantSize[r], "rank %d: child rank %d of %d, want %d of %d",
               r, cr, cn, wantRank[r], wantSize[r]);
    expect[j] = r == 1 ? 2 : 1 + 3;  // the sum of (rank + 1) over the child's members
  }
  std::string err = allReduceInGroup(children, ranks, expect);
  for (ncclComm_t c : children)
    if (c) ncclCommDestroy(c);
  return err;
}

TEST(CoreSplitInGroup, OneThreadSplitsTheRanksItDrives) {
  EnvGuard bound("LOOM_TIMEOUT", "60");
  std::vector<ncclComm_t> parents(4, nullptr);
  ASSERT_EQ(ncclCommInitAll(parents.data(), 4, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(splitInGroup(parents, {0, 1, 2, 3}), "");
  for (ncclComm_t c : parents) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Two processes, each driving two ranks of the parent (initialized in a group too): the
// children span both processes.
TEST(CoreSplitInGroup, TwoProcessesOfTwoRanksEach) {
  EnvGuard bound("LOOM_BOOTSTRAP_TIMEOUT", "60"), stall("LOOM_TIMEOUT", "60");
  LateId late;
  auto f = runEach(
      Mode::kProcesses, 2,
      [&](int w, int) {
        ncclUniqueId id;
        RANK_TRY(late.wait(&id));
        // Worker 0 drives ranks 0 and 3, worker 1 ranks 1 and 2: each child crosses over.
        std::vector<int> ranks = w == 0 ? std::vector<int>{0, 3} : std::vector<int>{1, 2};
        std::vector<ncclComm_t> parents(2, nullptr);
        RANK_NCCL(ncclGroupStart());
        for (int j = 0; j < 2; ++j) RANK_NCCL(ncclCommInitRank(&parents[j], 4, id, ranks[j]));
        RANK_NCCL(ncclGroupEnd());
        std::string err = splitInGroup(parents, ranks);
        for (ncclComm_t c : parents) ncclCommDestroy(c);
        return err;
      },
      120, [&] { return makeId(late); });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

// Two splits of each parent in one group (rows and columns of a 2 x 2 grid), and the parents
// themselves initialized in that same group: each parent's splits run in the order recorded,
// so the two exchanges of one parent never cross; a split waits for its parent's init.
TEST(CoreSplitInGroup, RowsAndColumnsOfParentsMadeInTheSameGroup) {
  EnvGuard bound("LOOM_BOOTSTRAP_TIMEOUT", "60"), stall("LOOM_TIMEOUT", "60");
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> parents(4, nullptr), rows(4, nullptr), cols(4, nullptr);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 4; ++r) ASSERT_EQ(ncclCommInitRank(&parents[r], 4, id, r), ncclSuccess);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(ncclCommSplit(parents[r], r / 2, r, &rows[r], nullptr), ncclSuccess);
    ASSERT_EQ(ncclCommSplit(parents[r], r % 2, r, &cols[r], nullptr), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < 4; ++r) {
    int rr = -1, cr = -1;
    ASSERT_NE(rows[r], nullptr);
    ASSERT_NE(cols[r], nullptr);
    ASSERT_EQ(ncclCommUserRank(rows[r], &rr), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(cols[r], &cr), ncclSuccess);
    EXPECT_EQ(rr, r % 2) << "rank " << r << "'s row";
    EXPECT_EQ(cr, r / 2) << "rank " << r << "'s column";
  }
  // Row sums: ranks {0,1} -> 1+2, {2,3} -> 3+4; column sums: {0,2} -> 1+3, {1,3} -> 2+4.
  EXPECT_EQ(allReduceInGroup(rows, {0, 1, 2, 3}, {3, 3, 7, 7}), "");
  EXPECT_EQ(allReduceInGroup(cols, {0, 1, 2, 3}, {4, 6, 4, 6}), "");
  for (auto* set : {&rows, &cols, &parents})
    for (ncclComm_t c : *set) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// A non-blocking config: the group's end returns ncclInProgress and each child finishes
// its init in the background (ncclCommGetAsyncError says when).
TEST(CoreSplitInGroup, NonBlockingChildren) {
  std::vector<ncclComm_t> parents(2, nullptr);
  ASSERT_EQ(ncclCommInitAll(parents.data(), 2, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<ncclComm_t> children(2, nullptr);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int j = 0; j < 2; ++j) ASSERT_EQ(ncclCommSplit(parents[j], 0, j, &children[j], &config), ncclSuccess);
  config.blocking = 1;  // read at the call, not at the group's end
  EXPECT_EQ(ncclGroupEnd(), ncclInProgress) << ncclGetLastError(nullptr);
  for (ncclComm_t c : children) {
    ASSERT_NE(c, nullptr);
    ncclResult_t state = ncclInProgress;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      ASSERT_EQ(ncclCommGetAsyncError(c, &state), ncclSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(state, ncclSuccess);
  }
  EXPECT_EQ(allReduceInGroup(children, {0, 1}, {3, 3}), "");
  for (ncclComm_t c : children) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  for (ncclComm_t c : parents) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// One thread shrinks the ranks it drives in one group, leaving rank 1 out (as after its
// failure): before, the second survivor waited for the first's id on the same thread.
TEST(CoreSplitInGroup, OneThreadShrinksTheRanksItDrives) {
  EnvGuard bound("LOOM_BOOTSTRAP_TIMEOUT", "60"), stall("LOOM_TIMEOUT", "60");
  std::vector<ncclComm_t> parents(4, nullptr);
  ASSERT_EQ(ncclCommInitAll(parents.data(), 4, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  int excluded[1] = {1};
  std::vector<ncclComm_t> children(4, nullptr);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r : {3, 2, 0})  // the first survivor last: no order is needed
    ASSERT_EQ(ncclCommShrink(parents[r], excluded, 1, &children[r], nullptr, NCCL_SHRINK_DEFAULT),
              ncclSuccess);
  EXPECT_EQ(ncclCommShrink(parents[1], excluded, 1, &children[1], nullptr, NCCL_SHRINK_DEFAULT),
            ncclInvalidUsage) << "rank 1 excludes itself";
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  const int wantRank[4] = {0, -1, 1, 2};
  for (int r : {0, 2, 3}) {
    int cr = -1, cn = -1;
    ASSERT_NE(children[r], nullptr) << r;
    ASSERT_EQ(ncclCommUserRank(children[r], &cr), ncclSuccess);
    ASSERT_EQ(ncclCommCount(children[r], &cn), ncclSuccess);
    EXPECT_EQ(cr, wantRank[r]);
    EXPECT_EQ(cn, 3);
  }
  std::vector<ncclComm_t> live = {children[0], children[2], children[3]};
  EXPECT_EQ(allReduceInGroup(live, {0, 2, 3}, {8, 8, 8}), "");  // 1 + 3 + 4
  for (ncclComm_t c : live) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  for (ncclComm_t c : parents) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Bad arguments fail at the call; a parent aborted before the group's end fails the end,
// saying so, and makes no child.
TEST(CoreSplitInGroup, BadCallsAndAnAbortedParent) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t parent = nullptr, child = reinterpret_cast<ncclComm_t>(uintptr_t{1});
  ASSERT_EQ(ncclCommInitRank(&parent, 1, id, 0), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclCommSplit(parent, -7, 0, &child, nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("color=-7"), std::string::npos);
  EXPECT_EQ(ncclCommSplit(parent, 0, 0, nullptr, nullptr), ncclInvalidArgument);
  // A config not made with NCCL_CONFIG_INITIALIZER is refused at the call, before anything
  // in it (its name pointers) is read.
  ncclConfig_t junk;
  memset(&junk, 0x5a, sizeof junk);
  junk.size = sizeof junk;
  EXPECT_EQ(ncclCommSplit(parent, 0, 0, &child, &junk), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("NCCL_CONFIG_INITIALIZER"),
            std::string::npos) << ncclGetLastError(nullptr);
  ASSERT_EQ(ncclCommSplit(parent, 0, 0, &child, nullptr), ncclSuccess);
  EXPECT_EQ(child, nullptr);
  ASSERT_EQ(ncclCommAbort(parent), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr))
                .find("the communicators of 1 of the group's 1 recorded ncclCommSplit calls were "
                      "aborted or destroyed before the group ended (no call of the group ran)"),
            std::string::npos)
      << ncclGetLastError(nullptr);
  EXPECT_EQ(child, nullptr);
}

}  // namespace
}  // namespace loomtest
