// The engine seam: plan cache, sequence numbers, asynchronous launches and work handles.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <regex>
#include <string>
#include <vector>

#include "api/comm.h"
#include "base/log.h"
#include "core/core_util.h"
#include "engine/engine.h"

namespace loomtest {
namespace {

loom::Op hostAllReduce(ncclComm_t comm, const float* send, float* recv, size_t count) {
  loom::Op op;
  op.coll = loom::Collective::kAllReduce;
  op.sendbuff = send;
  op.recvbuff = recv;
  op.count = count;
  op.eltSize = sizeof(float);
  op.red = loom::Reducer::make(ncclFloat32, ncclSum, comm->nranks);
  op.dtype = ncclFloat32;
  op.redop = ncclSum;
  op.comm = {comm->core.get(), &comm->abortFlag, &comm->revoked, nullptr, nullptr};
  return op;
}

// Each rank contributes rank + 1 + i at element i: the sum is known in closed form.
std::vector<float> input(int rank, size_t n, float salt = 0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank + 1 + (i % 97)) + salt;
  return v;
}
std::string checkSum(const std::vector<float>& got, int nranks, float salt = 0) {
  for (size_t i = 0; i < got.size(); ++i) {
    float want = static_cast<float>(nranks * (nranks + 1) / 2 + nranks * (i % 97)) + nranks * salt;
    RANK_CHECK(got[i] == want, "element %zu is %g, expected %g", i, got[i], want);
  }
  return "";
}

TEST(EnginePlanCache, RepeatedCallsReuseOnePlanPerShape) {
  auto f = runRanks(Mode::kThreads, 3, [](int rank, int nranks, ncclComm_t comm) -> std::string {
    loom::PlanCache& cache = comm->core->planCache();
    size_t misses0 = cache.misses(), hits0 = cache.hits();
    std::vector<float> in = input(rank, 1000), out(1000);
    for (int i = 0; i < 10; ++i) {
      RANK_NCCL(ncclAllReduce(in.data(), out.data(), 1000, ncclFloat32, ncclSum, comm, nullptr));
      RANK_TRY(checkSum(out, nranks));
    }
    RANK_CHECK(cache.misses() - misses0 == 1, "10 same-shape calls built %zu plans",
               cache.misses() - misses0);
    RANK_CHECK(cache.hits() - hits0 == 9, "10 same-shape calls hit the cache %zu times",
               cache.hits() - hits0);
    // Another count, another datatype width, another root: each its own plan.
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), 999, ncclFloat32, ncclSum, comm, nullptr));
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), 500, ncclFloat64, ncclSum, comm, nullptr));
    RANK_NCCL(ncclBroadcast(in.data(), out.data(), 1000, ncclFloat32, 1, comm, nullptr));
    RANK_NCCL(ncclBroadcast(in.data(), out.data(), 1000, ncclFloat32, 2, comm, nullptr));
    // (A size-free plan may serve the new count: found by its size class, not its shape.)
    RANK_CHECK(cache.misses() + cache.classHits() - misses0 == 5,
               "5 shapes were planned %zu times", cache.misses() + cache.classHits() - misses0);
    // The broadcast from root 2 after root 1 must not have reused root 1's plan.
    std::vector<float> root2 = input(2, 1000);
    RANK_CHECK(out == root2, "broadcast from root 2 delivered other data");
    return "";
  });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

// Ring plans are size-free: every count that selects the same (algorithm, channels,
// chunk) runs the one plan, and each gets its own exact result.
TEST(EnginePlanCache, OneRingPlanServesEveryCountOfItsSizeClass) {
  EnvGuard algo("NCCL_ALGO", "Ring");
  auto f = runRanks(Mode::kThreads, 3, [](int rank, int nranks, ncclComm_t comm) -> std::string {
    loom::PlanCache& cache = comm->core->planCache();
    const std::vector<size_t> counts = {1000, 999, 7, 12345, 1, 4097};
    std::vector<float> in = input(rank, 12345);
    for (size_t c : counts) {
      std::vector<float> out(c, -1);
      RANK_NCCL(ncclAllReduce(in.data(), out.data(), c, ncclFloat32, ncclSum, comm, nullptr));
      RANK_TRY(checkSum(out, nranks));
    }
    RANK_CHECK(cache.misses() == 1, "%zu counts of one size class built %zu plans", counts.size(),
               cache.misses());
    RANK_CHECK(cache.classHits() == counts.size() - 1, "size-class hits: %zu", cache.classHits());
    RANK_CHECK(cache.size() == 1, "the cache holds %zu plans", cache.size());
    // The same counts again: exact hits.
    std::vector<float> out(4097);
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), 4097, ncclFloat32, ncclSum, comm, nullptr));
    RANK_TRY(checkSum(out, nranks));
    RANK_CHECK(cache.hits() == 1, "exact hits: %zu", cache.hits());
    // All-gather's blocks are placed by the call's count too.
    for (size_t c : {size_t{5}, size_t{3000}, size_t{1}}) {
      std::vector<float> all(c * nranks, -1), mine(c);
      for (size_t i = 0; i < c; ++i) mine[i] = static_cast<float>(rank * 100000 + i);
      RANK_NCCL(ncclAllGather(mine.data(), all.data(), c, ncclFloat32, comm, nullptr));
      for (int r = 0; r < nranks; ++r)
        for (size_t i = 0; i < c; ++i)
          RANK_CHECK(all[r * c + i] == static_cast<float>(r * 100000 + i),
                     "all-gather of %zu: element %zu of rank %d is %g", c, i, r, all[r * c + i]);
    }
    RANK_CHECK(cache.misses() == 2, "all-gather counts built %zu plans (one expected)",
               cache.misses() - 1);
    return "";
  });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

// The tree's plans are size-free too (a loop whose broadcast steps lag the reduction): the
// communicator builds one plan per selection (channels, chunk), not one per count.
TEST(EnginePlanCache, TreePlansAreBuiltPerSelectionNotPerCount) {
  EnvGuard algo("NCCL_ALGO", "Tree");
  auto f = runRanks(Mode::kThreads, 4, [](int rank, int nranks, ncclComm_t comm) -> std::string {
    loom::PlanCache& cache = comm->core->planCache();
    const std::vector<size_t> counts = {1000, 999, 7, 200000, 1, 4097, 65536, 123457};
    std::vector<float> in = input(rank, 200000);
    std::vector<std::pair<int, size_t>> shapes;  // distinct (channels, chunk) selected
    for (size_t c : counts) {
      loom::Selection sel =
          loom::select({loom::Collective::kAllReduce, c, 4, 0}, comm->core->planContext());
      RANK_CHECK(sel.algorithm == loom::Algorithm::kTree, "NCCL_ALGO=Tree selected %s",
                 loom::algorithmName(sel.algorithm));
      std::pair<int, size_t> shape{sel.channels, sel.chunkBytes};
      if (std::find(shapes.begin(), shapes.end(), shape) == shapes.end()) shapes.push_back(shape);
      std::vector<float> out(c, -1);
      RANK_NCCL(ncclAllReduce(in.data(), out.data(), c, ncclFloat32, ncclSum, comm, nullptr));
      RANK_TRY(checkSum(out, nranks));
    }
    RANK_CHECK(shapes.size() < counts.size(), "every count selected its own shape");
    RANK_CHECK(cache.misses() == shapes.size(), "%zu counts of %zu selections built %zu plans",
               counts.size(), shapes.size(), cache.misses());
    RANK_CHECK(cache.classHits() == counts.size() - shapes.size(), "size-class hits: %zu",
               cache.classHits());
    return "";
  });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

TEST(EnginePlanCache, StaysBoundedWhenEveryCallHasANewSize) {
  auto f = runRanks(Mode::kThreads, 2, [](int rank, int nranks, ncclComm_t comm) -> std::string {
    loom::PlanCache& cache = comm->core->planCache();
    size_t n = loom::PlanCache::kCapacity + 40;
    std::vector<float> in = input(rank, n), out(n);
    for (size_t c = 1; c <= n; ++c)
      RANK_NCCL(ncclAllReduce(in.data(), out.data(), c, ncclFloat32, ncclSum, comm, nullptr));
    RANK_CHECK(cache.size() <= loom::PlanCache::kCapacity, "cache holds %zu plans", cache.size());
    RANK_TRY(checkSum(out, nranks));
    return "";
  });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

// #seq used to advance only when COLL logging was on (a side effect inside the log
// macro's arguments), so logs and error messages disagreed.
TEST(EngineSeq, LoggedOpCountsAreTheSequenceNumbers) {
  char path[] = "/tmp/loom-seq-log-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    EnvGuard level("NCCL_DEBUG", "INFO"), subsys("NCCL_DEBUG_SUBSYS", "COLL"),
        file("NCCL_DEBUG_FILE", path);
    loom::logReset();
    auto f = runRanks(Mode::kThreads, 2, [](int rank, int, ncclComm_t comm) -> std::string {
      std::vector<float> in = input(rank, 64), out(64);
      for (int i = 0; i < 3; ++i)
        RANK_NCCL(ncclAllReduce(in.data(), out.data(), 64, ncclFloat32, ncclSum, comm, nullptr));
      uint64_t next = comm->core->nextSeq();
      RANK_CHECK(next == 4, "after 3 operations the next sequence number is %llu, not 4",
                 static_cast<unsigned long long>(next));
      return "";
    });
    EXPECT_TRUE(f.empty()) << joinFailures(f);
  }
  loom::logReset();
  std::ifstream log(path);
  std::string line, all;
  std::vector<int> counts;
  std::regex re("\\[0\\] NCCL INFO AllReduce: opCount (\\d+)");
  while (std::getline(log, line)) {
    all += line + "\n";
    std::smatch m;
    if (std::regex_search(line, m, re)) counts.push_back(std::stoi(m[1]));
  }
  unlink(path);
  EXPECT_EQ(counts, (std::vector<int>{1, 2, 3})) << all;
}

TEST(EngineAsync, WorksCompleteInIssueOrderWithExactResults) {
  auto f = runRanks(Mode::kThreads, 3, [](int rank, int nranks, ncclComm_t comm) -> std::string {
    constexpr int kOps = 6;
    constexpr size_t kCount = 300000;  // several FIFO steps per rank
    std::vector<std::vector<float>> in, out;
    std::vector<std::shared_ptr<loom::Work>> works;
    for (int i = 0; i < kOps; ++i) {
      in.push_back(input(rank, kCount, static_cast<float>(i)));
      out.emplace_back(kCount, -1.0f);
    }
    for (int i = 0; i < kOps; ++i)
      works.push_back(loom::enqueue(std::vector<loom::Op>{hostAllReduce(comm, in[i].data(), out[i].data(), kCount)},
                                    loom::Completion::kAsync));
    // A call that completes before returning runs after the queued ones.
    std::vector<float> syncIn = input(rank, 1000, 7), syncOut(1000);
    RANK_NCCL(ncclAllReduce(syncIn.data(), syncOut.data(), 1000, ncclFloat32, ncclSum, comm, nullptr));
    for (int i = 0; i < kOps; ++i)
      RANK_CHECK(works[i]->test(), "async work %d not complete after a later blocking call", i);
    RANK_TRY(checkSum(syncOut, nranks, 7));
    for (int i = 0; i < kOps; ++i) {
      works[i]->wait();
      RANK_TRY(checkSum(out[i], nranks, static_cast<float>(i)));
    }
    return "";
  });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

TEST(EngineAsync, WaitReturnsWhileTheCallerKeepsControl) {
  auto f = runRanks(Mode::kThreads, 2, [](int rank, int nranks, ncclComm_t comm) -> std::string {
    std::vector<float> in = input(rank, 4096), out(4096);
    // Same shape first: the connections exist, so the launch below has nothing to set up.
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), 4096, ncclFloat32, ncclSum, comm, nullptr));
    // Rank 1 launches late: rank 0's launch must return at once and its work wait for it.
    if (rank == 1) usleep(200000);
    auto work = loom::enqueue(std::vector<loom::Op>{hostAllReduce(comm, in.data(), out.data(), 4096)},
                              loom::Completion::kAsync);
    if (rank == 0) RANK_CHECK(!work->test(), "work completed before its peer joined");
    work->wait();
    RANK_CHECK(work->test(), "test() false after wait()");
    return checkSum(out, nranks);
  });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

TEST(EngineAsync, AbortFailsAQueuedWork) {
  std::atomic<bool> done{false};
  auto f = runRanks(Mode::kThreads, 2, [&](int rank, int, ncclComm_t comm) -> std::string {
    std::vector<float> in = input(rank, 64), out(64);
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), 64, ncclFloat32, ncclSum, comm, nullptr));
    if (rank == 1) {  // does not join the second all-reduce: rank 0's can only end by abort
      while (!done.load()) usleep(1000);
      return "";
    }
    struct Done {
      std::atomic<bool>& d;
      ~Done() { d.store(true); }
    } signal{done};
    auto work = loom::enqueue(std::vector<loom::Op>{hostAllReduce(comm, in.data(), out.data(), 64)},
                              loom::Completion::kAsync);
    usleep(100000);
    RANK_CHECK(!work->test(), "work completed without its peer");
    comm->abortFlag.store(true);
    try {
      work->wait();
    } catch (const loom::Error& e) {
      RANK_CHECK(std::string(e.what()).find("aborted") != std::string::npos,
                 "unexpected error: %s", e.what());
      comm->abortFlag.store(false);  // let the harness destroy it normally
      return "";
    }
    return "wait() returned normally after an abort";
  });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

TEST(EngineAsync, OneLaunchMayNotSpanCommunicators) {
  std::vector<ncclComm_t> comms(2);
  ASSERT_EQ(ncclCommInitAll(comms.data(), 2, nullptr), ncclSuccess);
  std::vector<float> a(8, 1), b(8, 1);
  std::vector<loom::Op> ops = {hostAllReduce(comms[0], a.data(), a.data(), 8),
                               hostAllReduce(comms[1], b.data(), b.data(), 8)};
  try {
    loom::enqueue(ops, loom::Completion::kAsync);
    ADD_FAILURE() << "an asynchronous launch over two communicators was accepted";
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.code(), loom::Code::kInvalidUsage);
    EXPECT_NE(std::string(e.what()).find("2 communicators"), std::string::npos) << e.what();
  }
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// ncclGroupSimulateEnd prices a group with the cost model and runs nothing.
TEST(EngineSimulate, GroupSimulateEndPricesWithoutRunning) {
  auto f = runRanks(Mode::kThreads, 2, [](int rank, int, ncclComm_t comm) -> std::string {
    auto price = [&](size_t count, int calls, std::vector<float>* out) -> float {
      std::vector<float> in = input(rank, count);
      ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
      if (ncclGroupStart() != ncclSuccess) return -1;
      for (int i = 0; i < calls; ++i)
        if (ncclAllReduce(in.data(), out->data(), count, ncclFloat32, ncclSum, comm, nullptr) != ncclSuccess)
          return -1;
      if (ncclGroupSimulateEnd(&info) != ncclSuccess) return -1;
      return info.estimatedTime;
    };
    std::vector<float> out(1 << 20, -7.0f);
    float small = price(2, 1, &out), big = price(1 << 20, 1, &out), twice = price(1 << 20, 2, &out);
    RANK_CHECK(small > 0, "an 8-byte all-reduce priced %g us", small);
    RANK_CHECK(big > small, "4 MiB priced %g us, no more than 8 B (%g us)", big, small);
    RANK_CHECK(twice > 1.9f * big && twice < 2.1f * big, "two 4 MiB all-reduces priced %g us, one %g us",
               twice, big);
    for (float v : out) RANK_CHECK(v == -7.0f, "a simulated group wrote the receive buffer");
    // The communicator still works, and an empty group costs nothing.
    ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclGroupSimulateEnd(&info));
    RANK_CHECK(info.estimatedTime == 0.0f, "an empty group priced %g us", info.estimatedTime);
    std::vector<float> in = input(rank, 1000), res(1000);
    RANK_NCCL(ncclAllReduce(in.data(), res.data(), 1000, ncclFloat32, ncclSum, comm, nullptr));
    res.resize(1000);
    return checkSum(res, 2);
  });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

TEST(EngineSimulate, GroupSimulateEndRejectsBadArguments) {
  EXPECT_EQ(ncclGroupSimulateEnd(nullptr), ncclInvalidArgument);
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_EQ(ncclGroupSimulateEnd(&info), ncclInvalidUsage);  // no ncclGroupStart
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("ncclGroupStart"), std::string::npos);
  info.magic = 0;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(&info), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("NCCL_SIM_INFO_INITIALIZER"), std::string::npos);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);  // the bad call did not close the group
}

}  // namespace
}  // namespace loomtest
