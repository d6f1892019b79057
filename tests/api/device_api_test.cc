// The host functions of NCCL's device API, called through NVIDIA's own nccl_device.h and
// linked to libloom: they must exist with NCCL's ABI (ncclTeam is returned by value) and
// fail cleanly, naming the function and saying the device API is unsupported.
#include <cstddef>  // nccl_device.h uses size_t/uint32_t without including their headers
#include <cstdint>

#include LOOM_REFERENCE_NCCL_H
#include <nccl_device.h>

#include <string>

#include <gtest/gtest.h>

namespace {

void expectRecorded(const char* fn) {
  std::string msg = ncclGetLastError(nullptr);
  EXPECT_NE(msg.find(fn), std::string::npos) << msg;
  EXPECT_NE(msg.find("device-side API"), std::string::npos) << msg;
}

void expectEmptyTeam(ncclTeam_t t) {
  EXPECT_EQ(t.nRanks, 0);
  EXPECT_EQ(t.rank, 0);
  EXPECT_EQ(t.stride, 1);  // never 0: NCCL's inline team helpers divide by it
}

TEST(DeviceApiTest, ResultFunctionsFailWithInvalidUsage) {
  ncclComm_t comm = nullptr;
  ncclDevCommRequirements_t reqs = {};
  ncclDevComm_t* devComm = nullptr;
  EXPECT_EQ(ncclDevCommCreate(comm, &reqs, devComm), ncclInvalidUsage);
  expectRecorded("ncclDevCommCreate");
  EXPECT_EQ(ncclDevCommDestroy(comm, devComm), ncclInvalidUsage);
  expectRecorded("ncclDevCommDestroy");

  ncclTeam_t team = {1, 0, 1};
  ncclDevResourceRequirements_t req = {};
  ncclGinBarrierHandle_t* gin = nullptr;
  ncclLsaBarrierHandle_t* lsa = nullptr;
  ncclLLA2AHandle_t* a2a = nullptr;
  EXPECT_EQ(ncclGinBarrierCreateRequirement(comm, team, 1, gin, &req), ncclInvalidUsage);
  expectRecorded("ncclGinBarrierCreateRequirement");
  EXPECT_EQ(ncclLsaBarrierCreateRequirement(team, 1, lsa, &req), ncclInvalidUsage);
  expectRecorded("ncclLsaBarrierCreateRequirement");
  EXPECT_EQ(ncclLLA2ACreateRequirement(1, 1, a2a, &req), ncclInvalidUsage);
  expectRecorded("ncclLLA2ACreateRequirement");
}

TEST(DeviceApiTest, TeamAndIntFunctionsReturnHarmlessValues) {
  ncclComm_t comm = nullptr;
  expectEmptyTeam(ncclTeamWorld(comm));
  expectRecorded("ncclTeamWorld");
  expectEmptyTeam(ncclTeamLsa(comm));
  expectRecorded("ncclTeamLsa");
  expectEmptyTeam(ncclTeamRail(comm));
  expectRecorded("ncclTeamRail");

  ncclTeam_t team = {4, 1, 1};
  EXPECT_EQ(ncclTeamRankToWorld(comm, team, 2), -1);
  expectRecorded("ncclTeamRankToWorld");
  EXPECT_EQ(ncclTeamRankToLsa(comm, team, 2), -1);
  expectRecorded("ncclTeamRankToLsa");
  EXPECT_EQ(ncclLLA2ACalcSlots(1024, 8), -1);
  expectRecorded("ncclLLA2ACalcSlots");

  // No rank belongs to the empty team, and asking does not divide by zero.
  ncclTeam_t empty = ncclTeamWorld(comm);
  for (int r = -2; r < 4; ++r) EXPECT_FALSE(ncclTeamRankIsMember(empty, team, r)) << r;
}

}  // namespace
