// Host half of NCCL's device-side API (nccl_device/*.h). NCCL 2.28.9's libnccl.so.2 exports
// these, so the drop-in must too. Loom has no device-side API of its own (its CUDA executor
// is driven from the host): where a shadow communicator serves a communicator's device
// memory (stock NCCL, LOOM_NCCL_FALLBACK), the calls go to stock NCCL with its communicator,
// and the device communicators, teams and handles they fill are stock NCCL's, for kernels
// built against nccl_device.h to use with stock NCCL's windows (api/registration.cc).
// Elsewhere each fails with ncclInvalidUsage saying why. The calls that take no
// communicator go to the process's stock library unless LOOM_NCCL_FALLBACK is off.
#include <nccl.h>

#include <string>

#include "api/comm.h"
#include "api/group.h"
#include "api/guard.h"
#include "api/stock_route.h"
#include "base/error.h"
#include "dispatch/fallback.h"
#include "dispatch/nccl_extra_abi.h"

namespace {

using loom::api::guard;
using loom::dispatch::StockApi;
using loom::dispatch::StockNccl;

// The stock library serving `comm`'s device memory, or throws saying who serves it instead.
const StockNccl& stockOf(ncclComm_t comm, const char* fn) {
  loom::api::checkComm(comm, fn);
  LOOM_CHECK_USAGE(comm->shadow != nullptr,
                   "%s: NCCL's device-side API (nccl_device.h) is stock NCCL's, and this "
                   "communicator's device memory is served by %s; use the host API "
                   "(ncclAllReduce, ncclSend/ncclRecv, ...) instead",
                   fn, comm->deviceServer.c_str());
  return comm->shadow->lib();
}

// The process's stock library for the calls without a communicator.
const StockNccl& processStock(const char* fn) {
  LOOM_CHECK_USAGE(loom::dispatch::fallbackMode() != loom::dispatch::FallbackMode::kOff,
                   "%s: NCCL's device-side API is stock NCCL's, and LOOM_NCCL_FALLBACK=off", fn);
  std::string why;
  const StockNccl* lib = loom::dispatch::processStockNccl(&why);
  LOOM_CHECK_USAGE(lib != nullptr,
                   "%s: NCCL's device-side API is stock NCCL's, and there is none here (%s)", fn,
                   why.c_str());
  return *lib;
}

// Stock NCCL writes through these without looking: a NULL one would crash it.
void checkOutputs(const void* outHandle, const void* outReq, const char* fn) {
  LOOM_CHECK_ARG(outHandle != nullptr && outReq != nullptr, "%s: outHandle or outReq is NULL", fn);
}

// Functions that return a team or an int have no error channel. They record the error
// (ncclGetLastError shows it, and it is logged at WARN) and return a value that keeps a
// caller that ignores it out of trouble: the empty team {0 ranks, rank 0, stride 1} (no
// rank is a member of it, and nccl_device.h's inline helpers divide by stride, so stride
// is never 0), and -1 (no valid rank or slot count).
constexpr ncclTeam_t kEmptyTeam = {0, 0, 1};

template <class F>
ncclTeam_t team(ncclComm_t comm, F StockApi::*member, const char* fn) {
  ncclTeam_t t = kEmptyTeam;
  (void)guard(fn, comm, [&] {
    t = loom::api::stockEntry(stockOf(comm, fn), member, fn)(comm->shadow->stockComm());
    return ncclSuccess;
  });
  return t;
}

template <class F>
int teamRank(ncclComm_t comm, ncclTeam_t tm, int rank, F StockApi::*member, const char* fn) {
  int out = -1;
  (void)guard(fn, comm, [&] {
    out = loom::api::stockEntry(stockOf(comm, fn), member, fn)(comm->shadow->stockComm(), tm,
                                                                   rank);
    return ncclSuccess;
  });
  return out;
}

}  // namespace

// Collective in NCCL. Inside a group it joins a stock group that the group's end closes:
// stock NCCL copies `reqs` now and creates the device communicator then, as it does alone.
LOOM_NCCL_API ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
                                             ncclDevComm_t* outDevComm) {
  const char* fn = "ncclDevCommCreate";
  return guard(fn, comm, [&] {
    LOOM_CHECK_ARG(reqs != nullptr && outDevComm != nullptr, "%s: reqs or outDevComm is NULL", fn);
    stockOf(comm, fn);
    loom::api::callStockOrJoinGroup(comm, fn, &StockApi::devCommCreate, reqs, outDevComm);
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm) {
  const char* fn = "ncclDevCommDestroy";
  return guard(fn, comm, [&] {
    LOOM_CHECK_ARG(devComm != nullptr, "%s: devComm is NULL", fn);
    stockOf(comm, fn);
    loom::api::callStockOrJoinGroup(comm, fn, &StockApi::devCommDestroy, devComm);
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclTeam_t ncclTeamWorld(ncclComm_t comm) {
  return team(comm, &StockApi::teamWorld, "ncclTeamWorld");
}

LOOM_NCCL_API ncclTeam_t ncclTeamLsa(ncclComm_t comm) {
  return team(comm, &StockApi::teamLsa, "ncclTeamLsa");
}

LOOM_NCCL_API ncclTeam_t ncclTeamRail(ncclComm_t comm) {
  return team(comm, &StockApi::teamRail, "ncclTeamRail");
}

LOOM_NCCL_API int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  return teamRank(comm, team, rank, &StockApi::teamRankToWorld, "ncclTeamRankToWorld");
}

LOOM_NCCL_API int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank) {
  return teamRank(comm, team, rank, &StockApi::teamRankToLsa, "ncclTeamRankToLsa");
}

LOOM_NCCL_API ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team,
                                                           int nBarriers,
                                                           ncclGinBarrierHandle_t* outHandle,
                                                           ncclDevResourceRequirements_t* outReq) {
  const char* fn = "ncclGinBarrierCreateRequirement";
  return guard(fn, comm, [&] {
    checkOutputs(outHandle, outReq, fn);
    stockOf(comm, fn);
    loom::api::callStock(comm, fn, &StockApi::ginBarrierCreateRequirement, team, nBarriers,
                         outHandle, outReq);
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
                                                           ncclLsaBarrierHandle_t* outHandle,
                                                           ncclDevResourceRequirements_t* outReq) {
  const char* fn = "ncclLsaBarrierCreateRequirement";
  return guard(fn, nullptr, [&] {
    checkOutputs(outHandle, outReq, fn);
    loom::api::callStockCommless(processStock(fn), fn, &StockApi::lsaBarrierCreateRequirement,
                                 team, nBarriers, outHandle, outReq);
    return ncclSuccess;
  });
}

LOOM_NCCL_API int ncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
  const char* fn = "ncclLLA2ACalcSlots";
  int out = -1;
  (void)guard(fn, nullptr, [&] {
    out = loom::api::stockEntry(processStock(fn), &StockApi::llA2ACalcSlots, fn)(maxElts,
                                                                                maxEltSize);
    return ncclSuccess;
  });
  return out;
}

LOOM_NCCL_API ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots,
                                                      ncclLLA2AHandle_t* outHandle,
                                                      ncclDevResourceRequirements_t* outReq) {
  const char* fn = "ncclLLA2ACreateRequirement";
  return guard(fn, nullptr, [&] {
    checkOutputs(outHandle, outReq, fn);
    loom::api::callStockCommless(processStock(fn), fn, &StockApi::llA2ACreateRequirement,
                                 nBlocks, nSlots, outHandle, outReq);
    return ncclSuccess;
  });
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
