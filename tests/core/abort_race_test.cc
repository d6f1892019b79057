// A call entering while another thread aborts its communicator: the registry's check and
// the count of active calls (api/comm.cc) must leave no moment when a destroy can free the
// communicator under a call that found it live.
#include <gtest/gtest.h>
#include <nccl.h>

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
    std::thread trainer([&] {
      std::vector<float> in(64, 3.0f), out(64, 0.0f);
      ready.fetch_add(1);
      for (long i = 0; i < 10000000; ++i) {
        const bool badOp = i % 2 == 1;
        ncclResult_t rc = ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat,
                                        badOp ? static_cast<ncclRedOp_t>(77) : ncclSum, comm,
                                        nullptr);
        const std::string msg = ncclGetLastError(nullptr);
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
      for (long i = 0; i < 10000000; ++i) {
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

}  // namespace
}  // namespace loomtest
