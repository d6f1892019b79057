// The engine's view of a communicator: its bootstrap, peers, connections, rings, and the
// knobs that shape its FIFOs. Created collectively by every rank.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "algo/cost_model.h"
#include "algo/ring.h"
#include "algo/select.h"
#include "bootstrap/bootstrap.h"
#include "engine/cpu_executor.h"
#include "engine/device_board.h"
#include "engine/device_exec.h"
#include "engine/flight_recorder.h"
#include "engine/plan_cache.h"
#include "engine/staged.h"
#include "engine/tuner_plugin.h"
#include "transports/transport.h"

namespace loom {

class Communicator {
 public:
  // Joins `job` as `rank` of `nranks`: rendezvous, peer exchange, ring connections.
  // `configMin/MaxCtas` (> 0): ncclConfig_t's minCTAs / maxCTAs (algo/select.h).
  Communicator(const JobId& job, int rank, int nranks, const std::atomic<bool>* abortFlag, int configMinCtas = 0,
               int configMaxCtas = 0);
  ~Communicator();

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  Bootstrap& bootstrap() { return *bootstrap_; }
  TransportManager& transports() { return *transports_; }
  const std::vector<PeerInfo>& peers() const { return peers_; }
  const Ring& ring() const { return planCtx_.ring(0); }  // channel 0's
  // What plan builders need to know about this communicator (ring, FIFO shape, NCCL_ALGO).
  const PlanContext& planContext() const { return planCtx_; }
  const std::atomic<bool>* abortFlag() const { return abort_; }
  uint64_t commHash() const { return commHash_; }
  int localRanks() const;  // ranks on this host (including this one)
  // More ranks of this communicator on this host than the host's CPUs (base/host.h).
  bool oversubscribed() const { return oversubscribed_; }
  // LOOM_LOCAL_DIRECT as it was at init (engine/direct_moves.h).
  bool localDirect() const { return localDirect_; }
  // Host-memory work runs on the plan interpreter's host threads (LOOM_EXECUTOR=interp).
  uint8_t interp() const { return interp_; }  // Task::kCpu, kInterpSimple or kInterpLL

  // Makes sure the connections a plan needs exist (collective between each pair).
  void connect(const std::vector<TransportManager::ConnKey>& sends,
               const std::vector<TransportManager::ConnKey>& recvs);
  // Operation sequence numbers (#seq in logs and errors), one per launched task.
  uint64_t nextSeq() { return ++seq_; }
  PlanCache& planCache() { return planCache_; }
  // The last operations and per-collective totals (flight_recorder.h).
  FlightRecorder& recorder() { return *recorder_; }
  // Runs this communicator's host-memory work; asynchronous launches queue here in order.
  CpuExecutor& executor() { return *executor_; }
  // Device-memory work of the staged path (engine/staged.h); its thread starts on first use.
  StagedProxy& staged();
  // Waits for the staged work (released at once when aborted) and stops its thread.
  void stopStaged() {
    delete staged_.exchange(nullptr);
    if (deviceExec_) deviceExec_->detach();
  }
  // Ranks of this communicator in this process on this rank's CUDA device (threads sharing
  // one context): their staged calls run on the caller's thread (engine/staged.h).
  const std::vector<int>& sameContextRanks() const { return sameContext_; }
  void setSameContextRanks(std::vector<int> ranks) { sameContext_ = std::move(ranks); }
  // Every rank of this communicator shares this rank's CUDA context.
  bool allInOneContext() const { return sameContext_.size() + 1 == static_cast<size_t>(nranks_); }
  // Ranks that are processes on one GPU (every rank of the communicator): their
  // collectives meet on this board (engine/device_board.h); nullptr otherwise.
  DeviceBoard* deviceBoard() const { return board_.get(); }
  void setDeviceBoard(std::unique_ptr<DeviceBoard> b) { board_ = std::move(b); }
  // The device executor serving this communicator's device-buffer collectives
  // (engine/device_exec.h); nullptr: the staged path serves them.
  DeviceExec* deviceExec() const { return deviceExec_.get(); }
  void setDeviceExec(std::unique_ptr<DeviceExec> e) { deviceExec_ = std::move(e); }
  // Numbers the staged collectives that such ranks meet for (the same on every rank).
  uint64_t nextMeeting() { return ++meetings_; }
  // A host-memory call waits for the staged work issued before it (not on a proxy).
  void drainStaged() {
    StagedProxy* p = staged_.load(std::memory_order_acquire);
    if (__builtin_expect(p != nullptr, 0) && p->busy() && !onStagingProxy()) p->drain();
  }
  // Working space for plans (scratchBytes), kept between calls: a fresh buffer per call
  // would be zeroed and page-faulted in every time. Grows to the largest request; the
  // tasks of one communicator run one after another, so they can all use it.
  void* scratch(size_t bytes);
  size_t scratchBytes() const { return scratchBytes_; }
  std::string initSummary() const;

 private:
  int rank_;
  int nranks_;
  const std::atomic<bool>* abort_;
  uint64_t commHash_;
  std::unique_ptr<FlightRecorder> recorder_;
  std::unique_ptr<Bootstrap> bootstrap_;
  std::vector<PeerInfo> peers_;
  std::unique_ptr<TransportManager> transports_;
  std::unique_ptr<TunerPlugin> tuner_;  // NCCL tuner plugin (null: none); planCtx_ was ranked with it
  PlanContext planCtx_;
  std::vector<int> pidfds_;  // same-host peers in other processes: readable once they exit
  std::vector<int> sameContext_;
  std::unique_ptr<DeviceBoard> board_;
  std::unique_ptr<DeviceExec> deviceExec_;  // released first at destroy: it uses the bootstrap
  uint64_t meetings_ = 0;
  uint64_t seq_ = 0;
  bool oversubscribed_ = false;
  bool localDirect_ = true;
  uint8_t interp_ = 0;
  std::unique_ptr<char[]> scratch_;
  size_t scratchBytes_ = 0;
  PlanCache planCache_;
  // Last: its worker thread stops (and its queued work ends) before anything above goes.
  std::unique_ptr<CpuExecutor> executor_ = std::make_unique<CpuExecutor>();
  std::mutex stagedMu_;
  std::atomic<StagedProxy*> staged_{nullptr};  // owned; stopped first in the destructor

  // The hosts' cost model, alike on every rank (see the .cc), and whether any rank has a
  // tuner plugin (`tunerError`: this rank's failed to initialise).
  algo::NodeModel tuningModel(const std::optional<Error>& tunerError, bool* anyTuner);
  // With a tuner plugin on some rank: every rank must have ranked the candidates alike.
  void agreeOnRanking();
};

}  // namespace loom
