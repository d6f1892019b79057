// What the entry points that make communicators share (api/init.cc; ncclCommGrow in
// api/grow.cc): the checks of an init's arguments, the start of an init, and a child's job
// and config.
#pragma once

#include <nccl.h>

#include "bootstrap/unique_id.h"

namespace loom::api {

// NCCL binds a communicator to the calling thread's current device; -1 (host-only) when
// there is no driver or no current context.
int callerDevice();
// *comm set to NULL first; nranks >= 1 and rank in [0, nranks), else kInvalidArgument.
void checkInitArgs(ncclComm_t* comm, int nranks, int rank, const char* fn);
// Creates the comm object on CUDA device `cudaDev` (-1: host-only) and starts its init
// (deferred to the group's end inside a group; on a thread of its own when non-blocking).
ncclResult_t startInit(ncclComm_t* out, int nranks, const JobId& job, int rank,
                       const ncclConfig_t* config, const char* fn, int cudaDev);
// A fresh job whose root runs in this process, for a communicator made from `parent`'s
// ranks (NCCL_COMM_ID names the parent's root: the fresh one listens on the parent's
// bootstrap interface instead).
JobId newJobFrom(ncclComm_t parent);
// The init of a communicator made from `parent` (a split, shrink or grow): the caller's
// config, else the parent's (names included) and its mode, as NCCL; on the parent's device.
ncclResult_t startChild(ncclComm_t parent, ncclComm_t* newcomm, int nranks, int newRank,
                        const JobId& job, const ncclConfig_t* config, const char* fn);

}  // namespace loom::api
