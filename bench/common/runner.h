// The harness proper: one BenchProcess per process sets up communicators (one per thread,
// -t), prints nccl-tests' header and footer from global rank 0, and runs one RankRunner per
// thread through nccl-tests' sweep: types x ops x roots, sizes, out-of-place then in-place.
#pragma once

#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/bench_error.h"
#include "bench/common/collective.h"
#include "bench/common/cuda_memory.h"
#include "bench/common/json_report.h"
#include "bench/common/launcher.h"
#include "bench/common/options.h"
#include "bench/common/split.h"

namespace loom::bench {

struct RunInputs {
  Options opts;
  const Collective* coll = nullptr;
  Placement placement;
  std::string programName;
  int argc = 0;
  const char* const* argv = nullptr;
  TestSplit split;  // NCCL_TESTS_SPLIT(_MASK)
};

// -T: a rank stuck in one call for longer than the timeout aborts the process's
// communicators and exits with nccl-tests' timeout code.
class Watchdog {
 public:
  Watchdog(int timeoutSec, int nThreads, std::function<void(int thread)> onTimeout);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  class Busy {
   public:
    Busy(Watchdog& w, int thread) : w_(w), thread_(thread) { w_.enter(thread_); }
    ~Busy() { w_.leave(thread_); }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;

   private:
    Watchdog& w_;
    int thread_;
  };

 private:
  void enter(int thread);
  void leave(int thread);
  void loop();
  const int timeoutSec_;
  std::function<void(int)> onTimeout_;
  // Per thread: calls entered plus calls left, so odd while in a call. Plain stores by the
  // owning thread, no clock read per call: at 8 B a call costs a few hundred ns.
  std::vector<std::atomic<uint64_t>> edges_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

class BenchProcess {
 public:
  explicit BenchProcess(const RunInputs& in);
  ~BenchProcess();
  int run();  // the process's exit code

  // ---- for RankRunner ----
  const Options& opts() const { return in_.opts; }
  const Collective& coll() const { return *in_.coll; }
  int proc() const { return in_.placement.proc; }
  int nProcs() const { return in_.placement.nProcs; }
  int nThreads() const { return in_.opts.nThreads; }
  int nranks() const { return nProcs() * nThreads(); }
  int rankOf(int thread) const { return proc() * nThreads() + thread; }
  // The CUDA driver when the buffers are device memory (-M device, or auto with a GPU);
  // nullptr for host buffers.
  const CudaDriver* cuda() const { return cuda_; }
  // The GPU of a thread's rank: ranks of a host go round its GPUs (several per GPU when
  // there are more ranks than GPUs, which Loom allows).
  int deviceOf(int thread) const {
    return (in_.placement.localRank * nThreads() + thread) % cuda_->deviceCount();
  }
  bool isPrinter(int thread) const { return proc() == 0 && thread == 0; }
  // NCCL_TESTS_SPLIT's group of this process (0 without a split).
  int color() const { return in_.split.colorOf(proc()); }
  // Prints on stdout (flushed) when `thread` is the printing rank.
  void print(int thread, const std::string& text);
  JsonReport& json() { return json_; }
  Watchdog& watchdog() { return *watchdog_; }
  size_t maxBytes() const { return maxBytes_; }
  // A rank failed: report it, abort this process's communicators (so no other thread
  // stays blocked in a collective) and exit with the error's status.
  [[noreturn]] void fatal(int thread, Status status, const std::string& message);

 private:
  void applyPlatformNotes();
  void limitToMemory();
  void initComms();
  void resolveMemory();
  std::string deviceDescription(int thread) const;
  void rankMain(int thread);
  void printHeader(const std::vector<uint8_t>& deviceLines);
  std::string splitLine() const;
  void printFooter(int thread);
  static double minBusBw();  // NCCL_TESTS_MIN_BW, -1 when unset
  void abortAll();

  RunInputs in_;
  size_t maxBytes_;
  std::vector<std::string> notes_;
  std::vector<ncclComm_t> comms_;   // per thread: the whole job's
  std::vector<ncclComm_t> groups_;  // per thread: its NCCL_TESTS_SPLIT group's (null without)
  const CudaDriver* cuda_ = nullptr;
  int version_ = 0;               // ncclGetVersion
  std::vector<int> errorCounts_;  // per thread: checks with wrong elements, all ranks
  std::vector<double> avgBusBw_;
  JsonReport json_;
  std::unique_ptr<Watchdog> watchdog_;
  std::once_flag abortOnce_;
};

// Entry point of every tool: parse, launch, run. `collective` names the tool's collective.
int benchMain(int argc, char** argv, const Collective& collective);

}  // namespace loom::bench
