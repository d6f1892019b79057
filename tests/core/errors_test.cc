// Errors at the C boundary: bad arguments return ncclInvalidArgument with a message that
// names the problem (ncclGetLastError, per thread and per communicator), misuse returns
// ncclInvalidUsage, nothing crashes or hangs; mismatched counts across ranks are reported.
#include <nccl.h>

#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <string>
#include <vector>

#include "core/core_util.h"

namespace loomtest {
namespace {

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// Expects `r` to be `want` and the thread's last error to mention `what`.
#define EXPECT_ERR(call, want, what)                                                       \
  do {                                                                                     \
    ncclResult_t r_ = (call);                                                              \
    std::string msg_ = ncclGetLastError(nullptr);                                          \
    EXPECT_EQ(r_, want) << #call << ": " << msg_;                                          \
    EXPECT_TRUE(contains(msg_, what)) << #call << ": message '" << msg_ << "' does not mention '" \
                                      << what << "'";                                      \
  } while (0)

// A one-rank communicator (no peers: fast) for argument checks.
class CoreErrors : public testing::Test {
 protected:
  void SetUp() override {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ASSERT_EQ(ncclCommInitRank(&comm_, 1, id, 0), ncclSuccess) << ncclGetLastError(nullptr);
  }
  void TearDown() override {
    if (comm_) {
      EXPECT_EQ(ncclCommDestroy(comm_), ncclSuccess);
    }
  }
  ncclComm_t comm_ = nullptr;
  float a_[16] = {}, b_[16] = {};
};

TEST_F(CoreErrors, NullCommunicator) {
  EXPECT_ERR(ncclAllReduce(a_, b_, 4, ncclFloat, ncclSum, nullptr, nullptr), ncclInvalidArgument,
             "comm");
  EXPECT_ERR(ncclBroadcast(a_, b_, 4, ncclFloat, 0, nullptr, nullptr), ncclInvalidArgument, "comm");
  EXPECT_ERR(ncclSend(a_, 4, ncclFloat, 0, nullptr, nullptr), ncclInvalidArgument, "comm");
  int n = 0;
  EXPECT_ERR(ncclCommCount(nullptr, &n), ncclInvalidArgument, "comm");
  EXPECT_ERR(ncclCommCount(comm_, nullptr), ncclInvalidArgument, "count");
  EXPECT_ERR(ncclCommUserRank(comm_, nullptr), ncclInvalidArgument, "rank");
  EXPECT_ERR(ncclCommCuDevice(comm_, nullptr), ncclInvalidArgument, "device");
  EXPECT_ERR(ncclCommGetAsyncError(comm_, nullptr), ncclInvalidArgument, "asyncError");
}

TEST_F(CoreErrors, NullBuffersWithCount) {
  EXPECT_ERR(ncclAllReduce(nullptr, b_, 4, ncclFloat, ncclSum, comm_, nullptr), ncclInvalidArgument,
             "sendbuff");
  EXPECT_ERR(ncclAllReduce(a_, nullptr, 4, ncclFloat, ncclSum, comm_, nullptr), ncclInvalidArgument,
             "recvbuff");
  EXPECT_ERR(ncclAllGather(nullptr, b_, 4, ncclFloat, comm_, nullptr), ncclInvalidArgument, "sendbuff");
  EXPECT_ERR(ncclReduceScatter(a_, nullptr, 4, ncclFloat, ncclSum, comm_, nullptr),
             ncclInvalidArgument, "recvbuff");
  EXPECT_ERR(ncclRecv(nullptr, 4, ncclFloat, 0, comm_, nullptr), ncclInvalidArgument, "recvbuff");
  // The per-communicator error names it too.
  EXPECT_TRUE(contains(ncclGetLastError(comm_), "recvbuff")) << ncclGetLastError(comm_);
  // Count 0 with NULL buffers is a valid no-op.
  EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, comm_, nullptr), ncclSuccess);
}

TEST_F(CoreErrors, BadDatatypeAndOp) {
  auto badType = static_cast<ncclDataType_t>(99);
  auto badOp = static_cast<ncclRedOp_t>(99);
  EXPECT_ERR(ncclAllReduce(a_, b_, 4, badType, ncclSum, comm_, nullptr), ncclInvalidArgument,
             "datatype 99");
  EXPECT_ERR(ncclBroadcast(a_, b_, 4, badType, 0, comm_, nullptr), ncclInvalidArgument, "datatype");
  EXPECT_ERR(ncclSend(a_, 4, static_cast<ncclDataType_t>(-1), 0, comm_, nullptr),
             ncclInvalidArgument, "datatype");
  EXPECT_ERR(ncclAllReduce(a_, b_, 4, ncclFloat, badOp, comm_, nullptr), ncclInvalidArgument,
             "op 99");
  EXPECT_ERR(ncclReduce(a_, b_, 4, ncclFloat, static_cast<ncclRedOp_t>(-3), 0, comm_, nullptr),
             ncclInvalidArgument, "op");
  EXPECT_TRUE(contains(ncclGetLastError(comm_), "op")) << ncclGetLastError(comm_);
  // A PreMulSum op is bound to its data type.
  float scalar = 2;
  ncclRedOp_t op;
  ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm_),
            ncclSuccess);
  EXPECT_ERR(ncclAllReduce(a_, b_, 2, ncclFloat64, op, comm_, nullptr), ncclInvalidArgument,
             "datatype");
  EXPECT_EQ(ncclRedOpDestroy(op, comm_), ncclSuccess);
  EXPECT_ERR(ncclRedOpDestroy(op, comm_), ncclInvalidArgument, "op");
}

TEST_F(CoreErrors, RootAndPeerOutOfRange) {
  EXPECT_ERR(ncclBroadcast(a_, b_, 4, ncclFloat, 1, comm_, nullptr), ncclInvalidArgument, "root 1");
  EXPECT_ERR(ncclReduce(a_, b_, 4, ncclFloat, ncclSum, -1, comm_, nullptr), ncclInvalidArgument,
             "root -1");
  EXPECT_ERR(ncclGather(a_, b_, 4, ncclFloat, 5, comm_, nullptr), ncclInvalidArgument, "root 5");
  EXPECT_ERR(ncclScatter(a_, b_, 4, ncclFloat, 2, comm_, nullptr), ncclInvalidArgument, "root 2");
  EXPECT_ERR(ncclSend(a_, 4, ncclFloat, 1, comm_, nullptr), ncclInvalidArgument, "peer 1");
  EXPECT_ERR(ncclRecv(b_, 4, ncclFloat, -2, comm_, nullptr), ncclInvalidArgument, "peer -2");
}

TEST(CoreErrorsInit, BadRankCounts) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = reinterpret_cast<ncclComm_t>(0x1);
  EXPECT_ERR(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument, "nranks=0");
  EXPECT_EQ(comm, nullptr) << "a failed init must leave *comm NULL";
  EXPECT_ERR(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument, "rank=2");
  EXPECT_ERR(ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument, "rank=-1");
  EXPECT_ERR(ncclCommInitRank(nullptr, 2, id, 0), ncclInvalidArgument, "NULL");
  std::vector<ncclComm_t> comms(2);
  EXPECT_ERR(ncclCommInitAll(comms.data(), 0, nullptr), ncclInvalidArgument, "ndev=0");
  EXPECT_ERR(ncclCommInitAll(nullptr, 2, nullptr), ncclInvalidArgument, "comms");
}

TEST(CoreErrorsInit, UniqueIdNotFromGetUniqueId) {
  ncclUniqueId zero;
  memset(&zero, 0, sizeof(zero));
  ncclComm_t comm = nullptr;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_ERR(ncclCommInitRank(&comm, 2, zero, 0), ncclInvalidArgument, "ncclUniqueId");
  EXPECT_EQ(comm, nullptr);
  ncclUniqueId junk;
  for (size_t i = 0; i < sizeof(junk.internal); ++i) junk.internal[i] = static_cast<char>(i * 37 + 1);
  EXPECT_ERR(ncclCommInitRank(&comm, 1, junk, 0), ncclInvalidArgument, "ncclUniqueId");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << "rejecting must not wait";
}

TEST(CoreErrorsInit, BadConfig) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 0;
  ncclComm_t comm = nullptr;
  EXPECT_ERR(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument,
             "NCCL_CONFIG_INITIALIZER");
  config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 5;
  EXPECT_ERR(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument, "blocking=5");
}

// A program built with newer NCCL headers (torch 2.15 has NCCL 2.30's) passes a longer config
// of a newer version: read as far as NCCL 2.28.9's fields, as an older NCCL reads it. A
// config of NCCL < 2.14 had no blocking field: its value is not read.
TEST(CoreErrorsInit, ConfigsOfNewerAndOlderHeadersAreRead) {
  struct Newer {
    ncclConfig_t known;
    int later[8];  // fields NCCL 2.28.9 does not have
  } newer;
  newer.known = NCCL_CONFIG_INITIALIZER;
  newer.known.size = sizeof(Newer);
  newer.known.version = NCCL_VERSION(2, 30, 7);
  newer.known.blocking = 0;
  newer.known.commName = "newer";
  for (int& v : newer.later) v = -7;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, 1, id, 0, &newer.known);
  ASSERT_TRUE(rc == ncclSuccess || rc == ncclInProgress) << ncclGetLastError(nullptr);
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  ASSERT_EQ(state, ncclSuccess) << ncclGetLastError(comm);
  EXPECT_EQ(rc, ncclInProgress) << "blocking=0 was read: the init is non-blocking";
  int32_t v = 5;
  ASSERT_EQ(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
  EXPECT_EQ(v, 5);
  ASSERT_EQ(ncclCommDestroy(comm), ncclSuccess);

  ncclConfig_t old = NCCL_CONFIG_INITIALIZER;
  old.version = NCCL_VERSION(2, 13, 0);
  old.blocking = 0;  // not a field of that version: the init blocks
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &old), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(CoreErrorsUsage, GroupEndWithoutStart) {
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");
  // Balanced groups still work afterwards.
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
}

TEST(CoreErrorsUsage, UseAfterDestroy) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  ASSERT_EQ(ncclCommDestroy(comm), ncclSuccess);
  float a = 1, b = 0;
  EXPECT_ERR(ncclAllReduce(&a, &b, 1, ncclFloat, ncclSum, comm, nullptr), ncclInvalidArgument,
             "not a live communicator");
  int n;
  EXPECT_ERR(ncclCommCount(comm, &n), ncclInvalidArgument, "not a live communicator");
  EXPECT_ERR(ncclCommDestroy(comm), ncclInvalidArgument, "not a live communicator");
  // ncclGetLastError with a dead handle must not touch it: it answers for the thread.
  EXPECT_TRUE(contains(ncclGetLastError(comm), "not a live communicator")) << ncclGetLastError(comm);
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommAbort(nullptr), ncclSuccess);
}

TEST(CoreErrorsUsage, SocketIfnameMatchesNothing) {
  EnvGuard env("NCCL_SOCKET_IFNAME", "doesnotexist");
  ncclUniqueId id;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_ERR(ncclGetUniqueId(&id), ncclInvalidArgument, "NCCL_SOCKET_IFNAME");
  EXPECT_TRUE(contains(ncclGetLastError(nullptr), "doesnotexist")) << ncclGetLastError(nullptr);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << "must fail fast";
}

TEST(CoreErrorsUsage, ErrorStrings) {
  const ncclResult_t codes[] = {ncclSuccess,         ncclUnhandledCudaError, ncclSystemError,
                                ncclInternalError,   ncclInvalidArgument,    ncclInvalidUsage,
                                ncclRemoteError,     ncclInProgress};
  std::set<std::string> seen;
  for (ncclResult_t c : codes) {
    const char* s = ncclGetErrorString(c);
    ASSERT_NE(s, nullptr) << c;
    EXPECT_GT(strlen(s), 3u) << c;
    EXPECT_TRUE(seen.insert(s).second) << "code " << c << " shares its string: " << s;
  }
  // NCCL's wording, which scripts match on.
  EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "no error");
  EXPECT_TRUE(contains(ncclGetErrorString(ncclInvalidArgument), "invalid argument"));
  EXPECT_TRUE(contains(ncclGetErrorString(ncclInvalidUsage), "invalid usage"));
  EXPECT_TRUE(contains(ncclGetErrorString(ncclSystemError), "system error"));
  EXPECT_TRUE(contains(ncclGetErrorString(ncclRemoteError), "remote process"));
  EXPECT_TRUE(contains(ncclGetErrorString(ncclInProgress), "in progress"));
  const char* unknown = ncclGetErrorString(static_cast<ncclResult_t>(1234));
  ASSERT_NE(unknown, nullptr);
  EXPECT_TRUE(contains(unknown, "unknown")) << unknown;
}

// Errors are per thread: one thread's failure does not show up as another's last error.
TEST(CoreErrorsUsage, LastErrorIsPerThread) {
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  std::string other = "unset";
  std::thread([&] {
    EXPECT_ERR(ncclAllReduce(nullptr, nullptr, 1, static_cast<ncclDataType_t>(42), ncclSum,
                             nullptr, nullptr),
               ncclInvalidArgument, "comm");
    other = ncclGetLastError(nullptr);
  }).join();
  EXPECT_TRUE(contains(ncclGetLastError(nullptr), "ncclGroupStart")) << ncclGetLastError(nullptr);
  EXPECT_FALSE(contains(other, "ncclGroupStart")) << other;
}

// Two ranks call the same all-reduce with 1000 and 2000 elements. The engine compares the
// size of every FIFO step with what the receiver expects, so at least one rank must report
// the mismatch (naming the count), and no rank may hang: LOOM_TIMEOUT bounds any rank
// left waiting for data that will never come.
class MismatchTest : public testing::TestWithParam<CoreParam> {};

TEST_P(MismatchTest, AllReduceCountsDifferAcrossRanks) {
  std::optional<EnvGuard> shmOff;
  if (GetParam().transport == Transport::kSocket) shmOff.emplace("NCCL_SHM_DISABLE", "1");
  EnvGuard limit("LOOM_TIMEOUT", "5");
  std::string dir = testing::TempDir() + "loom_mismatch_" + std::to_string(getpid());
  mkdir(dir.c_str(), 0700);
  auto t0 = std::chrono::steady_clock::now();
  // Each rank reports its outcome through a file, since error strings fail the harness.
  auto f = runRanks(GetParam().mode, 2, [&](int rank, int nranks, ncclComm_t comm) {
    size_t count = rank == 0 ? 1000 : 2000;
    std::vector<float> in(count, 1.0f), out(count, 0.0f);
    ncclResult_t r = ncclAllReduce(in.data(), out.data(), count, ncclFloat, ncclSum, comm, nullptr);
    std::string line = std::to_string(r) + " " + ncclGetLastError(nullptr);
    FILE* fp = fopen((dir + "/rank" + std::to_string(rank)).c_str(), "w");
    if (fp) {
      fputs(line.c_str(), fp);
      fclose(fp);
    }
    return std::string();
  }, 60);
  EXPECT_TRUE(f.empty()) << joinFailures(f);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  int errors = 0, named = 0;
  std::string all;
  for (int r = 0; r < 2; ++r) {
    std::string path = dir + "/rank" + std::to_string(r);
    FILE* fp = fopen(path.c_str(), "r");
    ASSERT_NE(fp, nullptr) << "rank " << r << " did not return from ncclAllReduce";
    char buf[2048] = {0};
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    unlink(path.c_str());
    std::string line(buf, n);
    all += "rank " + std::to_string(r) + ": " + line + "\n";
    if (atoi(buf) != ncclSuccess) ++errors;
    if (atoi(buf) != ncclSuccess && (contains(line, "count") || contains(line, "bytes"))) ++named;
  }
  rmdir(dir.c_str());
  EXPECT_GE(errors, 1) << "mismatched counts went unnoticed:\n" << all;
  EXPECT_GE(named, 1) << "no error names the count/size mismatch:\n" << all;
}

INSTANTIATE_TEST_SUITE_P(Core, MismatchTest,
                         testing::Values(CoreParam{Mode::kThreads, 2, Transport::kShm},
                                         CoreParam{Mode::kThreads, 2, Transport::kSocket},
                                         CoreParam{Mode::kProcesses, 2, Transport::kShm},
                                         CoreParam{Mode::kProcesses, 2, Transport::kSocket}),
                         coreParamName);

}  // namespace
}  // namespace loomtest

// Entry points of NCCL 2.29/2.30 that newer programs import (torch 2.15 does): exported so
// that under LD_PRELOAD they reach Loom. Those Loom hands to stock NCCL fail elsewhere with
// ncclInvalidUsage naming themselves and the NCCL version they came with; none touches a
// communicator Loom never made.
extern "C" ncclResult_t ncclCommMemStats(ncclComm_t comm, int stat, uint64_t* value);
extern "C" ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId,
                                     int rank, ncclComm_t* newcomm, ncclConfig_t* config);
extern "C" ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags,
                                   ncclComm_t comm, cudaStream_t stream);

namespace loomtest {
namespace {

TEST(NewerNcclApi, FailsWithInvalidUsageNamingTheCall) {
  auto bogus = reinterpret_cast<ncclComm_t>(uintptr_t{0x10});  // never dereferenced
  uint64_t v = 0;
  EXPECT_EQ(ncclCommMemStats(bogus, 0, &v), ncclInvalidUsage);
  std::string msg = ncclGetLastError(nullptr);
  EXPECT_NE(msg.find("ncclCommMemStats"), std::string::npos) << msg;
  EXPECT_NE(msg.find("NCCL 2.28.9"), std::string::npos) << msg;
  ncclComm_t out = nullptr;
  // Growing is Loom's own (tests/core/grow_test.cc).
  EXPECT_EQ(ncclCommGrow(bogus, 4, nullptr, -1, &out, nullptr), ncclInvalidArgument);
  msg = ncclGetLastError(nullptr);
  EXPECT_NE(msg.find("ncclCommGrow: comm 0x10 is not a live communicator"), std::string::npos) << msg;
  EXPECT_EQ(out, nullptr);
  // The one-sided calls are stock NCCL's where it serves the communicator
  // (tests/dispatch/registration_test.cc): a communicator Loom never made is refused.
  EXPECT_EQ(ncclSignal(1, 0, 0, 0, bogus, nullptr), ncclInvalidArgument);
  msg = ncclGetLastError(nullptr);
  EXPECT_NE(msg.find("ncclSignal: comm 0x10 is not a live communicator"), std::string::npos) << msg;
}

}  // namespace
}  // namespace loomtest
