// The CPU executor: runs the plans of one or more tasks (possibly on different
// communicators) to completion on the calling thread, interleaving them so that
// operations which need each other (ranks of one process driven by one thread, send/recv
// pairs of a group) all make progress. Waiting spins briefly, then yields, then sleeps, so
// ranks that wait do not burn the cores their peers need.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "algo/plan.h"
#include "base/error.h"
#include "kernels/reduce.h"
#include "transports/transport.h"

namespace loom {

class Communicator;
class FlightRecorder;
struct FlightEntry;
class TaskProfile;

// One plan bound to buffers and a reduction, on one communicator.
struct Task {
  const Plan* plan = nullptr;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  void* scratch = nullptr;  // plan->scratchBytes of working space (the communicator's)
  // Per-channel buffer overrides (p2p batches: one channel per operation); empty = use above.
  std::vector<const void*> chanSend;
  std::vector<void*> chanRecv;
  Reducer red;
  size_t eltSize = 1;
  size_t count = 0;  // elements, as the plan's builder counts them (size-free plans)
  TransportManager* transports = nullptr;
  const std::atomic<bool>* abortFlag = nullptr;   // ncclCommAbort
  const std::atomic<bool>* revokeFlag = nullptr;  // ncclCommRevoke
  int rank = -1;
  uint64_t seq = 0;          // operation sequence number, for messages
  const char* name = "";     // "AllReduce", ...
  bool oversubscribed = false;  // this host runs more ranks than it has CPUs for
  // kCpu: the CPU executor; else the plan interpreter (engine/interp_executor.h) with the
  // Simple or the LL protocol.
  enum : uint8_t { kCpu, kInterpSimple, kInterpLL };
  uint8_t interp = kCpu;
  Communicator* core = nullptr;        // for the job view in time-out messages
  FlightRecorder* recorder = nullptr;  // the communicator's flight recorder
  FlightEntry* rec = nullptr;          // this operation's entry there (nullptr: recorder off)
  // Its profiler plugin's channel events (engine/profiler_plugin.h; null: no plugin).
  std::shared_ptr<TaskProfile> prof;
};

// Runs every task to completion. Tasks of one communicator must be given in issue order;
// they run one after another, tasks of different communicators concurrently. Throws
// loom::Error (kRemoteError for a dead peer, kInvalidUsage after an abort, ...).
// Tasks with `interp` set run on the plan interpreter's host threads instead.
void runTasks(std::span<Task* const> tasks);

// The waiting policy host executors share: polls before a waiting thread yields
// (LOOM_SPIN_COUNT; none when the host is oversubscribed and the knob is unset), and the
// seconds without progress before an operation fails (LOOM_TIMEOUT; 0: none).
int64_t hostSpinPolls(bool oversubscribed);
double hostTimeoutSec();

// The host executors' stall checks. `e` with the operation it interrupted named.
Error taskError(const Task& t, const Error& e);
// Throws when the task's communicator was aborted or revoked.
void throwIfInterrupted(const Task& t);
// A connection the task waits on: throws if its peer is gone (checkPeer), or when the task
// has made no progress for LOOM_TIMEOUT (timeoutSec > 0), asking the job who holds it up.
void probeWait(const Task& t, Connection* c, double idleSec, double timeoutSec);

}  // namespace loom
