// The device executor (issue 11 item 3): a communicator's device-buffer collectives run as
// the plan-interpreter kernel of Loom's CUDA kernels module (loomCudaInterpLaunch, one block
// per channel) on the caller's stream, over connection FIFOs in GPU memory
// (engine/device_fifos.h). The call returns once the kernel is queued; nothing waits on the
// host, and nothing on the GPU waits for the host.
//
// Opt-in while it has not run on a GPU: LOOM_DEVICE_EXECUTOR=kernel on every rank. It serves
// a communicator when every rank asks for it and every rank can: one pid namespace per host,
// a CUDA device on every rank, a driver with IPC, the kernels module, at most 8 ranks, peer
// access between the devices of ranks that share a process, a small allocation of every
// peer process of its host mapped through CUDA IPC at init, and, where the ranks span
// hosts, a network backend that starts (engine/device_net.h: ranks on other hosts are
// reached through it, with the Simple protocol only). Otherwise (said at INFO) the staged path
// serves the communicator's device buffers, as without the knob.
//
// Per launch: the plan (the host engine's, from the communicator's plan cache), copied once
// to device memory as a FlatPlan with the table of its FIFO ends; its connections made on
// first use; a scratch buffer of the executor's own. The kernels of one communicator run one
// after another: a launch on another stream than the last waits for the last one's event,
// since each FIFO end's step counter is handed from kernel to kernel. A group's sends and
// receives on the communicator are one kernel, after its collectives (engine.h: p2pPlan, its
// buffers' addresses in the plan, so copied to device memory per call into blocks reused
// once their kernel has ended; during a capture into memory kept until the executor goes),
// on the first one's stream. A group's streams are joined: its first kernel waits for the
// other streams, each kernel for the one before, and every stream for the last. A
// pre-multiplied sum whose scalar lives in device memory stays on the staged path (a rule of
// the call's arguments, alike on every rank).
//
// Failures: a watchdog thread of the executor sets the kernels' abort word (host memory the
// kernel polls) on ncclCommAbort / ncclCommRevoke and when a peer process has exited while a
// kernel stayed in flight for 2 s (a peer that finished and left is no failure), and reports
// a kernel's failed status (mismatched calls) and a dead peer to the communicator
// (ncclCommGetAsyncError); the stream then runs on, with the collective's output undefined.
// A failed status stays: the rank's later kernels return at once. At destroy the device is
// synchronized (the watchdog still stopping kernels whose peer died) before memory goes; a
// sending kernel ends only once its receiver released every step, so no peer writes into
// memory this rank frees.
//
// Ranks that are threads of one process on one device (sharing its CUDA context) are not
// served: every rank keeps the staged path, whose direct collectives suit them.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/cuda_driver.h"
#include "engine/cuda_kernels.h"
#include "engine/device_fifos.h"
#include "engine/op.h"
#include "engine/plan_cache.h"
#include "transports/peer_info.h"

namespace loom {

class Bootstrap;
class DeviceNet;
struct CachedPlan;

// This rank asks for the device executor (LOOM_DEVICE_EXECUTOR=kernel).
bool deviceExecutorWanted();

class DeviceExec {
 public:
  // Collective over the bootstrap when `allWant` (every rank asked; the same on every rank);
  // nullptr on every rank unless every rank can. `devices[r]`: rank r's CUDA device.
  // `host`: the communicator's plan context; the executor's own is the same with the GPU
  // model of this host (engine/device_exec.cc: devicePlans), where every rank has the same.
  // `sameContext`: Communicator::sameContextRanks (this rank is not served when any).
  static std::unique_ptr<DeviceExec> create(Bootstrap& bs, const std::vector<PeerInfo>& peers,
                                            const std::vector<int>& devices, const PlanContext& host,
                                            const std::vector<int>& sameContext, bool allWant);
  ~DeviceExec();
  DeviceExec(const DeviceExec&) = delete;
  const PlanContext& planContext() const { return ctx_; }  // what its plans are selected for
  DeviceExec& operator=(const DeviceExec&) = delete;

  // Whether this executor runs `op`: a send, a receive, a collective without a device scalar,
  // on device memory or on nothing (a count of 0). Host memory in a group of device
  // memory is refused (engine.cc) before anything of the group launches.
  static bool takes(const Op& op) {
    return !op.deviceScalar && (op.mem != MemKind::kHost || op.bytes() == 0);
  }
  struct OnDevice;  // a plan in device memory
  // One collective, or a group's sends and receives, made ready to launch: its plan (in
  // device memory), protocol, capture.
  struct Launch {
    const Op* op = nullptr;  // the collective; the first send or receive
    std::shared_ptr<CachedPlan> cp;  // a collective's
    OnDevice* d = nullptr;
    bool ll = false;
    bool capture = false;
    std::vector<const Op*> p2p;           // the sends and receives (none: a collective)
    std::shared_ptr<const Plan> p2pPlan;  // theirs
    std::shared_ptr<OnDevice> own;        // their plan in device memory
    int block = -1;                       // ... in this block of blocks_ (-1: memory of its own)
  };
  // Makes the plans of `ops` (this executor's, in issue order) ready before any of them
  // launches: their connections, collective between pairs of ranks, in one exchange per
  // pair. One launch per collective, in issue order, then one for all the sends and receives.
  // A thread that drives several ranks prepares them all (concurrently) before launching
  // any. Throws loom::Error (kInvalidUsage: a default stream on a device ranks share).
  std::vector<Launch> prepare(std::span<const Op* const> ops);
  // Queues a prepared collective on its stream. Throws loom::Error.
  void launch(const Launch& l);
  // After the launches of one prepare: every stream of the group waits for its last kernel
  // (a group's streams are joined, as NCCL joins them). Throws loom::Error.
  void finishGroup();
  // Reports a failed kernel's status to the communicator now (the watchdog does every
  // 10 ms): ncclCommGetAsyncError asks, so that a stream that went on shows why at once.
  void poll();
  // The communicator's API object is going: the watchdog no longer reports to it (it still
  // stops the kernels when a peer dies, until the destructor has synchronized).
  void detach();

 private:
  DeviceExec(Bootstrap& bs, const cuda::Driver& drv, const cuda::Kernels& k, std::vector<PeerInfo> peers,
             int device, FifoShape shape, std::vector<bool> sameProcess, std::unique_ptr<DeviceNet> net);
  OnDevice& ready(const std::shared_ptr<CachedPlan>& cp, bool ll, const Op& op);
  void readyP2p(Launch& l);
  std::vector<loomCudaFifo> fifoTable(const Plan& plan, bool ll) const;
  // A copy of host bytes for the device: the bytes go into pinned memory now and reach the
  // device by a copy queued on the stream of the launch that first uses them (`pending`),
  // never by waiting on the host. A host wait for the device could deadlock: the executor's
  // stream may share a GPU work queue with a stream that waits for another rank's kernel,
  // which waits for this rank (seen with 8 rank threads on an H100).
  struct Upload {
    cuda::CuDevicePtr dst;
    const void* src;  // pinned, kept until the executor goes
    size_t bytes;
  };
  cuda::CuDevicePtr deviceCopy(const void* src, size_t bytes, std::vector<Upload>* pending);
  void* pinned(size_t bytes);  // pinned host memory, kept until the executor goes
  size_t llStageBytes() const;
  bool useLL(const Op& op) const;
  void setDevice(cuda::ScopedDevice& sd) const;
  bool capturing(const Op& op) const;
  void stopWatchdog();
  void check(cuda::CuResult r, const char* what) const;
  void watch();
  void stopKernels();
  bool inFlight() const;
  void report(Code code, const std::string& what);

  const cuda::Driver& drv_;
  const cuda::Kernels& kernels_;
  std::vector<PeerInfo> peers_;
  int rank_, device_;
  cuda::CuStream setup_ = nullptr;  // the executor's own stream (zeroing FIFOs)
  cuda::CuEvent last_ = nullptr;    // recorded after each kernel
  std::atomic<bool> eagerLaunched_{false};     // last_ marks a kernel queued outside a capture
  std::atomic<bool> capturedLaunched_{false};  // a kernel was captured into a graph
  std::atomic<bool> stopped_{false};           // stopKernels() ran
  uint32_t* words_ = nullptr;       // pinned, mapped: [0] abort word, [1] kernels' status
  cuda::CuDevicePtr deviceWords_ = 0;  // the same, as the kernels address them
  std::unique_ptr<DeviceNet> net_;  // peers on other hosts (null: every rank on this host)
  std::vector<bool> remote_;         // per rank: on another host
  std::unique_ptr<DeviceFifos> fifos_;
  PlanContext ctx_;    // what device plans are selected and built for
  PlanCache cache_;    // device plans (the host engine's cache holds host plans)
  std::unordered_map<const CachedPlan*, std::unique_ptr<OnDevice>> plans_;
  struct Growing {
    cuda::CuDevicePtr p = 0;
    size_t bytes = 0;
  };
  void atLeast(Growing& buf, size_t bytes, size_t alloc, const char* what);
  Growing scratch_;
  std::vector<cuda::CuDevicePtr> retired_;  // outgrown scratch: a queued kernel may use it
  std::vector<cuda::CuDevicePtr> kept_;     // plans and FIFO tables in device memory
  Growing llStaging_;                       // LL: two regions per channel
  // Device memory for the plans of sends and receives, one launch's each, reused once
  // `done` (recorded after the launch) has passed; never freed before the executor goes
  // (cuMemFree may wait for the device, where a peer's kernel may wait for this rank).
  struct Block {
    cuda::CuDevicePtr p = 0;
    size_t bytes = 0;
    cuda::CuEvent done = nullptr;
    char* host = nullptr;  // pinned, `bytes` long: what is copied to p before the launch
    size_t used = 0;       // of host
    bool valid = false;    // p holds host[0, used) (its copy was queued before a kernel)
    // launched: until `done` has passed; lost: its event could not be recorded (never reused)
    enum { kFree, kPrepared, kLaunched, kLost } state = kFree;
  };
  std::vector<Block> blocks_;
  cuda::CuEvent join_ = nullptr;  // joins a group's streams
  std::vector<cuda::CuStream> group_;   // the streams of the group prepare made ready
  cuda::CuStream groupLast_ = nullptr;  // the stream of its last kernel so far
  size_t slotBytes_ = 0;                    // of every device FIFO
  uint64_t llMostBytes_ = 0;                // LOOM_DEVICE_LL_BYTES
  std::array<bool, kCollectiveCount> llAllowed_{};  // NCCL_PROTO allows LL, per collective
  std::vector<void*> pinned_;               // pinned chunks (pinned())
  char* pinNext_ = nullptr;                 // ... the free part of the last
  size_t pinLeft_ = 0;
  bool launched_ = false;

  std::mutex mu_;  // launches (a communicator may be driven from several threads in turn)

  // The watchdog: started by the first launch.
  OpComm comm_;
  std::mutex watchMu_;
  std::condition_variable watchCv_;
  bool stop_ = false;
  bool reported_ = false;
  std::optional<std::chrono::steady_clock::time_point> peerGoneSince_;  // watch()
  bool detached_ = false;
  std::thread watchdog_;
};

}  // namespace loom
