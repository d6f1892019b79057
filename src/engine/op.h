// What the API hands the engine: one collective, or one side of a send/receive, with its
// arguments already checked and its buffers already classified (memory kind). The engine
// selects, plans, connects and executes; the API never sees a plan or a connection.
#pragma once

#include <atomic>
#include <cstddef>

#include "algo/collective.h"
#include "base/error.h"
#include "base/mem_kind.h"
#include "kernels/reduce.h"

namespace loom {

class Communicator;
class Profiler;

// The engine's view of a communicator for one operation: its core and the flags the API
// owns (ncclCommAbort, ncclCommRevoke), polled while the operation waits.
struct OpComm {
  Communicator* core = nullptr;
  const std::atomic<bool>* abortFlag = nullptr;
  const std::atomic<bool>* revokeFlag = nullptr;
  // Told when an operation on this communicator fails, before its connections close (the
  // API records the error there: ncclCommGetAsyncError, ncclGetLastError).
  void (*onFailure)(void* owner, const Error& e) = nullptr;
  void* owner = nullptr;
  Profiler* profiler = nullptr;  // the communicator's profiler plugin (null: none)

  // "aborted" or "revoked" once ncclCommAbort / ncclCommRevoke was called, else nullptr:
  // for waits that must end then.
  const char* interrupted() const {
    if (abortFlag && abortFlag->load(std::memory_order_relaxed)) return "aborted";
    if (revokeFlag && revokeFlag->load(std::memory_order_relaxed)) return "revoked";
    return nullptr;
  }
};

struct Op {
  Collective coll = Collective::kAllReduce;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;    // elements per rank, as the NCCL call counts them
  size_t eltSize = 1;  // bytes per element
  Reducer red;         // the reduction (built-in or the communicator's user op)
  // A pre-multiplied sum whose scalar lives in device memory (ncclScalarDevice): read when
  // the operation runs, not when it is issued. Device buffers only.
  const void* deviceScalar = nullptr;
  int dtype = 0;       // ncclDataType_t and ncclRedOp_t, for logs
  int redop = 0;
  int root = 0;  // root, or the peer of a send/receive
  bool isSend = false;
  bool isRecv = false;
  MemKind mem = MemKind::kHost;  // where the buffers live (one kind per call)
  void* stream = nullptr;        // the caller's cudaStream_t; host work completes before return
  int device = -1;               // the communicator's CUDA device (device memory)
  OpComm comm;
  void* profApi = nullptr;  // the call's CollApi / P2pApi profiler event (null: none)
  // Its profiler task event (Coll / P2p) was made when the call was queued (the staged path:
  // engine.h's profileQueued), `profTask` (null: the mask wanted none); the engine then makes
  // only the channel events.
  bool profQueued = false;
  void* profTask = nullptr;

  bool isP2p() const { return isSend || isRecv; }
  // The call, for messages: "ncclSend", "ncclRecv", or the collective as NCCL prints it.
  const char* callName() const { return isP2p() ? (isSend ? "ncclSend" : "ncclRecv") : collectiveName(coll); }
  size_t bytes() const { return count * eltSize; }
};

}  // namespace loom
