// ncclCommGrow and ncclCommGetUniqueId (NCCL 2.29): existing ranks keep their ranks, new
// ranks join with the id the coordinator made; ranks as threads and as processes (the id
// handed over in shared memory, as a job hands it over out of band); one thread driving an
// existing and a new rank in one group, as NCCL's own example does; a grown communicator
// grown again; bad calls, which fail on every existing rank alike instead of leaving the
// others waiting.
#include <nccl.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/core_util.h"
#include "dispatch/nccl_extra_abi.h"

namespace loomtest {
namespace {

// The grow id, from the coordinator to the new ranks (threads or forked processes).
struct GrowBox {
  std::atomic<int> ready{0};
  ncclUniqueId id{};
};

std::string waitGrowId(const GrowBox& box, ncclUniqueId* id) {
  for (int i = 0; i < 60000 && box.ready.load() == 0; ++i) usleep(1000);
  RANK_CHECK(box.ready.load() == 1, "no grow id from the coordinator after 60 s");
  *id = box.id;
  return "";
}

// A new rank's ncclCommGrow on a thread of its own; join() before reading rc and err (its
// ncclGetLastError).
struct NewRank {
  NewRank(const ncclUniqueId& id, int nRanks, int rank, ncclComm_t* out = nullptr)
      : t([this, id, nRanks, rank, out] {
          rc = ncclCommGrow(nullptr, nRanks, &id, rank, out ? out : &comm, nullptr);
          err = ncclGetLastError(nullptr);
        }) {}
  void join() { t.join(); }
  ncclResult_t rc = ncclInternalError;
  std::string err;
  ncclComm_t comm = nullptr;  // where the grown communicator goes unless `out` is given
  std::thread t;              // last: started once the fields above exist
};

// Every rank r of `comm` contributes r + 1 in each element: the sum is n (n + 1) / 2.
std::string checkAllReduce(ncclComm_t comm, int wantRank, int wantSize) {
  int rank = -1, size = -1;
  RANK_NCCL(ncclCommUserRank(comm, &rank));
  RANK_NCCL(ncclCommCount(comm, &size));
  RANK_CHECK(rank == wantRank && size == wantSize, "rank %d of %d, want %d of %d", rank, size,
             wantRank, wantSize);
  constexpr size_t kCount = 50021;
  std::vector<int32_t> in(kCount, rank + 1), out(kCount, -1);
  RANK_NCCL(ncclAllReduce(in.data(), out.data(), kCount, ncclInt32, ncclSum, comm, nullptr));
  const int32_t want = size * (size + 1) / 2;
  for (size_t i = 0; i < kCount; ++i)
    RANK_CHECK(out[i] == want, "rank %d of %d: [%zu] = %d, want %d", rank, size, i, out[i], want);
  return "";
}

// Two existing ranks grow to four: worker 0 (the coordinator) makes the id, workers 2 and 3
// join as ranks 2 and 3.
void twoGrowToFour(Mode mode) {
  EnvGuard bound("LOOM_BOOTSTRAP_TIMEOUT", "60"), stall("LOOM_TIMEOUT", "60");
  LateId late;
  SharedBoard<GrowBox> box;
  auto f = runEach(
      mode, 4,
      [&](int w, int) {
        ncclComm_t grown = nullptr;
        if (w < 2) {
          ncclUniqueId id;
          RANK_TRY(late.wait(&id));
          ncclComm_t parent = nullptr;
          RANK_NCCL(ncclCommInitRank(&parent, 2, id, w));
          RANK_TRY(checkAllReduce(parent, w, 2));
          ncclUniqueId growId;
          if (w == 0) {
            RANK_NCCL(ncclCommGetUniqueId(parent, &growId));
            box->id = growId;
            box->ready.store(1);
          }
          RANK_NCCL(ncclCommGrow(parent, 4, w == 0 ? &growId : nullptr, -1, &grown, nullptr));
          RANK_NCCL(ncclCommDestroy(parent));
        } else {
          ncclUniqueId growId;
          RANK_TRY(waitGrowId(*box, &growId));
          RANK_NCCL(ncclCommGrow(nullptr, 4, &growId, w, &grown, nullptr));
        }
        RANK_CHECK(grown != nullptr, "no grown communicator");
        std::string e = checkAllReduce(grown, w, 4);
        ncclCommDestroy(grown);
        return e;
      },
      120, [&] { return makeId(late); });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

TEST(CoreGrow, TwoRankThreadsGrowToFour) { twoGrowToFour(Mode::kThreads); }
TEST(CoreGrow, TwoRankProcessesGrowToFour) { twoGrowToFour(Mode::kProcesses); }

// A one-rank communicator (*parent) and a grow id it made (*growId).
void oneRankParentWithGrowId(ncclComm_t* parent, ncclUniqueId* growId) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(parent, 1, id, 0), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_EQ(ncclCommGetUniqueId(*parent, growId), ncclSuccess) << ncclGetLastError(nullptr);
}

// NCCL's own example: one thread drives the existing rank and the new one in one group; the
// grown communicator is grown once more (by a second id of the same coordinator, the first
// being used), outside a group, its three ranks on threads.
TEST(CoreGrow, OneThreadDrivesTheExistingAndTheNewRankInAGroup) {
  EnvGuard stall("LOOM_TIMEOUT", "60");
  ncclComm_t parent = nullptr;
  ncclUniqueId growId;
  ASSERT_NO_FATAL_FAILURE(oneRankParentWithGrowId(&parent, &growId));
  ncclComm_t grown[2] = {reinterpret_cast<ncclComm_t>(uintptr_t{1}), nullptr};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclCommGrow(parent, 2, &growId, -1, &grown[0], nullptr), ncclSuccess)
      << ncclGetLastError(nullptr);
  EXPECT_EQ(grown[0], nullptr);  // set at the group's end
  ASSERT_EQ(ncclCommGrow(nullptr, 2, &growId, 1, &grown[1], nullptr), ncclSuccess)
      << ncclGetLastError(nullptr);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_NE(grown[0], nullptr);
  ASSERT_NE(grown[1], nullptr);
  ASSERT_EQ(ncclCommDestroy(parent), ncclSuccess);
  {
    std::string errs[2];
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r) ts.emplace_back([&, r] { errs[r] = checkAllReduce(grown[r], r, 2); });
    for (auto& t : ts) t.join();
    EXPECT_EQ(errs[0] + errs[1], "");
  }
  // Rank 1 of the grown communicator is the coordinator this time.
  ncclUniqueId again;
  ASSERT_EQ(ncclCommGetUniqueId(grown[1], &again), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_NE(std::memcmp(&again, &growId, sizeof again), 0);
  ncclComm_t third[3] = {};
  std::string errs[3];
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r) {
    ts.emplace_back([&, r] {
      ncclResult_t rc = r < 2 ? ncclCommGrow(grown[r], 3, r == 1 ? &again : nullptr, -1, &third[r], nullptr)
                              : ncclCommGrow(nullptr, 3, &again, 2, &third[r], nullptr);
      errs[r] = rc == ncclSuccess ? checkAllReduce(third[r], r, 3)
                                  : std::string("grow: ") + ncclGetLastError(nullptr);
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(errs[0] + errs[1] + errs[2], "");
  for (ncclComm_t c : third) {
    if (c) {
      EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    }
  }
  for (ncclComm_t c : grown) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

std::string lastError() { return ncclGetLastError(nullptr); }
bool says(const std::string& what) { return lastError().find(what) != std::string::npos; }

// A forked child that destroys its copy of a communicator with a pending grow id does not
// call off the parent process's rendezvous (the child inherits the root's list, not its
// thread): the parent's grow then succeeds. (Before the tests whose failed grows leave a
// cancelled root lingering: no fork while such a thread runs, see scripts/sanitize.sh.)
TEST(CoreGrow, ForkedChildLeavesTheParentsRendezvousAlone) {
  EnvGuard bound("LOOM_BOOTSTRAP_TIMEOUT", "30");
  ncclComm_t parent = nullptr;
  ncclUniqueId growId;
  ASSERT_NO_FATAL_FAILURE(oneRankParentWithGrowId(&parent, &growId));
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(5);  // a lock inherited held would stop it: the parent's check stands either way
    ncclCommDestroy(parent);
    _exit(0);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  waitpid(pid, &status, 0);
  ncclComm_t grown[2] = {};
  NewRank newRank(growId, 2, 1, &grown[1]);
  EXPECT_EQ(ncclCommGrow(parent, 2, &growId, -1, &grown[0], nullptr), ncclSuccess) << lastError();
  newRank.join();
  EXPECT_EQ(newRank.rc, ncclSuccess) << newRank.err;
  for (ncclComm_t c : grown) {
    if (c) {
      EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    }
  }
  EXPECT_EQ(ncclCommDestroy(parent), ncclSuccess);
}

// Bad calls; one id at a time, each used once; a failed grow uses its id up.
TEST(CoreGrow, BadCallsAndIdsUsedOnce) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t parent = nullptr, grown = nullptr;
  ASSERT_EQ(ncclCommInitRank(&parent, 1, id, 0), ncclSuccess);
  ncclUniqueId growId;
  EXPECT_EQ(ncclCommGetUniqueId(parent, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommGetUniqueId(nullptr, &growId), ncclInvalidArgument);
  ASSERT_EQ(ncclCommGetUniqueId(parent, &growId), ncclSuccess);
  ncclUniqueId second;
  EXPECT_EQ(ncclCommGetUniqueId(parent, &second), ncclInvalidUsage);
  EXPECT_TRUE(says("has not been used by ncclCommGrow yet")) << lastError();
  // New ranks' bad calls fail at the call and leave the id alone.
  EXPECT_EQ(ncclCommGrow(nullptr, 2, nullptr, 1, &grown, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("a new rank (comm NULL) passes the uniqueId")) << lastError();
  EXPECT_EQ(ncclCommGrow(nullptr, 2, &growId, 2, &grown, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommGrow(reinterpret_cast<ncclComm_t>(uintptr_t{0x20}), 2, &growId, -1, &grown,
                         nullptr), ncclInvalidArgument);
  EXPECT_TRUE(says("is not a live communicator")) << lastError();
  EXPECT_EQ(grown, nullptr);

  // Each bad call of the (lone) existing rank fails, and uses up the id it made: a new one
  // is made before the next.
  struct Bad {
    int nRanks, rank;
    bool nullOut, passId;
    ncclResult_t rc;
    const char* says;
  };
  const Bad bad[] = {
      {2, 0, false, true, ncclInvalidArgument, "an existing rank passes rank=-1"},
      {1, -1, false, true, ncclInvalidArgument, "nRanks=1 must exceed the communicator's 1 ranks"},
      {2, -1, true, true, ncclInvalidArgument, "newcomm is NULL"},
      {2, -1, false, false, ncclInvalidUsage, "no existing rank passed a uniqueId"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.says);
    EXPECT_EQ(ncclCommGrow(parent, b.nRanks, b.passId ? &growId : nullptr, b.rank,
                           b.nullOut ? nullptr : &grown, nullptr), b.rc);
    EXPECT_TRUE(says(b.says)) << lastError();
    EXPECT_EQ(grown, nullptr);
    // Used up: it is refused, and a new id may be made.
    EXPECT_EQ(ncclCommGrow(parent, 2, &growId, -1, &grown, nullptr), ncclInvalidUsage);
    EXPECT_TRUE(says("or an earlier grow used it (each is used once)")) << lastError();
    ASSERT_EQ(ncclCommGetUniqueId(parent, &second), ncclSuccess) << lastError();
    EXPECT_NE(std::memcmp(&second, &growId, sizeof second), 0);
    growId = second;
  }
  // An id that is not this communicator's.
  EXPECT_EQ(ncclCommGrow(parent, 2, &id, -1, &grown, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("was not made by ncclCommGetUniqueId on this communicator")) << lastError();
  ASSERT_EQ(ncclCommGetUniqueId(parent, &growId), ncclSuccess) << lastError();
  // A config not made with NCCL_CONFIG_INITIALIZER.
  ncclConfig_t junk;
  memset(&junk, 0x5a, sizeof junk);
  junk.size = sizeof junk;
  EXPECT_EQ(ncclCommGrow(parent, 2, &growId, -1, &grown, &junk), ncclInvalidArgument);
  EXPECT_TRUE(says("NCCL_CONFIG_INITIALIZER")) << lastError();
  ASSERT_EQ(ncclCommGetUniqueId(parent, &growId), ncclSuccess) << lastError();
  // A good grow, in a group; the id is then used.
  ncclComm_t pair[2] = {};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclCommGrow(parent, 2, &growId, -1, &pair[0], nullptr), ncclSuccess);
  ASSERT_EQ(ncclCommGrow(nullptr, 2, &growId, 1, &pair[1], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << lastError();
  for (ncclComm_t c : pair) ASSERT_NE(c, nullptr);
  EXPECT_EQ(ncclCommGrow(parent, 2, &growId, -1, &grown, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(says("or an earlier grow used it (each is used once)")) << lastError();
  for (ncclComm_t c : pair) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(parent), ncclSuccess);
}

// One thread drives the existing rank, whose call is bad, and a new rank in one group: the
// group's end fails at once (the new rank's rendezvous is called off), saying why.
TEST(CoreGrow, BadCallInAGroupFailsTheGroupsEndAtOnce) {
  EnvGuard bound("LOOM_BOOTSTRAP_TIMEOUT", "60");
  ncclComm_t parent = nullptr;
  ncclUniqueId growId;
  ASSERT_NO_FATAL_FAILURE(oneRankParentWithGrowId(&parent, &growId));
  ncclComm_t grown[2] = {};
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclCommGrow(parent, 2, &growId, 0, &grown[0], nullptr), ncclSuccess);
  ASSERT_EQ(ncclCommGrow(nullptr, 2, &growId, 1, &grown[1], nullptr), ncclSuccess);
  EXPECT_NE(ncclGroupEnd(), ncclSuccess);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(sec, 10.0) << lastError();
  EXPECT_TRUE(says("an existing rank passes rank=-1")) << lastError();
  EXPECT_TRUE(says("cancelled the rendezvous")) << lastError();
  EXPECT_EQ(grown[0], nullptr);
  // The new rank's communicator failed its init, as a deferred init does: the caller ends it.
  ASSERT_NE(grown[1], nullptr);
  EXPECT_EQ(ncclCommAbort(grown[1]), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(parent), ncclSuccess);
}

// A grow recorded in a group that does not run (another recorded call's communicator was
// destroyed before the end) calls off its id's rendezvous: the group's new rank fails at
// once, and the end says why.
TEST(CoreGrow, GrowSkippedAtTheGroupsEndCallsOffItsId) {
  EnvGuard bound("LOOM_BOOTSTRAP_TIMEOUT", "60");
  ncclComm_t parent = nullptr, other = nullptr;
  ncclUniqueId growId, id2;
  ASSERT_NO_FATAL_FAILURE(oneRankParentWithGrowId(&parent, &growId));
  ASSERT_EQ(ncclGetUniqueId(&id2), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&other, 1, id2, 0), ncclSuccess);
  ncclComm_t grown[2] = {}, child = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclCommGrow(parent, 2, &growId, -1, &grown[0], nullptr), ncclSuccess);
  ASSERT_EQ(ncclCommGrow(nullptr, 2, &growId, 1, &grown[1], nullptr), ncclSuccess);
  ASSERT_EQ(ncclCommSplit(other, 0, 0, &child, nullptr), ncclSuccess);
  std::thread([&] { EXPECT_EQ(ncclCommDestroy(other), ncclSuccess); }).join();
  EXPECT_NE(ncclGroupEnd(), ncclSuccess);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(sec, 10.0) << lastError();
  EXPECT_TRUE(says("cancelled the rendezvous")) << lastError();
  EXPECT_EQ(grown[0], nullptr);
  EXPECT_EQ(child, nullptr);
  if (grown[1]) {
    EXPECT_EQ(ncclCommAbort(grown[1]), ncclSuccess);
  }
  // The id is used up: a new one may be made.
  EXPECT_EQ(ncclCommGetUniqueId(parent, &growId), ncclSuccess) << lastError();
  EXPECT_EQ(ncclCommDestroy(parent), ncclSuccess);
}

// Inside a group, the id of a communicator whose init the group defers is refused (waiting
// for that init would never end); after the group it is given.
TEST(CoreGrow, IdOfACommunicatorInitializedInTheSameGroupIsRefused) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ncclUniqueId growId;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  EXPECT_EQ(ncclCommGetUniqueId(comm, &growId), ncclInvalidUsage);
  EXPECT_TRUE(says("call it after ncclGroupEnd")) << lastError();
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << lastError();
  EXPECT_EQ(ncclCommGetUniqueId(comm, &growId), ncclSuccess) << lastError();
  // Destroyed with its id unused: a new rank waiting at the id's root is told at once.
  EnvGuard bound("LOOM_BOOTSTRAP_TIMEOUT", "60");
  NewRank newRank(growId, 2, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the new rank at the root
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  newRank.join();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(newRank.rc, ncclRemoteError) << newRank.err;
  EXPECT_NE(newRank.err.find("cancelled the rendezvous"), std::string::npos) << newRank.err;
  EXPECT_LT(sec, 10.0) << newRank.err;
}

// A non-blocking parent grown with no config: its grow runs as a job (api/mgmt_job.h):
// the call returns ncclInProgress, and the new communicator is there once the parent's
// state settles. It is non-blocking too (its split returns ncclInProgress), the new
// rank's blocking (the defaults).
TEST(CoreGrow, ExistingRanksInheritTheParentsConfig) {
  EnvGuard stall("LOOM_TIMEOUT", "60");
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = "grown-from";
  ncclComm_t parent = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&parent, 1, id, 0, &cfg);
  ASSERT_TRUE(rc == ncclSuccess || rc == ncclInProgress) << lastError();
  ASSERT_EQ(settle(parent), ncclSuccess);
  ncclResult_t state = ncclInProgress;
  ncclUniqueId growId;
  ASSERT_EQ(ncclCommGetUniqueId(parent, &growId), ncclSuccess) << lastError();
  ncclComm_t grown[2] = {};
  NewRank newRank(growId, 2, 1, &grown[1]);
  EXPECT_EQ(ncclCommGrow(parent, 2, &growId, -1, &grown[0], nullptr), ncclInProgress) << lastError();
  newRank.join();
  EXPECT_EQ(newRank.rc, ncclSuccess) << newRank.err;
  EXPECT_EQ(settle(parent), ncclSuccess) << ncclGetLastError(parent);
  ASSERT_NE(grown[0], nullptr);
  ASSERT_EQ(ncclCommGetAsyncError(grown[0], &state), ncclSuccess);
  EXPECT_EQ(state, ncclSuccess) << "its init ran in the job";
  std::string errs[2];
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) ts.emplace_back([&, r] { errs[r] = checkAllReduce(grown[r], r, 2); });
  for (auto& th : ts) th.join();
  EXPECT_EQ(errs[0] + errs[1], "");
  // Which of them blocks: the new rank's split waits for the other's; the existing rank's
  // returns at once.
  ncclComm_t none[2] = {grown[0], grown[1]};
  ncclResult_t newRc = ncclInternalError;
  std::thread split1([&] { newRc = ncclCommSplit(grown[1], NCCL_SPLIT_NOCOLOR, 0, &none[1], nullptr); });
  EXPECT_EQ(ncclCommSplit(grown[0], NCCL_SPLIT_NOCOLOR, 0, &none[0], nullptr), ncclInProgress);
  split1.join();
  EXPECT_EQ(newRc, ncclSuccess);
  EXPECT_EQ(settle(grown[0]), ncclSuccess);
  EXPECT_EQ(none[0], nullptr);
  EXPECT_EQ(none[1], nullptr);
  for (ncclComm_t c : grown) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(parent), ncclSuccess);
}

// One thread drives two non-blocking existing ranks through a grow without a group (each
// call returns at once); a third thread is the new rank. Then a bad call from one thread:
// both parents' states report it (the bad rank's own words, the other naming it), and the
// new rank learns at once that the rendezvous was called off.
TEST(CoreGrow, NonBlockingExistingRanksGrowFromOneThread) {
  EnvGuard stall("LOOM_TIMEOUT", "30"), bound("LOOM_BOOTSTRAP_TIMEOUT", "30");
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "a good grow" : "rank 1 passes rank=0");
    const std::vector<ncclComm_t> parents = nonBlockingRanks(2);
    ASSERT_FALSE(HasFailure());
    ncclUniqueId growId;
    ASSERT_EQ(ncclCommGetUniqueId(parents[0], &growId), ncclSuccess) << lastError();
    ncclComm_t grown[3] = {};
    NewRank newRank(growId, 3, 2, &grown[2]);
    EXPECT_EQ(ncclCommGrow(parents[0], 3, &growId, -1, &grown[0], nullptr), ncclInProgress) << lastError();
    EXPECT_EQ(ncclCommGrow(parents[1], 3, nullptr, round == 0 ? -1 : 0, &grown[1], nullptr), ncclInProgress)
        << lastError();
    ncclResult_t states[2];
    for (int r = 0; r < 2; ++r) states[r] = settle(parents[r]);
    newRank.join();
    if (round == 0) {
      EXPECT_EQ(states[0], ncclSuccess) << ncclGetLastError(parents[0]);
      EXPECT_EQ(states[1], ncclSuccess) << ncclGetLastError(parents[1]);
      EXPECT_EQ(newRank.rc, ncclSuccess) << newRank.err;
      std::string errs[3];
      std::vector<std::thread> ts;
      for (int r = 0; r < 3; ++r) ts.emplace_back([&, r] { errs[r] = checkAllReduce(grown[r], r, 3); });
      for (auto& th : ts) th.join();
      EXPECT_EQ(errs[0] + errs[1] + errs[2], "");
      for (ncclComm_t c : grown) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    } else {
      EXPECT_EQ(states[1], ncclInvalidArgument);
      EXPECT_NE(std::string(ncclGetLastError(parents[1])).find("got rank=0"), std::string::npos)
          << ncclGetLastError(parents[1]);
      EXPECT_EQ(states[0], ncclInvalidUsage);
      EXPECT_NE(std::string(ncclGetLastError(parents[0])).find("existing rank 1's call has a bad argument"),
                std::string::npos) << ncclGetLastError(parents[0]);
      for (ncclComm_t c : grown) EXPECT_EQ(c, nullptr);
      EXPECT_EQ(newRank.rc, ncclRemoteError) << newRank.err;
      EXPECT_NE(newRank.err.find("cancelled the rendezvous"), std::string::npos) << newRank.err;
    }
    for (ncclComm_t p : parents) EXPECT_EQ(ncclCommDestroy(p), ncclSuccess);
  }
}

// A non-blocking parent's grow whose new rank never comes: its job waits in the grown
// communicator's init, which the abort of the parent ends at once (no new communicator).
TEST(CoreGrow, AbortOfTheParentEndsItsGrowsInit) {
  EnvGuard stall("LOOM_TIMEOUT", "60"), bound("LOOM_BOOTSTRAP_TIMEOUT", "60");
  const ncclComm_t parent = nonBlockingRanks(1)[0];
  ASSERT_FALSE(HasFailure());
  ncclUniqueId growId;
  ASSERT_EQ(ncclCommGetUniqueId(parent, &growId), ncclSuccess) << lastError();
  ncclComm_t grown = reinterpret_cast<ncclComm_t>(uintptr_t{1});
  ASSERT_EQ(ncclCommGrow(parent, 2, &growId, -1, &grown, nullptr), ncclInProgress) << lastError();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ncclResult_t state = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(parent, &state), ncclSuccess);
  EXPECT_EQ(state, ncclInProgress) << "the init waits for new rank 1";
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ncclCommAbort(parent), ncclSuccess);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_EQ(grown, nullptr);
}

// Existing ranks that disagree, or one of which passes a bad argument, fail alike: both
// pass an id, they ask for different sizes, one passes rank=0. A new rank waiting at the
// id's root is told at once that the rendezvous was called off.
TEST(CoreGrow, ExistingRanksThatDisagreeAllFail) {
  EnvGuard stall("LOOM_TIMEOUT", "60"), bound("LOOM_BOOTSTRAP_TIMEOUT", "60");
  ncclConfig_t badBlocking = NCCL_CONFIG_INITIALIZER;
  badBlocking.blocking = 2;
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<ncclComm_t> parents(2, nullptr);
    ASSERT_EQ(ncclCommInitAll(parents.data(), 2, nullptr), ncclSuccess);
    ncclUniqueId growId;
    ASSERT_EQ(ncclCommGetUniqueId(parents[0], &growId), ncclSuccess);
    ncclResult_t rc[2];
    std::string err[2];
    const auto t0 = std::chrono::steady_clock::now();
    NewRank newRank(growId, 3, 2);
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r) {
      ts.emplace_back([&, r] {
        ncclComm_t grown = nullptr;
        // round 0: both pass the id; 1: rank 1 asks for 4 ranks; rank 1 passes 2: rank=0,
        // 3: a config with blocking=2, 4: newcomm NULL
        const bool bad = r == 1;
        const ncclUniqueId* passed = round == 0 || r == 0 ? &growId : nullptr;
        const int n = round == 1 && bad ? 4 : 3;
        rc[r] = ncclCommGrow(parents[r], n, passed, round == 2 && bad ? 0 : -1,
                             round == 4 && bad ? nullptr : &grown,
                             round == 3 && bad ? &badBlocking : nullptr);
        err[r] = ncclGetLastError(nullptr);
      });
    }
    for (auto& t : ts) t.join();
    newRank.join();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const char* want[5] = {"existing ranks 0 and 1 both passed a uniqueId",
                           "existing ranks ask for different sizes: rank 0 nRanks=3, rank 1 nRanks=4",
                           "existing rank 1's call has a bad argument (rank is not -1); no rank grows",
                           "existing rank 1's call has a bad argument (its config is invalid)",
                           "existing rank 1's call has a bad argument (newcomm is NULL)"};
    const char* ownWords[5] = {nullptr, nullptr,
                               "an existing rank passes rank=-1 (it keeps its rank, 1); got rank=0",
                               "config->blocking=2 (expected 0 or 1)", "newcomm is NULL"};
    for (int r = 0; r < 2; ++r) {
      if (round >= 2 && r == 1) {
        EXPECT_EQ(rc[r], ncclInvalidArgument);
        EXPECT_NE(err[r].find(ownWords[round]), std::string::npos) << err[r];
        continue;
      }
      EXPECT_EQ(rc[r], ncclInvalidUsage) << "rank " << r;
      EXPECT_NE(err[r].find(want[round]), std::string::npos) << err[r];
    }
    EXPECT_EQ(newRank.rc, ncclRemoteError) << "the new rank: " << newRank.err;
    EXPECT_NE(newRank.err.find("cancelled the rendezvous"), std::string::npos) << newRank.err;
    EXPECT_LT(sec, 10.0) << "the new rank waited: " << newRank.err;
    for (ncclComm_t c : parents) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
}

}  // namespace
}  // namespace loomtest
