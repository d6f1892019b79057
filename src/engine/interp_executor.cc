#include "engine/interp_executor.h"

#include <sched.h>
#include <time.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "base/time.h"
#include "engine/flat_plan.h"
#include "engine/flight_recorder.h"
#include "engine/host_step_ops.h"
#include "engine/profiler_plugin.h"
#include "kernels/interp.h"

namespace loom {
namespace {

StringKnob kExecutor("LOOM_EXECUTOR", "", "cpu",
                     "What runs host-memory plans of communicators created from then on: cpu "
                     "(the CPU executor) or interp (the device executor's plan interpreter on "
                     "host threads, one per channel as a GPU runs one block per channel; for "
                     "tests: slower, several threads per rank)",
                     KnobScope::kJob);
StringKnob kInterpProto("LOOM_INTERP_PROTO", "", "simple",
                        "Protocol of the plan interpreter (LOOM_EXECUTOR=interp): simple, or ll "
                        "(flagged 8-byte lines, half a slot per piece, on connections whose slots "
                        "both ends share). Every rank of a job must use the same",
                        KnobScope::kJob);

// A channel's FIFOs, as a kernel would find them in its connection table.
struct HostEnv {
  TransportManager* tm = nullptr;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  void* scratch = nullptr;

  std::vector<char> stage[2];  // LL staging

  FifoEnd* recvFifo(int peer, int conn) { return &tm->recvConn(peer, conn)->fifo(); }
  FifoEnd* sendFifo(int peer, int conn) { return &tm->sendConn(peer, conn)->fifo(); }
  // LL lines need slots both ends share; a transport that ships slots carries them plain.
  static bool sharedSlots(const Connection* c) { return !c->needsProgress() && !c->progressOnProxy(); }
  bool llRecv(int peer, int conn) const { return sharedSlots(tm->recvConn(peer, conn)); }
  bool llSend(int peer, int conn) const { return sharedSlots(tm->sendConn(peer, conn)); }
  void* llStage(int which, size_t bytes) {
    if (stage[which].size() < bytes || stage[which].empty()) stage[which].resize(bytes + 64);
    return stage[which].data();
  }
  const char* ptr(BufRef r, size_t off) const { return bufAt(r, off, sendbuf, recvbuf, scratch); }
};

using Interp = ChannelInterp<HostAtomics, HostEnv>;

// Waiting: spin, then yield, then sleep in growing steps up to 50 us.
void backoff(int64_t idle, int64_t spin) {
  if (idle < spin) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else if (idle < spin + 1000) {
    sched_yield();
  } else {
    timespec ts{0, idle < spin + 2000 ? 2000 : 50000};
    nanosleep(&ts, nullptr);
  }
}

// One task in flight: its flat plan and one thread per channel.
class TaskRun {
 public:
  TaskRun(Task& t, int64_t spin, bool ll) : t_(t), flat_(*t.plan), spin_(spin), ll_(ll) {
    const size_t n = t.plan->channels.size();
    waits_ = std::make_unique<std::atomic<uint64_t>[]>(n);
    left_.store(n);
    threads_.reserve(n);
    for (size_t ch = 0; ch < n; ++ch) waits_[ch].store(0);
    try {
      for (size_t ch = 0; ch < n; ++ch) threads_.emplace_back([this, ch] { runChannel(ch); });
    } catch (const std::system_error& e) {
      stop();  // the channels that started leave at their next wait
      LOOM_THROW(kSystemError, "rank %d: %s #%llu: cannot start a thread for each of its %zu "
                 "channels (LOOM_EXECUTOR=interp): %s", t.rank, t.name,
                 static_cast<unsigned long long>(t.seq), n, e.what());
    }
  }
  ~TaskRun() { stop(); }

  bool finished() const { return left_.load(std::memory_order_acquire) == 0; }
  uint64_t progress() const { return progress_.load(std::memory_order_relaxed); }
  // The channels' abort word: they stop at their next wait.
  void stop() {
    stop_.store(true, std::memory_order_relaxed);
    for (auto& th : threads_)
      if (th.joinable()) th.join();
  }
  // The first error a channel raised, if any.
  std::optional<Error> error() {
    if (!failed_.load(std::memory_order_acquire)) return std::nullopt;
    std::lock_guard<std::mutex> lk(mu_);
    return error_;
  }
  // The connections the channels wait on now: (send?, connection).
  std::vector<std::pair<bool, Connection*>> waits() const {
    std::vector<std::pair<bool, Connection*>> out;
    for (size_t ch = 0; ch < t_.plan->channels.size(); ++ch) {
      const uint64_t w = waits_[ch].load(std::memory_order_relaxed);
      if (!w) continue;
      const bool send = w & 2;
      const int peer = static_cast<int>((w >> 2) & 0xffffffffu), conn = static_cast<int>(w >> 34);
      out.emplace_back(send, send ? t_.transports->sendConn(peer, conn) : t_.transports->recvConn(peer, conn));
    }
    return out;
  }

 private:
  void runChannel(size_t ch) {
    try {
      HostEnv env;
      env.tm = t_.transports;
      env.sendbuf = ch < t_.chanSend.size() ? t_.chanSend[ch] : t_.sendbuf;
      env.recvbuf = ch < t_.chanRecv.size() ? t_.chanRecv[ch] : t_.recvbuf;
      env.scratch = t_.scratch;
      std::vector<char> tmp;
      HostStepOps ops;
      ops.red = &t_.red;
      ops.tmp = &tmp;
      const bool hasPost = t_.red.hasPost();
      Interp in(flat_.plan(), ch, t_.count, t_.eltSize, ll_);
      int64_t idle = 0;
      while (!in.done()) {
        if (in.ready(env)) {
          if (idle) waits_[ch].store(0, std::memory_order_relaxed);
          idle = 0;
          const Step& s = in.current();
          ops.rc = s.recvPeer >= 0 ? t_.transports->recvConn(s.recvPeer, s.conn) : nullptr;
          if (!in.run(env, ops, hasPost)) {
            size_t posted = 0;
            llArrived<HostAtomics>(env.recvFifo(s.recvPeer, s.conn)->recvSlot(),
                                   env.recvFifo(s.recvPeer, s.conn)->step, &posted);
            LOOM_THROW(kInvalidUsage,
                       "%s sent %zu bytes where %zu were expected; do all ranks call the same "
                       "collective with the same count and datatype?",
                       ops.rc->describe().c_str(), posted,
                       in.pieceBytes(env.recvFifo(s.recvPeer, s.conn)->slotBytes));
          }
          progress_.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        if (stop_.load(std::memory_order_relaxed)) break;
        // What it waits on, for the liveness probes: again now and then, as a step that
        // waited to receive may go on to wait to send.
        if ((idle++ & 255) == 0) waits_[ch].store(waitKey(in.current(), env), std::memory_order_relaxed);
        backoff(idle, spin_);
      }
    } catch (const Error& e) {
      fail(e);
    } catch (const std::exception& e) {
      fail(Error(Code::kInternalError, e.what()));
    }
    left_.fetch_sub(1, std::memory_order_acq_rel);
  }

  // What the step waits for: its receive while nothing has arrived, else its send
  // (bit 0 set: a wait; bit 1: on a send; the peer from bit 2, the connection from bit 34).
  static uint64_t waitKey(const Step& s, HostEnv& env) {
    const bool recvWait = s.recvPeer >= 0 && !env.recvFifo(s.recvPeer, s.conn)->canRecv();
    const int peer = recvWait ? s.recvPeer : s.sendPeer;
    if (peer < 0) return 0;
    return (uint64_t(s.conn) << 34) | (uint64_t(uint32_t(peer)) << 2) | (recvWait ? 0 : 2) | 1;
  }

  void fail(const Error& e) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!failed_.load(std::memory_order_relaxed)) error_ = e;
    failed_.store(true, std::memory_order_release);
    stop_.store(true, std::memory_order_relaxed);
  }

  Task& t_;
  const FlatPlanBlock flat_;
  const int64_t spin_;
  const bool ll_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::atomic<size_t> left_{0};
  std::atomic<uint64_t> progress_{0};
  std::unique_ptr<std::atomic<uint64_t>[]> waits_;  // per channel: 0, or what it waits on
  std::mutex mu_;
  std::optional<Error> error_;
  std::vector<std::thread> threads_;
};

// The tasks of one communicator, run one after another.
struct Queue {
  TransportManager* transports = nullptr;
  std::vector<Task*> tasks;
  size_t next = 0;
  std::unique_ptr<TaskRun> run;
  uint64_t seen = 0;  // the run's progress at the last look

  bool done() const { return next >= tasks.size(); }
  Task* current() const { return done() ? nullptr : tasks[next]; }
};

// Starts, drives and completes the current task of q. Returns true if anything moved.
bool advance(Queue& q, int64_t spin) {
  Task* t = q.current();
  if (!t) return false;
  bool any = false;
  for (Connection* c : t->transports->active()) any |= c->progress();
  if (!q.run) {
    if (t->plan->scratchBytes > 0 && !t->scratch)
      LOOM_THROW(kInternalError, "rank %d: %s #%llu needs %zu bytes of scratch and has none",
                 t->rank, t->name, static_cast<unsigned long long>(t->seq), t->plan->scratchBytes);
    if (FlightEntry* e = FlightRecorder::held(t->rec, t->seq)) e->start();
    if (t->prof) t->prof->begin();
    q.run = std::make_unique<TaskRun>(*t, spin, t->interp == Task::kInterpLL);
    q.seen = 0;
    return true;
  }
  if (auto err = q.run->error()) throw taskError(*t, *err);
  const uint64_t p = q.run->progress();
  any |= p != q.seen;
  q.seen = p;
  if (!any) any = t->transports->pumpProxied();  // as the CPU executor does (executor.cc)
  if (!q.run->finished()) return any;
  // Data a socket connection holds locally must reach the peer before the task completes.
  for (Connection* c : t->transports->buffered())
    if (!c->fifo().drained()) return any;
  q.run.reset();
  if (t->recorder) t->recorder->complete(t->rec, t->seq);
  if (t->prof) t->prof->end();
  ++q.next;
  return true;
}

void checkStalled(Queue& q, double idleSec, double timeoutSec) {
  Task* t = q.current();
  if (!t) return;
  throwIfInterrupted(*t);
  if (idleSec < 0.1 || !q.run) return;
  auto waits = q.run->waits();
  for (Connection* c : t->transports->buffered())
    if (!c->fifo().drained()) waits.emplace_back(true, c);
  if (!waits.empty())
    if (FlightEntry* e = FlightRecorder::held(t->rec, t->seq)) e->noteWaiting(waits[0].second->peer(), waits[0].first);
  for (auto [send, c] : waits) probeWait(*t, c, idleSec, timeoutSec);
}

}  // namespace

uint8_t interpExecutorSelected() {
  const std::string v = kExecutor.canonical();
  if (v == "cpu" || v.empty()) return Task::kCpu;
  if (v != "interp")
    LOOM_THROW(kInvalidArgument, "LOOM_EXECUTOR=%s: expected cpu or interp", kExecutor.get().c_str());
  const std::string p = kInterpProto.canonical();  // as NCCL_PROTO: any case
  if (p == "simple" || p.empty()) return Task::kInterpSimple;
  if (p == "ll") return Task::kInterpLL;
  LOOM_THROW(kInvalidArgument, "LOOM_INTERP_PROTO=%s: expected simple or ll", kInterpProto.get().c_str());
}

void runTasksInterp(std::span<Task* const> tasks) {
  std::vector<Queue> queues;
  for (Task* t : tasks) {
    size_t q = 0;
    while (q < queues.size() && queues[q].transports != t->transports) ++q;
    if (q == queues.size()) queues.emplace_back().transports = t->transports;
    queues[q].tasks.push_back(t);
  }
  bool oversubscribed = false;
  for (Task* t : tasks) oversubscribed |= t->oversubscribed;
  const int64_t spin = hostSpinPolls(oversubscribed);
  const double timeoutSec = hostTimeoutSec();
  int64_t idle = 0;
  uint64_t idleSince = 0, lastCheck = nowNs();
  try {
    for (;;) {
      bool any = false, all = true;
      for (Queue& q : queues) {
        any |= advance(q, spin);
        all &= q.done();
      }
      if (all) return;
      if (any) {
        idle = 0;
        continue;
      }
      if (++idle == 1) idleSince = nowNs();
      // The channels do the work: this thread only watches, so it sleeps soon.
      backoff(idle, 0);
      const uint64_t now = nowNs();
      if (now - lastCheck > 100000000ull) {  // every 100 ms
        lastCheck = now;
        for (Queue& q : queues) checkStalled(q, (now - idleSince) / 1e9, timeoutSec);
      }
    }
  } catch (const Error&) {
    for (Queue& q : queues) {
      if (q.run) q.run->stop();
      if (Task* t = q.current()) {
        if (t->recorder) t->recorder->fail(t->rec, t->seq);
        if (t->prof) t->prof->end();
      }
    }
    throw;
  }
}

}  // namespace loom
