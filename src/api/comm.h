// The C API's communicator object. It wraps the engine's Communicator with what the API
// needs: configuration, error state, user-defined reduction ops, and liveness for abort.
#pragma once

#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/kept_config.h"
#include "bootstrap/unique_id.h"
#include "dispatch/shadow.h"
#include "engine/communicator.h"
#include "engine/profiler_plugin.h"
#include "kernels/reduce.h"

struct ncclComm {
  int rank = -1;
  int nranks = 0;
  int cudaDev = -1;
  bool blocking = true;
  std::string commName;
  // The caller's config, kept whole: stock NCCL's shadow is made with it (blocking aside),
  // and a split given no config passes it on.
  loom::api::KeptConfig config;
  const ncclConfig_t* userConfig() const { return config.get(); }
  int configMinCtas = 0, configMaxCtas = 0;  // its minCTAs / maxCTAs (0: unset)
  loom::JobId job;

  // The profiler plugin's context for this communicator (null: none); finalised after
  // `core` is gone, so after the last work that reports to it.
  std::unique_ptr<loom::Profiler> profiler;
  std::unique_ptr<loom::Communicator> core;  // null until init completes
  // Stock NCCL's communicator over the same ranks when the fallback serves this one's
  // device-memory calls (LOOM_NCCL_FALLBACK); `deviceServer` says who serves them and why.
  std::unique_ptr<loom::dispatch::Shadow> shadow;
  std::string deviceServer;
  bool staged = false;  // no shadow: Loom's staged path serves device memory (engine/staged.h)
  bool countedLoomDevice = false;  // in countLoomServedDevice (api/stock_route.h)
  // ncclCommRegister's handles, under opsMu: stock NCCL's (device buffers on a shadow), and
  // Loom's own no-op ones.
  std::vector<void*> stockRegistrations;
  std::vector<void*> loomRegistrations;
  uint64_t serial = 0;  // set by registerComm: which communicator lives at this address
  std::atomic<bool> abortFlag{false};
  std::atomic<bool> revoked{false};
  std::atomic<int> asyncError{ncclSuccess};  // ncclInProgress while initializing
  // The init's outcome alone (asyncError also carries later errors and jobs): ncclInProgress
  // until runInit ends, then its result; core is set before it turns ncclSuccess (RAS reads).
  std::atomic<int> initState{ncclInProgress};
  std::vector<int> peerCudaDevs;  // every rank's CUDA device (-1 none), set with core
  std::thread initThread;                    // non-blocking / grouped init
  std::mutex initMu;
  std::condition_variable initCv;
  bool destroying = false;  // under initMu: destroyComm wakes the init's waiters

  // A non-blocking communicator's split, shrink or grow outside a group runs as a job on a
  // thread of its own (api/mgmt_job.h): jobRunning until it is done; jobFn names the call.
  // childInInit (under initMu) is the job's new communicator while its init runs, so that
  // an abort of this one aborts that init too.
  std::mutex jobMu;
  std::thread jobThread;
  std::atomic<bool> jobRunning{false};
  std::atomic<const char*> jobFn{""};
  ncclComm* childInInit = nullptr;

  std::atomic<int> activeCalls{0};  // API calls running on this comm (abort waits for them)
  // Set by the one call that frees the comm (destroy, abort, or a blocking init that
  // failed), so that two of them racing never free it twice. Read under a CallScope.
  std::atomic<bool> teardown{false};
  std::atomic<bool> finalized{false};  // atomic: RAS reads it from its own thread

  struct UserOp {
    bool live = false;
    int dtype = 0;
    loom::Reducer red;
    // ncclScalarDevice: the scalar's device address, read when each operation runs (the
    // staged path copies it from the stream); null for ncclScalarHostImmediate.
    const void* deviceScalar = nullptr;
    bool hasStockOp = false;  // its twin on the shadow communicator
    ncclRedOp_t stockOp = ncclSum;
  };
  std::vector<UserOp> userOps;
  std::mutex opsMu;
  // Every built-in (type, op) reducer, made once at init: a call only copies one.
  loom::Reducer builtinOps[ncclNumTypes][ncclNumOps];

  std::mutex errMu;
  std::string lastError;

  // ncclCommGetUniqueId's id for the next ncclCommGrow (api/grow.cc): one at a time, each
  // used once. Under growMu.
  std::mutex growMu;
  bool growIdPending = false;
  uint8_t growId[loom::kUniqueIdBytes] = {};

  // Runs the collective init (bootstrap, connections); records the outcome.
  void runInit() noexcept;
  void waitInit();
};

namespace loom::api {

// Communicator registry: lets every entry point reject destroyed or foreign handles
// without touching freed memory.
void registerComm(ncclComm_t comm);
void unregisterComm(ncclComm_t comm);
// With a serial (ncclComm::serial), also that it is the same communicator, not one made
// since at the address of a freed one.
bool isLiveComm(ncclComm_t comm, uint64_t serial = 0);
// Every live communicator with its serial (for enterCall), e.g. for RAS reports.
std::vector<std::pair<ncclComm_t, uint64_t>> liveComms();
// Records comm's last error if comm is still live; safe against a concurrent destroy.
void setCommLastError(ncclComm_t comm, const std::string& msg);

// Waits for comm's init; throws if an abort or destroy ended the wait before the init did.
// Only then may comm->core be read.
void waitInitOrThrow(ncclComm_t comm, const char* fn);

// Validates `comm` for an operation: live, initialized (waits for a non-blocking init),
// not aborted or failed. Throws with a message naming `fn`.
void checkComm(ncclComm_t comm, const char* fn);
// For management calls (split, shrink) that stay allowed on a revoked or failed
// communicator: live, initialized and not aborted.
void checkCommForManagement(ncclComm_t comm, const char* fn);

// Holds comm->activeCalls for the duration of a call, so that a destroy or abort on
// another thread frees comm only after it; throws kInvalidArgument if comm is not live.
// (Every guard() with a live comm holds one already: see enterCall in guard.h.)
class CallScope {
 public:
  explicit CallScope(ncclComm_t c, uint64_t serial = 0);
  // Takes over a count that enterCall(c) returned true for.
  enum Adopt { kEntered };
  CallScope(Adopt, ncclComm_t c) : c_(c) {}
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  ncclComm_t c_;
};

// Frees a communicator: joins its init thread and releases every resource.
void destroyComm(ncclComm_t comm);
// Uses up comm's pending grow id (api/grow.cc), if any, and calls off its root's
// rendezvous: new ranks waiting there fail at once.
void cancelPendingGrowId(ncclComm_t comm);

}  // namespace loom::api
