#include "api/mgmt_job.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "api/comm.h"
#include "api/group.h"
#include "api/guard.h"
#include "base/error.h"
#include "base/log.h"

namespace loom::api {
namespace {
thread_local ncclComm_t tlsJobParent = nullptr;

// The job's steps in order, on its thread; a step after a failed one is skipped. Then, before
// the job is seen done, its error and its communicators.
void runSteps(ncclComm_t parent, std::vector<JobStep>& steps) {
  std::vector<ncclComm_t> made(steps.size(), nullptr);
  ncclResult_t rc = ncclSuccess;
  std::string msg;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (rc == ncclSuccess || rc == ncclInProgress) {
      // Recorded on this thread and logged; the parent's own text is set below.
      rc = guard(steps[i].fn, nullptr, [&] { return steps[i].run(&made[i]); });
      if (rc != ncclSuccess && rc != ncclInProgress) msg = threadLastError();
    } else if (steps[i].skipped) {
      try {
        steps[i].skipped();
      } catch (const std::exception& e) {
        LOOM_WARN("%s, skipped after an earlier failure of its job: %s", steps[i].fn, e.what());
      }
    }
  }
  // The job's error becomes the parent's, unless the parent had failed already (its own
  // error, say its init's, stays what ncclCommGetAsyncError and ncclGetLastError report).
  int none = ncclSuccess;
  if (rc != ncclSuccess && rc != ncclInProgress && parent->asyncError.compare_exchange_strong(none, rc))
    setCommLastError(parent, msg);
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i].newcomm)
      std::atomic_ref<ncclComm_t>(*steps[i].newcomm).store(made[i], std::memory_order_release);
}

}  // namespace

bool runsAsJob(ncclComm_t parent) { return !parent->blocking && !inGroup(); }

ncclComm_t jobParentOfThisThread() { return tlsJobParent; }

void refuseDuringJob(ncclComm_t comm, const char* fn) {
  LOOM_CHECK_USAGE(!comm->jobRunning.load() || tlsJobParent == comm,
                   "%s: communicator (rank %d) is still running its non-blocking %s (poll "
                   "ncclCommGetAsyncError until it no longer returns ncclInProgress)",
                   fn, comm->rank, comm->jobFn.load());
}

ncclResult_t startJob(ncclComm_t parent, std::vector<JobStep> steps) {
  const char* fn = steps.at(0).fn;
  std::lock_guard<std::mutex> lock(parent->jobMu);
  refuseDuringJob(parent, fn);
  if (parent->jobThread.joinable()) parent->jobThread.join();  // the last one, finished
  // Held by the job until its last touch of parent: an abort or destroy frees it after.
  auto scope = std::make_unique<CallScope>(parent);
  for (const JobStep& s : steps)
    if (s.newcomm) std::atomic_ref<ncclComm_t>(*s.newcomm).store(nullptr, std::memory_order_release);
  parent->jobFn.store(fn);
  parent->jobRunning.store(true);
  try {
    parent->jobThread = std::thread([parent, steps = std::move(steps),
                                     scope = std::move(scope)]() mutable {
      tlsJobParent = parent;
      runSteps(parent, steps);
      parent->jobRunning.store(false);
      tlsJobParent = nullptr;
      scope.reset();  // the job's last touch of parent
    });
  } catch (...) {  // no thread (EAGAIN): no job
    parent->jobRunning.store(false);
    throw;
  }
  return ncclInProgress;
}

}  // namespace loom::api
