// What only the stand-in driver can show: a failing driver query, the number of queries a
// call costs, and ncclCommInitAll's device list against buffers of other devices.
#include <gtest/gtest.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "base/cuda_driver.h"
#include "core/rank_harness.h"
#include "device_memory.h"
#include "stand_in_hooks.h"

namespace loomtest {
namespace {

constexpr int kCudaErrorNotInitialized = 3;
constexpr int kCudaErrorDeinitialized = 4;

class StandIn : public testing::Test {
 protected:
  void SetUp() override {
    setenv("LOOM_STAGED_PATH", "0", 1);  // device buffers are refused (staged_test.cc serves them)
    mem_ = makeDeviceMemory();  // points Loom at the stand-in
    ASSERT_EQ(mem_->unavailable(), "");
    ASSERT_EQ(hooks_.open(LOOM_STAND_IN_CUDA_PATH, RTLD_NOW | RTLD_NOLOAD), "");
    mem_->makeCurrent(0);
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ASSERT_EQ(ncclCommInitRank(&comm_, 1, id, 0), ncclSuccess) << ncclGetLastError(nullptr);
  }
  void TearDown() override {
    if (hooks_.setQueryResult) hooks_.setQueryResult(0);
    if (comm_) ncclCommDestroy(comm_);
  }
  std::unique_ptr<DeviceMemory> mem_;
  StandInHooks hooks_;
  ncclComm_t comm_ = nullptr;
};

TEST_F(StandIn, LoomLoadedTheStandIn) {
  const loom::cuda::Driver* drv = loom::cuda::driver();
  ASSERT_NE(drv, nullptr);
  EXPECT_NE(drv->lib.path().find("stand_in_cuda"), std::string::npos) << drv->lib.path();
  EXPECT_EQ(drv->version, 13000);
  EXPECT_EQ(loom::cuda::driverAbsenceReason(), "");
  EXPECT_EQ(loom::cuda::currentDevice(), 0);
  mem_->makeCurrent(3);
  EXPECT_EQ(loom::cuda::currentDevice(), 3);
  mem_->makeCurrent(-1);
  EXPECT_EQ(loom::cuda::currentDevice(), -1);
}

// A driver that cannot answer must not be taken to mean "host": the call fails instead.
TEST_F(StandIn, FailingQueryIsUnhandledCudaError) {
  std::vector<float> in(64, 1.0f), out(64, 0.0f);
  hooks_.setQueryResult(kCudaErrorDeinitialized);
  EXPECT_EQ(ncclAllReduce(in.data(), out.data(), 64, ncclFloat, ncclSum, comm_, nullptr),
            ncclUnhandledCudaError);
  std::string msg = ncclGetLastError(comm_);
  EXPECT_EQ(msg.rfind("ncclAllReduce: sendbuff: cuPointerGetAttributes", 0), 0u) << msg;
  EXPECT_NE(msg.find("driver shutting down (4)"), std::string::npos) << msg;
  EXPECT_EQ(out, std::vector<float>(64, 0.0f));
  hooks_.setQueryResult(0);
  EXPECT_EQ(ncclAllReduce(in.data(), out.data(), 64, ncclFloat, ncclSum, comm_, nullptr),
            ncclSuccess)
      << ncclGetLastError(comm_);
  EXPECT_EQ(out, in);
}

// Classification runs on every call: one driver query per distinct buffer, none for an
// empty one.
TEST_F(StandIn, OneQueryPerDistinctBuffer) {
  std::vector<float> a(64, 1.0f), b(64, 0.0f);
  long q0 = hooks_.queryCount();
  ASSERT_EQ(ncclAllReduce(a.data(), b.data(), 64, ncclFloat, ncclSum, comm_, nullptr), ncclSuccess);
  long q1 = hooks_.queryCount();
  EXPECT_EQ(q1 - q0, 2);
  ASSERT_EQ(ncclAllReduce(a.data(), a.data(), 64, ncclFloat, ncclSum, comm_, nullptr), ncclSuccess);
  long q2 = hooks_.queryCount();
  EXPECT_EQ(q2 - q1, 1) << "in place: one query answers both buffers";
  ASSERT_EQ(ncclAllReduce(a.data(), b.data(), 0, ncclFloat, ncclSum, comm_, nullptr), ncclSuccess);
  EXPECT_EQ(hooks_.queryCount(), q2) << "an empty call looks at no buffer";
}

// ncclCommInitAll binds comm i to devlist[i] whatever the current device; a buffer of
// another device is refused as a mismatch, one of its own as unsupported.
TEST_F(StandIn, InitAllDevlistDecidesTheDevice) {
  void* dev2 = mem_->allocDevice(4096, 2, 0x12);
  void* dev1 = mem_->allocDevice(4096, 1, 0x13);
  std::vector<ncclComm_t> comms(2, nullptr);
  int devlist[] = {2, 1};
  ASSERT_EQ(ncclCommInitAll(comms.data(), 2, devlist), ncclSuccess) << ncclGetLastError(nullptr);
  int d0 = -2, d1 = -2;
  ASSERT_EQ(ncclCommCuDevice(comms[0], &d0), ncclSuccess);
  ASSERT_EQ(ncclCommCuDevice(comms[1], &d1), ncclSuccess);
  EXPECT_EQ(d0, 2);
  EXPECT_EQ(d1, 1);
  EXPECT_EQ(ncclSend(dev1, 1024, ncclFloat, 1, comms[0], nullptr), ncclInvalidArgument);
  std::string msg = ncclGetLastError(comms[0]);
  EXPECT_NE(msg.find("CUDA device 1, but the communicator (rank 0) uses CUDA device 2"),
            std::string::npos)
      << msg;
  EXPECT_EQ(ncclSend(dev2, 1024, ncclFloat, 1, comms[0], nullptr), ncclInvalidUsage);
  EXPECT_TRUE(mem_->holds(dev1, 4096, 0x13));
  EXPECT_TRUE(mem_->holds(dev2, 4096, 0x12));
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// CUDA does not survive a fork: in a child forked after the driver was loaded, a driver that
// fails every query must not stop host calls (that child can hold no usable device buffer).
TEST(StandInFork, ChildWhoseDriverFailsKeepsHostCalls) {
  std::unique_ptr<DeviceMemory> mem = makeDeviceMemory();
  ASSERT_EQ(mem->unavailable(), "");
  ASSERT_FALSE(loom::cuda::forkedSinceLoad());
  StandInHooks hooks;
  ASSERT_EQ(hooks.open(LOOM_STAND_IN_CUDA_PATH, RTLD_NOW | RTLD_NOLOAD), "");
  auto failures = runEach(Mode::kProcesses, 1, [&](int, int) -> std::string {
    RANK_CHECK(loom::cuda::forkedSinceLoad(), "the child does not know it was forked");
    hooks.setQueryResult(kCudaErrorNotInitialized);
    ncclUniqueId id;
    RANK_NCCL(ncclGetUniqueId(&id));
    ncclComm_t comm = nullptr;
    RANK_NCCL(ncclCommInitRank(&comm, 1, id, 0));
    std::vector<float> in(64, 1.5f), out(64, 0.0f);
    ncclResult_t r = ncclAllReduce(in.data(), out.data(), 64, ncclFloat, ncclSum, comm, nullptr);
    std::string err = ncclGetLastError(comm);
    ncclCommDestroy(comm);
    RANK_CHECK(r == ncclSuccess, "all-reduce returned %d: %s", r, err.c_str());
    RANK_CHECK(out == in, "wrong all-reduce result");
    return "";
  });
  EXPECT_TRUE(failures.empty()) << joinFailures(failures);
  EXPECT_FALSE(loom::cuda::forkedSinceLoad()) << "only the child was forked";
}

}  // namespace
}  // namespace loomtest
