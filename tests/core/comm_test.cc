// Communicator creation and management: ncclCommInitAll and several ranks per thread in a
// group, non-blocking init, ncclCommSplit, several live communicators, the scalable init,
// the query functions, and NCCL_COMM_ID rendezvous (IPv4 and IPv6).
#include <nccl.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/core_util.h"

namespace loomtest {
namespace {

// Rank r contributes 2^r * (i % 1000), so a sum names exactly the ranks that took part;
// the count spans several FIFO slots.
constexpr size_t kCount = 100003;
void fillRank(std::vector<int32_t>& v, int rank) {
  v.resize(kCount);
  for (size_t i = 0; i < kCount; ++i) v[i] = (1 << rank) * static_cast<int32_t>(i % 1000);
}
std::string checkSum(const std::vector<int32_t>& v, int32_t rankFactorSum, const char* what) {
  for (size_t i = 0; i < kCount; ++i)
    RANK_CHECK(v[i] == rankFactorSum * static_cast<int32_t>(i % 1000), "%s: [%zu] = %d, want %d",
               what, i, v[i], rankFactorSum * static_cast<int32_t>(i % 1000));
  return "";
}
// The factor when ranks 0..n-1 all contribute.
int32_t allOf(int n) { return (1 << n) - 1; }

// Runs `nranks` ranks from this one thread: each step over all of them inside a group.
std::string driveRanksInGroup(const std::vector<ncclComm_t>& comms, const std::vector<int>& ranks,
                              int nranks) {
  size_t k = comms.size();
  std::vector<std::vector<int32_t>> in(k), out(k);
  for (size_t j = 0; j < k; ++j) {
    fillRank(in[j], ranks[j]);
    out[j].assign(kCount, -1);
  }
  RANK_NCCL(ncclGroupStart());
  for (size_t j = 0; j < k; ++j)
    RANK_NCCL(ncclAllReduce(in[j].data(), out[j].data(), kCount, ncclInt32, ncclSum, comms[j], nullptr));
  RANK_NCCL(ncclGroupEnd());
  for (size_t j = 0; j < k; ++j) RANK_TRY(checkSum(out[j], allOf(nranks), "all-reduce"));
  return "";
}

class CommTransportTest : public testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    if (GetParam() == Transport::kSocket) shmOff_.emplace("NCCL_SHM_DISABLE", "1");
  }
  std::optional<EnvGuard> shmOff_;
  EnvGuard stallLimit_{"LOOM_TIMEOUT", "60"};
};

TEST_P(CommTransportTest, InitAllDrivenByOneThread) {
  std::vector<ncclComm_t> comms(4, nullptr);
  ASSERT_EQ(ncclCommInitAll(comms.data(), 4, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  for (int i = 0; i < 4; ++i) {
    int count = -1, rank = -1, dev = -2;
    ASSERT_EQ(ncclCommCount(comms[i], &count), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(comms[i], &rank), ncclSuccess);
    ASSERT_EQ(ncclCommCuDevice(comms[i], &dev), ncclSuccess);
    EXPECT_EQ(count, 4);
    EXPECT_EQ(rank, i);
    EXPECT_EQ(dev, i) << "without a devlist, comm i is device i";
  }
  std::string err = driveRanksInGroup(comms, {0, 1, 2, 3}, 4);
  EXPECT_EQ(err, "");
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);

  // With a devlist, each comm reports its device.
  const int devs[3] = {5, 3, 1};
  ASSERT_EQ(ncclCommInitAll(comms.data(), 3, devs), ncclSuccess) << ncclGetLastError(nullptr);
  for (int i = 0; i < 3; ++i) {
    int dev = -2;
    ASSERT_EQ(ncclCommCuDevice(comms[i], &dev), ncclSuccess);
    EXPECT_EQ(dev, devs[i]);
  }
  comms.resize(3);
  EXPECT_EQ(driveRanksInGroup(comms, {0, 1, 2}, 3), "");
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// nccl-tests' -g N: each process (or thread) initializes several ranks inside one group
// and drives them from its one thread.
std::string initRanksInGroup(const ncclUniqueId& id, int firstRank, int perWorker, int nranks) {
  std::vector<ncclComm_t> comms(perWorker, nullptr);
  std::vector<int> ranks(perWorker);
  RANK_NCCL(ncclGroupStart());
  for (int j = 0; j < perWorker; ++j) {
    ranks[j] = firstRank + j;
    RANK_NCCL(ncclCommInitRank(&comms[j], nranks, id, ranks[j]));
  }
  RANK_NCCL(ncclGroupEnd());
  for (int j = 0; j < perWorker; ++j) {
    int r = -1;
    RANK_NCCL(ncclCommUserRank(comms[j], &r));
    RANK_CHECK(r == ranks[j], "comm %d is rank %d, expected %d", j, r, ranks[j]);
  }
  std::string err = driveRanksInGroup(comms, ranks, nranks);
  // Twice: connections made by the first group are reused.
  if (err.empty()) err = driveRanksInGroup(comms, ranks, nranks);
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  return err;
}

TEST_P(CommTransportTest, SeveralRanksPerThreadInitInGroup) {
  EnvGuard bound("LOOM_BOOTSTRAP_TIMEOUT", "60");
  ncclUniqueId id;
  // One thread with 4 ranks; 2 threads with 2 each; 2 processes with 2 each.
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  EXPECT_EQ(initRanksInGroup(id, 0, 4, 4), "");
  for (Mode mode : {Mode::kThreads, Mode::kProcesses}) {
    LateId late;  // made once the workers have started
    auto f = runEach(
        mode, 2,
        [&](int w, int) {
          ncclUniqueId joined;
          RANK_TRY(late.wait(&joined));
          return initRanksInGroup(joined, 2 * w, 2, 4);
        },
        120, [&] { return makeId(late); });
    EXPECT_TRUE(f.empty()) << modeName(mode) << ": " << joinFailures(f);
  }
}

INSTANTIATE_TEST_SUITE_P(Core, CommTransportTest,
                         testing::Values(Transport::kShm, Transport::kSocket),
                         [](const testing::TestParamInfo<Transport>& i) {
                           return std::string(transportName(i.param));
                         });

class CommTest : public CoreTest {};

TEST_P(CommTest, NonBlockingInit) {
  LateId late;  // made once the ranks have started
  auto f = runEach(mode(), nranks(), [&](int rank, int nranks) {
    ncclUniqueId id;
    RANK_TRY(late.wait(&id));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
    RANK_CHECK(r == ncclInProgress || r == ncclSuccess, "init returned %s: %s",
               ncclGetErrorString(r), ncclGetLastError(nullptr));
    RANK_CHECK(comm != nullptr, "no communicator handle while the init is in progress");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) {
      RANK_NCCL(ncclCommGetAsyncError(comm, &state));
      RANK_CHECK(std::chrono::steady_clock::now() < deadline, "init still in progress after 60 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    RANK_CHECK(state == ncclSuccess, "async init failed: %s: %s", ncclGetErrorString(state),
               ncclGetLastError(comm));
    std::vector<int32_t> in, out(kCount, -1);
    fillRank(in, rank);
    r = ncclAllReduce(in.data(), out.data(), kCount, ncclInt32, ncclSum, comm, nullptr);
    while (r == ncclInProgress) RANK_NCCL(ncclCommGetAsyncError(comm, &r));
    RANK_CHECK(r == ncclSuccess, "all-reduce: %s: %s", ncclGetErrorString(r), ncclGetLastError(comm));
    RANK_TRY(checkSum(out, allOf(nranks), "all-reduce on a non-blocking comm"));
    RANK_NCCL(ncclCommDestroy(comm));
    return std::string();
  }, 120, [&] { return makeId(late); });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

TEST_P(CommTest, SplitEvenOddWithReversedKeysAndNoColor) {
  run([](int rank, int nranks, ncclComm_t comm) {
    ncclComm_t sub = nullptr;
    // Keys reverse the order: the highest old rank becomes new rank 0.
    RANK_NCCL(ncclCommSplit(comm, rank % 2, nranks - rank, &sub, nullptr));
    RANK_CHECK(sub != nullptr, "no sub-communicator");
    int members = 0, higher = 0;
    int32_t sumFactor = 0;
    for (int r = rank % 2; r < nranks; r += 2) {
      ++members;
      higher += r > rank;
      sumFactor += 1 << r;
    }
    int subCount = -1, subRank = -1;
    RANK_NCCL(ncclCommCount(sub, &subCount));
    RANK_NCCL(ncclCommUserRank(sub, &subRank));
    RANK_CHECK(subCount == members, "color %d has %d ranks, expected %d", rank % 2, subCount, members);
    RANK_CHECK(subRank == higher, "new rank %d, expected %d (keys reverse the order)", subRank, higher);
    // Each member contributes by its old rank, so the sum shows who took part.
    std::vector<int32_t> in, out(kCount, -1);
    fillRank(in, rank);
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), kCount, ncclInt32, ncclSum, sub, nullptr));
    RANK_TRY(checkSum(out, sumFactor, "all-reduce on the even/odd split"));

    // Rank 0 opts out; the others form one communicator of nranks - 1.
    ncclComm_t rest = reinterpret_cast<ncclComm_t>(0x1);
    RANK_NCCL(ncclCommSplit(comm, rank == 0 ? NCCL_SPLIT_NOCOLOR : 7, rank, &rest, nullptr));
    if (rank == 0) {
      RANK_CHECK(rest == nullptr, "NCCL_SPLIT_NOCOLOR returned a communicator");
    } else {
      RANK_CHECK(rest != nullptr, "no communicator for color 7");
      int c = -1, r = -1;
      RANK_NCCL(ncclCommCount(rest, &c));
      RANK_NCCL(ncclCommUserRank(rest, &r));
      RANK_CHECK(c == nranks - 1 && r == rank - 1, "rank %d of %d, expected %d of %d", r, c,
                 rank - 1, nranks - 1);
      RANK_NCCL(ncclAllReduce(in.data(), out.data(), kCount, ncclInt32, ncclSum, rest, nullptr));
      RANK_TRY(checkSum(out, allOf(nranks) - 1, "all-reduce without rank 0"));  // all but 2^0
      RANK_NCCL(ncclCommDestroy(rest));
    }
    // The parent still works after its children came and went.
    RANK_NCCL(ncclCommDestroy(sub));
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), kCount, ncclInt32, ncclSum, comm, nullptr));
    return checkSum(out, allOf(nranks), "all-reduce on the parent");
  });
}

// Three communicators over the same ranks, used in an interleaved order, and one group
// spanning two of them.
TEST_P(CommTest, SeveralCommunicatorsInterleaved) {
  run([](int rank, int nranks, ncclComm_t comm) {
    ncclComm_t same = nullptr, reversed = nullptr;
    RANK_NCCL(ncclCommSplit(comm, 0, rank, &same, nullptr));
    RANK_NCCL(ncclCommSplit(comm, 0, -rank, &reversed, nullptr));
    int rr = -1;
    RANK_NCCL(ncclCommUserRank(reversed, &rr));
    RANK_CHECK(rr == nranks - 1 - rank, "reversed comm: rank %d, expected %d", rr, nranks - 1 - rank);
    ncclComm_t order[] = {reversed, comm, same, reversed, same, comm};
    std::vector<int32_t> in, out(kCount);
    for (int k = 0; k < 6; ++k) {
      fillRank(in, rank + k);  // factor 2^(rank + k): sum = 2^k * allOf(n)
      out.assign(kCount, -1);
      RANK_NCCL(ncclAllReduce(in.data(), out.data(), kCount, ncclInt32, ncclSum, order[k], nullptr));
      RANK_TRY(checkSum(out, allOf(nranks) << k, "interleaved all-reduce"));
    }
    // Broadcast on one comm and all-reduce on another in one group.
    std::vector<int32_t> bc(kCount, rank == nranks - 1 ? 77 : -1);
    fillRank(in, rank);
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclBroadcast(bc.data(), bc.data(), kCount, ncclInt32, 0, reversed, nullptr));
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), kCount, ncclInt32, ncclSum, same, nullptr));
    RANK_NCCL(ncclGroupEnd());
    RANK_TRY(checkSum(out, allOf(nranks), "grouped all-reduce"));
    for (size_t i = 0; i < kCount; ++i)
      RANK_CHECK(bc[i] == 77, "broadcast from reversed-comm root (old rank %d): [%zu] = %d",
                 nranks - 1, i, bc[i]);
    RANK_NCCL(ncclCommDestroy(same));
    RANK_NCCL(ncclCommDestroy(reversed));
    return std::string();
  });
}

TEST_P(CommTest, QueriesAndFinalize) {
  run([](int rank, int nranks, ncclComm_t comm) {
    int count = -1, r = -1, dev = -2;
    RANK_NCCL(ncclCommCount(comm, &count));
    RANK_NCCL(ncclCommUserRank(comm, &r));
    RANK_NCCL(ncclCommCuDevice(comm, &dev));
    RANK_CHECK(count == nranks && r == rank, "rank %d of %d, expected %d of %d", r, count, rank, nranks);
    RANK_CHECK(dev == -1, "a host-memory communicator reports CUDA device %d (expected -1)", dev);
    ncclResult_t state = ncclInProgress;
    RANK_NCCL(ncclCommGetAsyncError(comm, &state));
    RANK_CHECK(state == ncclSuccess, "async error %d on a healthy communicator", state);
    // Finalize, then destroy (the harness destroys it).
    RANK_NCCL(ncclCommFinalize(comm));
    return std::string();
  });
}

TEST_P(CommTest, InitRankScalableWithTwoIds) {
  LateId late[2];  // made once the ranks have started
  auto f = runEach(mode(), nranks(), [&](int rank, int nranks) {
    ncclUniqueId ids[2];
    RANK_TRY(late[0].wait(&ids[0]));
    RANK_TRY(late[1].wait(&ids[1]));
    ncclComm_t comm = nullptr;
    RANK_NCCL(ncclCommInitRankScalable(&comm, nranks, rank, 2 > nranks ? nranks : 2, ids, nullptr));
    int c = -1, r = -1;
    RANK_NCCL(ncclCommCount(comm, &c));
    RANK_NCCL(ncclCommUserRank(comm, &r));
    RANK_CHECK(c == nranks && r == rank, "rank %d of %d", r, c);
    std::vector<int32_t> in, out(kCount, -1);
    fillRank(in, rank);
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), kCount, ncclInt32, ncclSum, comm, nullptr));
    RANK_TRY(checkSum(out, allOf(nranks), "all-reduce"));
    RANK_NCCL(ncclCommDestroy(comm));
    return std::string();
  }, 120, [&] { return makeId(late[0]) + makeId(late[1]); });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

INSTANTIATE_TEST_SUITE_P(Core, CommTest, testing::ValuesIn(reducedMatrix()), coreParamName);

// NCCL_COMM_ID: every process sets it itself and asks ncclGetUniqueId, which encodes the
// fixed address; rank 0's init runs the root there. Then a split (whose children must get
// fresh roots, not the fixed address) and an all-reduce on it.
std::string commIdRank(const std::string& commId, int rank, int nranks) {
  setenv("NCCL_COMM_ID", commId.c_str(), 1);
  ncclUniqueId id;
  RANK_NCCL(ncclGetUniqueId(&id));
  ncclComm_t comm = nullptr;
  RANK_NCCL(ncclCommInitRank(&comm, nranks, id, rank));
  std::vector<int32_t> in, out(kCount, -1);
  fillRank(in, rank);
  RANK_NCCL(ncclAllReduce(in.data(), out.data(), kCount, ncclInt32, ncclSum, comm, nullptr));
  RANK_TRY(checkSum(out, allOf(nranks), "all-reduce"));
  ncclComm_t sub = nullptr;
  RANK_NCCL(ncclCommSplit(comm, 0, rank, &sub, nullptr));
  out.assign(kCount, -1);
  RANK_NCCL(ncclAllReduce(in.data(), out.data(), kCount, ncclInt32, ncclSum, sub, nullptr));
  RANK_TRY(checkSum(out, allOf(nranks), "all-reduce on a split"));
  RANK_NCCL(ncclCommDestroy(sub));
  RANK_NCCL(ncclCommDestroy(comm));
  return "";
}

TEST(CoreCommId, Ipv4Loopback) {
  int port = freePort("127.0.0.1");
  ASSERT_NE(port, 0);
  std::string commId = "127.0.0.1:" + std::to_string(port);
  auto f = runEach(Mode::kProcesses, 4, [&](int rank, int n) { return commIdRank(commId, rank, n); });
  EXPECT_TRUE(f.empty()) << "NCCL_COMM_ID=" << commId << "\n" << joinFailures(f);
}

TEST(CoreCommId, Ipv6Loopback) {
  if (!haveIpv6Loopback()) GTEST_SKIP() << "no ::1 on this machine's loopback";
  int port = freePort("::1");
  ASSERT_NE(port, 0);
  std::string commId = "[::1]:" + std::to_string(port);
  auto f = runEach(Mode::kProcesses, 3, [&](int rank, int n) { return commIdRank(commId, rank, n); });
  EXPECT_TRUE(f.empty()) << "NCCL_COMM_ID=" << commId << "\n" << joinFailures(f);
}

// Threads of one process with NCCL_COMM_ID set before they start.
TEST(CoreCommId, Ipv4LoopbackThreads) {
  int port = freePort("127.0.0.1");
  ASSERT_NE(port, 0);
  EnvGuard env("NCCL_COMM_ID", ("127.0.0.1:" + std::to_string(port)).c_str());
  auto f = runRanks(Mode::kThreads, 3, [](int rank, int nranks, ncclComm_t comm) {
    std::vector<int32_t> in, out(kCount, -1);
    fillRank(in, rank);
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), kCount, ncclInt32, ncclSum, comm, nullptr));
    return checkSum(out, allOf(nranks), "all-reduce");
  });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

}  // namespace
}  // namespace loomtest
