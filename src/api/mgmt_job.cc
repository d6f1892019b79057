#include "api/mgmt_job.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "api/comm.h"
#include "api/group.h"
#include "api/guard.h"
#include "base/error.h"

namespace loom::api {
namespace {
thread_local ncclComm_t tlsJobParent = nullptr;
}

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
  parent->jobThread = std::thread([parent, steps = std::move(steps),
                                   scope = std::move(scope)]() mutable {
    tlsJobParent = parent;
    std::vector<ncclComm_t> made(steps.size(), nullptr);
    ncclResult_t rc = ncclSuccess;
    for (size_t i = 0; i < steps.size(); ++i) {
      if (rc == ncclSuccess || rc == ncclInProgress)
        rc = guard(steps[i].fn, parent, [&] { return steps[i].run(&made[i]); });
      else if (steps[i].skipped)
        steps[i].skipped();
    }
    // Before the job is seen done: its error, then its communicators.
    if (rc != ncclSuccess && rc != ncclInProgress) parent->asyncError.store(rc);
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i].newcomm)
        std::atomic_ref<ncclComm_t>(*steps[i].newcomm).store(made[i], std::memory_order_release);
    parent->jobRunning.store(false);
    tlsJobParent = nullptr;
    scope.reset();  // the job's last touch of parent
  });
  return ncclInProgress;
}

}  // namespace loom::api
