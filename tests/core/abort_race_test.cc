// Calls entering while another thread aborts their communicator: the registry's check and
// the count of active calls (api/comm.cc) must leave no moment when a destroy can free the
// communicator under a call that found it live: collectives, ncclGetLastError and the
// watchdog's polls, a group's end, and an init whose handle is aborted once published.
#include <gtest/gtest.h>
#include <malloc.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/core_util.h"

namespace loomtest {
namespace {

// An abort on one thread while others keep calling, as under PyTorch: its watchdog polls
// ncclCommGetAsyncError and aborts, while the training thread may be entering its next
// collective. Each call either runs on the live communicator or fails with a usage error,
// and none reads or writes it once freed. The collectives go through every stage of a call:
// its checks, the work, and an error recorded on the communicator (an unknown reduction
// op). A read or write after the free is what ASan and TSan report here
// (scripts/sanitize.sh runs this test, in both); a plain build checks the results.
std::string callsRacingAnAbort(int trials) {
  std::mt19937 rng(12345);
  for (int t = 0; t < trials; ++t) {
    ncclUniqueId id;
    RANK_NCCL(ncclGetUniqueId(&id));
    ncclComm_t comm = nullptr;
    RANK_NCCL(ncclCommInitRank(&comm, 1, id, 0));
    std::atomic<int> ready{0};
    std::string errs[2];
    const auto gone = [](const std::string& msg) {
      return msg.find("live communicator") != std::string::npos ||
             msg.find("aborted") != std::string::npos;
    };
    // Generous: only a machine that starves the aborting thread for a minute reaches it.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::thread trainer([&] {
      std::vector<float> in(64, 3.0f), out(64, 0.0f);
      ready.fetch_add(1);
      for (long i = 0; std::chrono::steady_clock::now() < deadline; ++i) {
        const bool badOp = i % 2 == 1;
        ncclResult_t rc = ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat,
                                        badOp ? static_cast<ncclRedOp_t>(77) : ncclSum, comm,
                                        nullptr);
        // The communicator's text (the failure recorded on it) while it may be going.
        const std::string onComm = ncclGetLastError(comm);
        const std::string msg = ncclGetLastError(nullptr);
        if (badOp && rc == ncclInvalidArgument && !gone(msg) && onComm != msg) {
          errs[0] = "the communicator's last error is \"" + onComm + "\", the call's \"" + msg +
                    "\"";
          return;
        }
        if (rc == ncclSuccess && !badOp) {
          if (out[0] != 3.0f || out[63] != 3.0f) {
            errs[0] = "a one-rank all-reduce gave " + std::to_string(out[0]);
            return;
          }
          continue;
        }
        if (rc != ncclInvalidArgument && rc != ncclInvalidUsage) {
          errs[0] = "call " + std::to_string(i) + " returned " + std::to_string(rc) + ": " + msg;
          return;
        }
        if (gone(msg)) return;  // the abort is seen
        if (!badOp || msg.find("reduction op 77") == std::string::npos) {
          errs[0] = "call " + std::to_string(i) + " failed for another reason: " + msg;
          return;
        }
      }
      errs[0] = "the abort was never seen by the collectives";
    });
    std::thread watchdog([&] {
      ready.fetch_add(1);
      while (std::chrono::steady_clock::now() < deadline) {
        ncclResult_t async = ncclInternalError;
        ncclResult_t rc = ncclCommGetAsyncError(comm, &async);
        if (rc == ncclSuccess) {
          if (async != ncclSuccess) {
            errs[1] = "the async error is " + std::to_string(async) + " before the abort";
            return;
          }
          continue;
        }
        const std::string msg = ncclGetLastError(nullptr);
        if (rc != ncclInvalidArgument || !gone(msg)) errs[1] = "async error poll: " + msg;
        return;
      }
      errs[1] = "the abort was never seen by the watchdog";
    });
    while (ready.load() < 2) std::this_thread::yield();
    // Somewhere in the first tens of calls, varying from trial to trial.
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(rng() % 200);
    while (std::chrono::steady_clock::now() < until) {
    }
    ncclResult_t arc = ncclCommAbort(comm);
    trainer.join();
    watchdog.join();
    RANK_CHECK(arc == ncclSuccess, "trial %d: ncclCommAbort returned %d", t, arc);
    for (const std::string& e : errs) RANK_CHECK(e.empty(), "trial %d: %s", t, e.c_str());
  }
  return "";
}

TEST(CoreRegression, CallsRacingAnAbortOnAnotherThread) {
  const char* env = getenv("LOOM_ABORT_RACE_TRIALS");
  EXPECT_EQ(callsRacingAnAbort(env ? atoi(env) : 200), "");
}

// A group's calls are recorded, then another thread aborts their communicator before the
// group ends: the end (and a simulated end) fails naming the communicator as gone instead
// of reading it.
TEST(CoreRegression, GroupEndAfterAnAbortOfItsCommunicator) {
  for (bool simulate : {false, true}) {
    SCOPED_TRACE(simulate ? "ncclGroupSimulateEnd" : "ncclGroupEnd");
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comm = nullptr;
    ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
    std::vector<float> in(16, 2.0f), out(16, 0.0f);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat, ncclSum, comm, nullptr),
              ncclSuccess);
    std::thread([comm] { ncclCommAbort(comm); }).join();
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    ncclResult_t rc = simulate ? ncclGroupSimulateEnd(&sim) : ncclGroupEnd();
    EXPECT_EQ(rc, ncclInvalidArgument);
    const std::string msg = ncclGetLastError(nullptr);
    EXPECT_NE(msg.find("not a live communicator"), std::string::npos) << msg;
    EXPECT_EQ(out[0], 0.0f) << "the aborted communicator's all-reduce ran";
  }
}

// As above, but the aborting thread then makes a new communicator, which the allocator
// tends to place at the freed one's address (as a watchdog that replaces a communicator
// may): the group's end must not take it for the one its calls were recorded on, for a
// recorded collective and for a recorded (deferred) init alike.
TEST(CoreRegression, GroupEndAfterItsCommunicatorWasReplacedAtItsAddress) {
  auto makeComm = [](ncclComm_t* out) {
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) return ncclInternalError;
    return ncclCommInitRank(out, 1, id, 0);
  };
  // One malloc arena for every thread, so that a block one thread frees is the next one
  // another gets (glibc gives threads arenas of their own otherwise).
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // their allocators hold freed blocks back
  mallopt(M_ARENA_MAX, 1);
#endif
  int sameAddress[2] = {0, 0};
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  const int attempts = 40;
#else
  const int attempts = 1;  // their allocators do not hand a freed block out again soon
#endif
  for (int attempt = 0; attempt < attempts && (!sameAddress[0] || !sameAddress[1]); ++attempt)
  for (bool deferredInit : {false, true}) {
    SCOPED_TRACE(std::string(deferredInit ? "a recorded init" : "a recorded all-reduce") +
                 ", attempt " + std::to_string(attempt));
    std::vector<float> in(16, 2.0f), out(16, 0.0f);
    ncclComm_t a = nullptr;
    if (!deferredInit) {
      ASSERT_EQ(makeComm(&a), ncclSuccess);
    }
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    if (deferredInit) {
      ASSERT_EQ(makeComm(&a), ncclSuccess);  // deferred to the group's end; the handle is out
    } else {
      ASSERT_EQ(ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat, ncclSum, a, nullptr),
                ncclSuccess);
    }
    ncclComm_t b = nullptr;
    ncclResult_t brc = ncclInternalError;
    std::thread([&] {
      // The id first: its root (made on the heap) must not take the freed block.
      ncclUniqueId id;
      if (ncclGetUniqueId(&id) != ncclSuccess) return;
      ncclCommAbort(a);
      brc = ncclCommInitRank(&b, 1, id, 0);
    }).join();
    ASSERT_EQ(brc, ncclSuccess);
    sameAddress[deferredInit] += a == b;
    ncclResult_t rc = ncclGroupEnd();
    const std::string msg = ncclGetLastError(nullptr);
    if (deferredInit) {
      EXPECT_EQ(rc, ncclInvalidUsage) << msg;
      EXPECT_NE(msg.find("aborted or destroyed before the group ended"), std::string::npos) << msg;
    } else {
      EXPECT_EQ(rc, ncclInvalidArgument) << msg;
      EXPECT_NE(msg.find("not a live communicator"), std::string::npos) << msg;
      EXPECT_EQ(out[0], 0.0f) << "the recorded all-reduce ran on the new communicator";
    }
    // The new communicator is whole and serves its own calls.
    std::fill(out.begin(), out.end(), 0.0f);
    EXPECT_EQ(ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat, ncclSum, b, nullptr),
              ncclSuccess) << ncclGetLastError(nullptr);
    EXPECT_EQ(out[15], 2.0f);
    EXPECT_EQ(ncclCommDestroy(b), ncclSuccess);
  }
  RecordProperty("reused_address_collective", sameAddress[0]);
  RecordProperty("reused_address_init", sameAddress[1]);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // their allocators hold freed blocks back
  EXPECT_TRUE(sameAddress[0] && sameAddress[1])
      << "in 40 attempts no new communicator was placed at the old one's address (collective "
      << sameAddress[0] << ", init " << sameAddress[1] << "): the test did not test its case";
#endif
}

// Another thread aborts an init's handle as soon as it is published (as NCCL allows, to
// end an init that waits for missing ranks): blocking, non-blocking and grouped inits of
// one rank. The init either finishes or fails, the abort frees the communicator once the
// init no longer uses it, and nothing is touched after (ASan and TSan run this).
std::string initsRacingAnAbort(int trials) {
  std::mt19937 rng(777);
  for (int t = 0; t < trials; ++t) {
    const int kind = t % 3;  // 0 blocking, 1 non-blocking, 2 grouped blocking
    ncclUniqueId id;
    RANK_NCCL(ncclGetUniqueId(&id));
    ncclComm_t comm = nullptr;
    std::atomic<int> rc{-1};
    std::thread init([&] {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = kind == 1 ? 0 : 1;
      if (kind == 2) ncclGroupStart();
      ncclResult_t r = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
      if (kind == 2) {
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess) r = e;
      }
      rc = r;
    });
    ncclComm_t handle = nullptr;
    while (!(handle = std::atomic_ref<ncclComm_t>(comm).load()) && rc.load() == -1) {
    }
    if (!handle) handle = std::atomic_ref<ncclComm_t>(comm).load();  // done between the looks
    if (handle) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(rng() % 300);
      while (std::chrono::steady_clock::now() < until) {
      }
      RANK_CHECK(ncclCommAbort(handle) == ncclSuccess, "trial %d: the abort failed: %s", t,
                 ncclGetLastError(nullptr));
    }
    init.join();
    const ncclResult_t r = static_cast<ncclResult_t>(rc.load());
    // A failed init takes its handle back (the abort it lost to frees the communicator).
    RANK_CHECK(handle != nullptr || r != ncclSuccess,
               "trial %d: the init succeeded but left no handle", t);
    RANK_CHECK(r == ncclSuccess || r == ncclInProgress || r == ncclInvalidUsage ||
                   r == ncclInvalidArgument || r == ncclSystemError || r == ncclRemoteError,
               "trial %d (kind %d): the init returned %d: %s", t, kind, r,
               ncclGetLastError(nullptr));
  }
  return "";
}

TEST(CoreRegression, InitsRacingAnAbortOfTheirHandle) {
  const char* env = getenv("LOOM_ABORT_RACE_TRIALS");
  EXPECT_EQ(initsRacingAnAbort(env ? atoi(env) : 150), "");
}

}  // namespace
}  // namespace loomtest
