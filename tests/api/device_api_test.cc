// The host functions of NCCL's device API, called through NVIDIA's own nccl_device.h and
// linked to libloom: they must exist with NCCL's ABI (ncclTeam is returned by value) and
// fail cleanly where stock NCCL does not serve the communicator (here: a host
// communicator), naming the function and saying why. Where stock NCCL serves it, the calls
// are stock NCCL's: tests/dispatch/registration_test.cc.
#include <cstddef>  // nccl_device.h uses size_t/uint32_t without including their headers
#include <cstdint>
#include <cstdlib>

#include LOOM_REFERENCE_NCCL_H
#include <nccl_device.h>

#include <string>

#include <gtest/gtest.h>

namespace {

void expectRecorded(const char* fn, const char* why) {
  std::string msg = ncclGetLastError(nullptr);
  EXPECT_NE(msg.find(fn), std::string::npos) << msg;
  EXPECT_NE(msg.find(why), std::string::npos) << msg;
}

void expectEmptyTeam(ncclTeam_t t) {
  EXPECT_EQ(t.nRanks, 0);
  EXPECT_EQ(t.rank, 0);
  EXPECT_EQ(t.stride, 1);  // never 0: NCCL's inline team helpers divide by it
}

// A one-rank host communicator: no CUDA device, so stock NCCL serves none of it.
struct HostComm {
  HostComm() {
    int dev = -1;
    rc = ncclCommInitAll(&comm, 1, &dev);
  }
  ~HostComm() {
    if (comm) ncclCommDestroy(comm);
  }
  ncclComm_t comm = nullptr;
  ncclResult_t rc;
};

constexpr const char* kWhy = "device-side API (nccl_device.h) is stock NCCL's";

TEST(DeviceApiTest, ResultFunctionsFailCleanly) {
  HostComm h;
  ASSERT_EQ(h.rc, ncclSuccess) << ncclGetLastError(nullptr);
  ncclDevCommRequirements_t reqs = {};
  ncclDevComm_t devComm = {};
  EXPECT_EQ(ncclDevCommCreate(h.comm, &reqs, &devComm), ncclInvalidUsage);
  expectRecorded("ncclDevCommCreate", kWhy);
  EXPECT_EQ(ncclDevCommDestroy(h.comm, &devComm), ncclInvalidUsage);
  expectRecorded("ncclDevCommDestroy", kWhy);
  ncclTeam_t team = {1, 0, 1};
  ncclDevResourceRequirements_t req = {};
  ncclGinBarrierHandle_t gin;
  EXPECT_EQ(ncclGinBarrierCreateRequirement(h.comm, team, 1, &gin, &req), ncclInvalidUsage);
  expectRecorded("ncclGinBarrierCreateRequirement", kWhy);

  // Bad arguments, before anything reaches stock NCCL (which would write through them).
  EXPECT_EQ(ncclDevCommCreate(nullptr, &reqs, &devComm), ncclInvalidArgument);
  expectRecorded("ncclDevCommCreate", "comm is NULL");
  EXPECT_EQ(ncclDevCommCreate(h.comm, &reqs, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclLsaBarrierCreateRequirement(team, 1, nullptr, &req), ncclInvalidArgument);
  expectRecorded("ncclLsaBarrierCreateRequirement", "outHandle or outReq is NULL");
  EXPECT_EQ(ncclLLA2ACreateRequirement(1, 1, nullptr, nullptr), ncclInvalidArgument);
  expectRecorded("ncclLLA2ACreateRequirement", "outHandle or outReq is NULL");
}

TEST(DeviceApiTest, TeamAndIntFunctionsReturnHarmlessValues) {
  HostComm h;
  ASSERT_EQ(h.rc, ncclSuccess) << ncclGetLastError(nullptr);
  expectEmptyTeam(ncclTeamWorld(h.comm));
  expectRecorded("ncclTeamWorld", kWhy);
  expectEmptyTeam(ncclTeamLsa(h.comm));
  expectRecorded("ncclTeamLsa", kWhy);
  expectEmptyTeam(ncclTeamRail(nullptr));
  expectRecorded("ncclTeamRail", "comm is NULL");

  ncclTeam_t team = {4, 1, 1};
  EXPECT_EQ(ncclTeamRankToWorld(h.comm, team, 2), -1);
  expectRecorded("ncclTeamRankToWorld", kWhy);
  EXPECT_EQ(ncclTeamRankToLsa(h.comm, team, 2), -1);
  expectRecorded("ncclTeamRankToLsa", kWhy);

  // No rank belongs to the empty team, and asking does not divide by zero.
  ncclTeam_t empty = ncclTeamWorld(h.comm);
  for (int r = -2; r < 4; ++r) EXPECT_FALSE(ncclTeamRankIsMember(empty, team, r)) << r;
}

// The calls without a communicator go to the process's stock NCCL, unless the fallback is
// off. Where the machine has one (the CUDA toolkit's, here), its own answer comes back.
TEST(DeviceApiTest, CallsWithoutACommunicatorAreStockNcclsUnlessTheFallbackIsOff) {
  setenv("LOOM_NCCL_FALLBACK", "off", 1);
  EXPECT_EQ(ncclLLA2ACalcSlots(1024, 8), -1);
  expectRecorded("ncclLLA2ACalcSlots", "LOOM_NCCL_FALLBACK=off");
  ncclLsaBarrierHandle_t lsa;
  ncclDevResourceRequirements_t req = {};
  EXPECT_EQ(ncclLsaBarrierCreateRequirement({1, 0, 1}, 1, &lsa, &req), ncclInvalidUsage);
  expectRecorded("ncclLsaBarrierCreateRequirement", "LOOM_NCCL_FALLBACK=off");
  unsetenv("LOOM_NCCL_FALLBACK");
  const int slots = ncclLLA2ACalcSlots(1024, 8);
  if (slots == -1) {
    const std::string why = ncclGetLastError(nullptr);
    EXPECT_TRUE(why.find("there is none here") != std::string::npos ||
                why.find("too old for it") != std::string::npos)
        << why;
    GTEST_SKIP() << "no stock NCCL with the device API on this machine: " << why;
  }
  EXPECT_GT(slots, 0) << "stock NCCL's own count";
}

}  // namespace
