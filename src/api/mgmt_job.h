// A non-blocking communicator's split, shrink or grow, run as NCCL runs it: as a job on a
// thread of its own, whether called alone or recorded in a group (where the group has no
// operations on that communicator: those would follow the calls, so the group's end runs
// them as before). The call (or the group's end) returns ncclInProgress at once, so that one thread may drive several non-blocking
// ranks through it, with or without a group (each rank's call would otherwise wait for
// the others' in the exchange over the parent).
// - ncclCommGetAsyncError(parent) says ncclInProgress until the exchange over the parent
//   and the new communicator's init are both done;
// - *newcomm is set then (NULL until, NULL for a rank that gets no communicator or when the
//   call failed);
// - a failure becomes the parent's asynchronous error, with its message (unless the parent
//   had failed before: its own error stays), and the parent's later recorded calls in that
//   job do not run;
// - other calls on the parent meanwhile are refused (as NCCL: the previous operation has
//   not returned ncclSuccess yet); ncclCommAbort(parent) stops the job, its new
//   communicator's init included, and ncclCommDestroy(parent) waits for it.
#pragma once

#include <nccl.h>

#include <functional>
#include <vector>

namespace loom::api {

// Whether a split, shrink or grow of `parent` called now, outside a group, runs as a job.
bool runsAsJob(ncclComm_t parent);

// One call of a job. `run` makes the new communicator through startChild into the
// pointer it is given (its init runs on the job's thread).
struct JobStep {
  const char* fn;                 // the entry point (ncclCommSplit ...)
  ncclComm_t* newcomm = nullptr;  // the caller's, set when the job ends (NULL: none to set)
  std::function<ncclResult_t(ncclComm_t* out)> run;
  std::function<void()> skipped;  // instead of run after an earlier step failed (may be empty)
};

// Starts `steps` as parent's job, in order. The caller holds a call scope of parent; the
// job holds its own until it ends. Sets each step's *newcomm to NULL now. Returns
// ncclInProgress; refuses (kInvalidUsage) while another job of parent's is in progress.
ncclResult_t startJob(ncclComm_t parent, std::vector<JobStep> steps);

// The parent whose job runs on the calling thread, or null.
ncclComm_t jobParentOfThisThread();

// Throws kInvalidUsage naming `fn` while a job of comm's is in progress (not on the job's
// own thread).
void refuseDuringJob(ncclComm_t comm, const char* fn);

}  // namespace loom::api
