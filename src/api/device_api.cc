// Host half of NCCL's device-side API (nccl_device/*.h). NCCL 2.28.9's libnccl.so.2 exports
// these, so the drop-in must too: a program built against nccl_device.h has to load and
// link against Loom, and then be told plainly that the feature is absent rather than crash
// on a missing symbol. Loom has no device-side API (its CUDA executor is driven from the
// host), so every function here fails with ncclInvalidUsage.
//
// The types are declared here, not in nccl.h: nccl.h must stay exactly NCCL's, and the
// functions only take pointers to these structs (never looked into) except ncclTeam,
// which is passed and returned by value and so must match NCCL's layout
// (struct ncclTeam { int nRanks, rank, stride; }).
#include <nccl.h>

#include "api/guard.h"
#include "base/error.h"

extern "C" {
struct ncclTeam {
  int nRanks, rank, stride;
};
typedef struct ncclTeam ncclTeam_t;
struct ncclDevComm;
typedef struct ncclDevComm ncclDevComm_t;
struct ncclDevCommRequirements;
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;
struct ncclDevResourceRequirements;
typedef struct ncclDevResourceRequirements ncclDevResourceRequirements_t;
struct ncclLsaBarrierHandle;
typedef struct ncclLsaBarrierHandle ncclLsaBarrierHandle_t;
struct ncclGinBarrierHandle;
typedef struct ncclGinBarrierHandle ncclGinBarrierHandle_t;
struct ncclLLA2AHandle;
typedef struct ncclLLA2AHandle ncclLLA2AHandle_t;
}

static_assert(sizeof(ncclTeam) == 3 * sizeof(int),
              "ncclTeam is passed by value: keep NCCL's layout");

namespace {

using loom::api::guard;

ncclResult_t unsupported(const char* fn, ncclComm_t comm) {
  return guard(fn, comm, [fn]() -> ncclResult_t {
    LOOM_THROW(kInvalidUsage,
               "%s: NCCL's device-side API (nccl_device.h) is not supported by Loom; use the "
               "host API (ncclAllReduce, ncclSend/ncclRecv, ...) instead",
               fn);
  });
}

// Functions that return a team or an int have no error channel. They record the error
// (ncclGetLastError shows it, and it is logged at WARN) and return a value that keeps a
// caller that ignores it out of trouble: the empty team {0 ranks, rank 0, stride 1} (no
// rank is a member of it, and nccl_device.h's inline helpers divide by stride, so stride
// is never 0), and -1 (no valid rank or slot count).
constexpr ncclTeam_t kEmptyTeam = {0, 0, 1};

}  // namespace

LOOM_NCCL_API ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
                                             ncclDevComm_t* outDevComm) {
  return unsupported("ncclDevCommCreate", comm);
}

LOOM_NCCL_API ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm) {
  return unsupported("ncclDevCommDestroy", comm);
}

LOOM_NCCL_API ncclTeam_t ncclTeamWorld(ncclComm_t comm) {
  (void)unsupported("ncclTeamWorld", comm);
  return kEmptyTeam;
}

LOOM_NCCL_API ncclTeam_t ncclTeamLsa(ncclComm_t comm) {
  (void)unsupported("ncclTeamLsa", comm);
  return kEmptyTeam;
}

LOOM_NCCL_API ncclTeam_t ncclTeamRail(ncclComm_t comm) {
  (void)unsupported("ncclTeamRail", comm);
  return kEmptyTeam;
}

LOOM_NCCL_API int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  (void)unsupported("ncclTeamRankToWorld", comm);
  return -1;
}

LOOM_NCCL_API int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank) {
  (void)unsupported("ncclTeamRankToLsa", comm);
  return -1;
}

LOOM_NCCL_API ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team,
                                                           int nBarriers,
                                                           ncclGinBarrierHandle_t* outHandle,
                                                           ncclDevResourceRequirements_t* outReq) {
  return unsupported("ncclGinBarrierCreateRequirement", comm);
}

LOOM_NCCL_API ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
                                                           ncclLsaBarrierHandle_t* outHandle,
                                                           ncclDevResourceRequirements_t* outReq) {
  return unsupported("ncclLsaBarrierCreateRequirement", nullptr);
}

LOOM_NCCL_API int ncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
  (void)unsupported("ncclLLA2ACalcSlots", nullptr);
  return -1;
}

LOOM_NCCL_API ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots,
                                                      ncclLLA2AHandle_t* outHandle,
                                                      ncclDevResourceRequirements_t* outReq) {
  return unsupported("ncclLLA2ACreateRequirement", nullptr);
}

// The pncclX profiling names (nccl.h declares both; NCCL exports both).
LOOM_NCCL_PROFILING_ALIAS(ncclDevCommCreate);
LOOM_NCCL_PROFILING_ALIAS(ncclDevCommDestroy);
LOOM_NCCL_PROFILING_ALIAS(ncclTeamWorld);
LOOM_NCCL_PROFILING_ALIAS(ncclTeamLsa);
LOOM_NCCL_PROFILING_ALIAS(ncclTeamRail);
LOOM_NCCL_PROFILING_ALIAS(ncclTeamRankToWorld);
LOOM_NCCL_PROFILING_ALIAS(ncclTeamRankToLsa);
LOOM_NCCL_PROFILING_ALIAS(ncclGinBarrierCreateRequirement);
LOOM_NCCL_PROFILING_ALIAS(ncclLsaBarrierCreateRequirement);
LOOM_NCCL_PROFILING_ALIAS(ncclLLA2ACalcSlots);
LOOM_NCCL_PROFILING_ALIAS(ncclLLA2ACreateRequirement);
