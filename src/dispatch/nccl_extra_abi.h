// NCCL entry points that nccl.h (2.28.9, which Loom's include/nccl.h is, unchanged) does not
// declare, as the C ABI carries them: the host half of NCCL's device API (nccl_device/*.h)
// and the window calls NCCL 2.29/2.30 added. Loom exports them (src/api/device_api.cc,
// registration.cc, signals.cc) and hands them to stock NCCL where a shadow communicator
// serves the caller's communicator (dispatch/stock_nccl.h binds them there); ncclCommGrow and
// ncclCommGetUniqueId (NCCL 2.29) are Loom's own (src/api/grow.cc).
//
// The structs are opaque to Loom (only pointers to them pass through) except ncclTeam,
// which is passed and returned by value and so must match NCCL's layout.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>

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

// nccl_device/core.h, gin_barrier.h, lsa_barrier.h, ll_a2a.h (NCCL 2.28)
ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
                               ncclDevComm_t* outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm);
ncclTeam_t ncclTeamWorld(ncclComm_t comm);
ncclTeam_t ncclTeamLsa(ncclComm_t comm);
ncclTeam_t ncclTeamRail(ncclComm_t comm);
int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank);
int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers,
                                             ncclGinBarrierHandle_t* outHandle,
                                             ncclDevResourceRequirements_t* outReq);
ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
                                             ncclLsaBarrierHandle_t* outHandle,
                                             ncclDevResourceRequirements_t* outReq);
int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);
ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle,
                                        ncclDevResourceRequirements_t* outReq);

// NCCL 2.29/2.30: one-sided puts and signals through windows (nccl.h 2.30.7)
struct ncclWaitSignalDesc;  // {opCnt, peer, sigIdx, ctx}: only pointers to it pass
ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                           ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                           unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc* signalDescs, ncclComm_t comm,
                            cudaStream_t stream);

// NCCL 2.29: growing a communicator by ranks that join it (api/grow.cc)
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                          ncclComm_t* newcomm, ncclConfig_t* config);

// NCCL 2.29/2.30: a communicator's GPU memory (stat: an ncclCommMemStat_t, int-sized)
ncclResult_t ncclCommMemStats(ncclComm_t comm, int stat, uint64_t* value);
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t ncclCommResume(ncclComm_t comm);

// NCCL 2.29/2.30: what a window is, asked of the window
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr);
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void** outPtr);
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer,
                                      void** outPtr);
}

static_assert(sizeof(ncclTeam) == 3 * sizeof(int),
              "ncclTeam is passed by value: keep NCCL's layout");
