#include "engine/staged.h"

#include "base/config.h"
#include "base/cuda_driver.h"
#include "base/error.h"
#include "base/log.h"
#include "engine/communicator.h"
#include "engine/engine.h"
#include "engine/staged_record.h"

namespace loom {

using staged::dropHold;
using staged::waitFor;
using staged::wakeAll;

namespace {

thread_local bool tlsOnProxy = false;

// Runs a record's operations on the host engine and lets its stream go on.
void runRecord(StagedRecord* rec) {
  if (rec->cancelled.load(std::memory_order_acquire)) {
    // Its stream work could not all be queued: the launch already failed with that error.
  } else if (!rec->gate.load(std::memory_order_acquire)) {
    // A communicator was aborted before the stream reached the record: its outputs will
    // not be written, which every communicator of the record must learn (a healthy one of
    // a group would otherwise copy stale staging back without an error).
    Error e(Code::kInvalidUsage, "a staged operation was dropped: a communicator of its "
                                 "launch was aborted before its stream reached it");
    for (const Op& op : rec->hostOps)
      if (op.comm.onFailure) op.comm.onFailure(op.comm.owner, e);
  } else {
    try {
      // ncclScalarDevice: the scalar as the stream copied it, just before arrive.
      for (Op& op : rec->hostOps)
        if (op.deviceScalar) op.red = Reducer::preMulSum(op.dtype, op.deviceScalar);
      enqueue(rec->hostOps, Completion::kBeforeReturn);
    } catch (const Error& e) {
      // The call returned long ago: the error reaches ncclCommGetAsyncError.
      for (const Op& op : rec->hostOps)
        if (op.comm.onFailure) op.comm.onFailure(op.comm.owner, e);
    } catch (const std::exception& e) {
      Error err(Code::kInternalError, strprintf("staged operation: %s", e.what()));
      for (const Op& op : rec->hostOps)
        if (op.comm.onFailure) op.comm.onFailure(op.comm.owner, err);
    }
  }
  __atomic_store_n(rec->flag(), 1u, __ATOMIC_RELEASE);
  rec->done.store(true, std::memory_order_release);
  wakeAll();
}

}  // namespace

bool onStagingProxy() { return tlsOnProxy; }

namespace {
BoolKnob kStagedPath("LOOM_STAGED_PATH", "", true,
                     "serve device buffers that stock NCCL does not (LOOM_NCCL_FALLBACK) by "
                     "copying them through pinned host memory on the caller's stream; 0: "
                     "refuse them (ncclInvalidUsage)");
}  // namespace

std::string stagedUnavailableReason() {
  if (!kStagedPath.get()) return "LOOM_STAGED_PATH=0";
  const cuda::Driver* drv = cuda::driver();
  if (!drv) return "no CUDA driver";
  if (!drv->hasStreams)
    return drv->lib.path() +
           " lacks part of the stream API the staged path needs (cuMemcpyAsync, "
           "cuLaunchHostFunc, cuStreamWaitValue32_v2, cuMemHostAlloc, cuEventRecord ...)";
  return "";
}

void launchStaged(std::span<const Op> ops) {
  const cuda::Driver* drv = cuda::driver();
  std::string why = stagedUnavailableReason();
  if (!why.empty())
    LOOM_THROW(kInvalidUsage, "rank %d: %s on device buffers: Loom's staged path is unavailable: %s",
               ops[0].comm.core->rank(), collectiveName(ops[0].coll), why.c_str());
  staged::launch(*drv, ops);
}

StagedProxy::~StagedProxy() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wakeAll();
  if (thread_.joinable()) thread_.join();
}

void StagedProxy::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
}

void StagedProxy::push(StagedRecord* rec) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    queue_.push_back(rec);
    queued_.fetch_add(1, std::memory_order_acq_rel);
  }
  wakeAll();
}

void StagedProxy::drain() {
  waitFor([&] { return queued_.load(std::memory_order_acquire) == 0; });
}

void StagedProxy::loop() {
  tlsOnProxy = true;
  auto aborted = [&] { return abort_ && abort_->load(std::memory_order_relaxed); };
  for (;;) {
    StagedRecord* rec = nullptr;
    waitFor([&] {
      std::lock_guard<std::mutex> lock(mu_);
      if (!queue_.empty()) rec = queue_.front();
      return rec != nullptr || stop_;
    });
    if (!rec) return;  // stopped with nothing queued
    waitFor([&] {
      return rec->gate.load(std::memory_order_acquire) ||
             rec->cancelled.load(std::memory_order_acquire) || aborted();
    });
    // The last proxy to reach a record runs it: every communicator's earlier records
    // are done by then.
    if (rec->arrivals.fetch_sub(1, std::memory_order_acq_rel) == 1) runRecord(rec);
    else waitFor([&] { return rec->done.load(std::memory_order_acquire); });
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.pop_front();
    }
    dropHold(rec);
    queued_.fetch_sub(1, std::memory_order_acq_rel);
    wakeAll();
  }
}

}  // namespace loom
