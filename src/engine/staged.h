// The staged path: device buffers served by the host engine, in stream order, without
// blocking the caller (the first CUDA executor; issue 11 item 2).
//
// For a launch on device memory, the caller's stream gets, in order:
//
//   cuMemcpyAsync  device inputs -> pinned host staging
//   cuLaunchHostFunc(arrive)       tells the communicator's staging proxy the inputs landed
//   cuStreamWaitValue32(flag == 1) the stream waits while the proxy runs the host engine
//   cuMemcpyAsync  pinned host staging -> device outputs
//   cuLaunchHostFunc(release)      the staging may be reused
//
// and the call returns. The host function only flips a word and wakes the proxy (it never
// blocks a CUDA thread); the proxy thread runs the operations, rebound to the staging
// buffers, through the engine like any host call, then sets the flag in pinned memory that
// the stream waits on. A failure (a dead peer, LOOM_TIMEOUT, an abort) still sets the
// flag, so the stream never hangs; the error reaches ncclCommGetAsyncError.
//
// Each communicator's proxy runs its records in issue order. A group spanning several
// communicators (ranks of one process driven by one thread) is one record, queued on each
// of their proxies and run by the last of them to reach it. A group on several streams
// joins them with events: the first stream waits for the others' inputs, the others wait
// for its outputs. A host-memory call on a communicator waits for its staged work first, so
// every rank runs its operations in the order it issued them.
//
// Ranks of one communicator that share a CUDA context (threads of one process on one
// device) run their staged calls on the caller's thread instead: the inputs are copied and
// waited for on the host (a host function says when), the engine runs the operations, and
// the results are copied back on the stream before the call returns. A stream held by
// cuStreamWaitValue32 for another stream of the same context may hold that stream's work
// behind it on the GPU (CUDA warns that such waits must also be ordered by dependencies it
// can see; 8 rank threads on one H100 hung), so nothing on their GPU waits for the host.
// The calls of such ranks wait for each other, as host calls do: a thread driving several
// of them issues their calls in one group. When every rank of the communicator shares the
// context, each collective's launches meet on the host first, and the last launch to
// arrive moves the data between the ranks' device buffers on its stream, joined by events
// to every rank's stream (nothing waits for the host): copies for an all-gather or a
// broadcast, the CUDA kernels module's reductions (engine/cuda_kernels.h) for an all-reduce,
// reduce or reduce-scatter; where it cannot, every rank goes to the host engine. Capturing such calls into a CUDA graph
// is refused (ncclInvalidUsage): a replay cannot run on the host.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <span>
#include <thread>

#include "engine/op.h"

namespace loom {

struct StagedRecord;

// One communicator's staging proxy: a thread, started by the first staged launch.
class StagedProxy {
 public:
  explicit StagedProxy(const std::atomic<bool>* abortFlag) : abort_(abortFlag) {}
  // Waits for the queued records (an aborted communicator releases them at once).
  ~StagedProxy();
  StagedProxy(const StagedProxy&) = delete;
  StagedProxy& operator=(const StagedProxy&) = delete;

  void start();  // starts the thread (push starts it too)
  void push(StagedRecord* rec);
  // Whether records are queued or running: one relaxed load, for the host fast path.
  bool busy() const { return queued_.load(std::memory_order_acquire) > 0; }
  // Blocks until every record pushed so far has run. Not from the proxy's own thread.
  void drain();

 private:
  void loop();

  const std::atomic<bool>* abort_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StagedRecord*> queue_;
  std::atomic<size_t> queued_{0};
  bool stop_ = false;
  std::thread thread_;
};

// Whether this driver can run the staged path ("" when it can; else why not).
std::string stagedUnavailableReason();

// Queues `ops` (device memory, checked alike) on their streams and returns. Throws
// loom::Error: kInvalidUsage (stream capture, mixed kinds), kUnhandledCudaError (the driver
// refused a stream operation; the communicators are then poisoned).
void launchStaged(std::span<const Op> ops);

// True on a staging proxy's thread: its host calls must not wait for staged work.
bool onStagingProxy();

}  // namespace loom
