#include "engine/executor.h"

#include <sched.h>
#include <time.h>

#include <cstring>
#include <memory>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "base/time.h"
#include "engine/flight_recorder.h"
#include "engine/job_status.h"
#include "engine/host_step_ops.h"
#include "engine/interp_executor.h"
#include "engine/profiler_plugin.h"
#include "kernels/plan_steps.h"

namespace loom {
namespace {

IntKnob kSpin("LOOM_SPIN_COUNT", "", 2000,
              "Polls a waiting rank makes before it starts yielding the CPU. When a host runs "
              "more ranks than it has CPUs for, waiting ranks yield at once unless this is set");
SizeKnob kStreamMin("LOOM_STREAM_MIN_BYTES", "", "16M",
                    "Channels moving at least this many bytes in one operation write final "
                    "results with streaming (non-temporal) stores: such operations overflow "
                    "the caches anyway (0: never)");
IntKnob kTimeout("LOOM_TIMEOUT", "", 1800,
                 "Seconds an operation may wait without any progress on a live peer before "
                 "failing (0: no limit). Dead or failed peers are detected within a second "
                 "whatever this says");

// Polls without progress after which a wait is timed for the flight recorder (~10 us).
constexpr int64_t kTimedWait = 256;

// Below this, posting an address (a cross-process read per step) costs more than copying.
constexpr size_t kShareMinBytes = 64 << 10;

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Executes the steps of one channel, one FIFO step ("piece") at a time, never blocking.
class ChannelRun {
 public:
  ChannelRun(const Task& t, size_t ch) : t_(t), steps_(*t.plan, ch, t.count, t.eltSize) {
    sendbuf_ = ch < t.chanSend.size() ? t.chanSend[ch] : t.sendbuf;
    recvbuf_ = ch < t.chanRecv.size() ? t.chanRecv[ch] : t.recvbuf;
    if (!done()) step_ = steps_[0];
    const size_t total = steps_.bytes();
    // Read per operation (tests change it), but only where a getenv costs nothing in
    // comparison.
    if (total >= (1u << 20)) {
      uint64_t streamMin = kStreamMin.get();
      stream_ = streamMin > 0 && total >= streamMin;
    }
  }

  bool done() const { return cur_ >= steps_.size(); }
  // Peers have read everything we lent them by address: our buffers may change again.
  bool sharedDrained() const {
    for (Connection* c : shared_)
      if (!c->fifo().drained()) return false;
    return true;
  }

  // Does as much as possible without waiting. Returns true if anything moved.
  bool progress() {
    bool any = false;
    while (!done() && tryPiece()) any = true;
    return any;
  }

  // What the channel is waiting for, for time-out messages and liveness probes; *send
  // says whether it waits to send (or for a peer to read what it lent) or to receive.
  Connection* waitingOn(bool* send) const {
    *send = true;
    if (done()) {
      // Waiting for peers to read what we lent them by address.
      for (Connection* c : shared_)
        if (!c->fifo().drained()) return c;
      return nullptr;
    }
    const Step& s = step_;
    if (s.recvPeer >= 0) {
      Connection* c = t_.transports->recvConn(s.recvPeer, s.conn);
      if (!c->fifo().canRecv()) {
        *send = false;
        return c;
      }
    }
    if (s.sendPeer >= 0) return t_.transports->sendConn(s.sendPeer, s.conn);
    return nullptr;
  }

 private:
  const char* ptr(BufRef r, size_t off) const { return bufAt(r, off, sendbuf_, recvbuf_, t_.scratch); }

  bool tryPiece() {
    const Step& s = step_;
    Connection* rc = s.recvPeer >= 0 ? t_.transports->recvConn(s.recvPeer, s.conn) : nullptr;
    Connection* sc = s.sendPeer >= 0 ? t_.transports->sendConn(s.sendPeer, s.conn) : nullptr;
    FifoEnd* rf = rc ? &rc->fifo() : nullptr;
    FifoEnd* sf = sc ? &sc->fifo() : nullptr;
    if (!stepReady(rf, sf)) return false;
    size_t slot = rf ? rf->slotBytes : sf ? sf->slotBytes : s.bytes;
    size_t n = s.bytes - off_;
    if (n > slot) n = slot;

    const Reducer& red = t_.red;
    StepPiece p = pieceOf(s, off_, n, red.hasPost(), [this](BufRef r, size_t o) { return ptr(r, o); });
    // Single copy: post where the data sits unchanged until the operation completes.
    if ((s.flags & kShare) && sc && n >= kShareMinBytes && sc->supportsRemoteRead()) {
      if (s.op == StepOp::kSend && (p.bPartial || !red.hasPre()))
        p.remote = reinterpret_cast<uint64_t>(p.b);
      else if ((s.op == StepOp::kRecvReduceCopySend || s.op == StepOp::kRecvCopySend) &&
               !p.postDst)
        p.remote = reinterpret_cast<uint64_t>(p.dst);
    }
    HostStepOps ops;
    ops.red = &red;
    // Local copies write data this rank reads again: no streaming stores there.
    ops.stream = stream_ && s.op != StepOp::kCopy && s.op != StepOp::kLocalReduce;
    ops.rc = rc;
    ops.tmp = &tmp_;
    runReadyPiece(rf, sf, p, ops);  // stepReady held above
    if (p.remote) noteShared(sc);
    off_ += n;
    if (off_ >= s.bytes) {
      off_ = 0;
      if (++cur_ < steps_.size()) step_ = steps_[cur_];
    }
    return true;
  }

  void noteShared(Connection* c) {
    for (Connection* x : shared_)
      if (x == c) return;
    shared_.push_back(c);
  }

  const Task& t_;
  const StepSeq steps_;
  Step step_{};  // steps_[cur_]
  std::vector<char> tmp_;            // remote payloads that feed a reduction
  std::vector<Connection*> shared_;  // connections we posted our own addresses on
  const void* sendbuf_;
  void* recvbuf_;
  size_t cur_ = 0;
  size_t off_ = 0;
  bool stream_ = false;  // final results go out with streaming stores (LOOM_STREAM_MIN_BYTES)
};

// The tasks of one communicator, run in order.
struct CommQueue {
  TransportManager* transports = nullptr;
  std::vector<Task*> tasks;
  size_t next = 0;
  std::vector<ChannelRun> runs;
  bool draining = false;

  // Ready for a new launch; the vectors keep their capacity.
  void reset(TransportManager* tm) {
    transports = tm;
    tasks.clear();
    runs.clear();
    next = 0;
    draining = false;
    idleTask = nullptr;
  }

  bool done() const { return next >= tasks.size(); }
  Task* current() const { return done() ? nullptr : tasks[next]; }
  Task* idleTask = nullptr;  // the task that was current when the last wait began

  // Errors a connection or a channel raises name the operation they interrupted.
  bool progress() {
    if (done()) return false;
    Task* t = tasks[next];
    try {
      return progressTask(t);
    } catch (const Error& e) {
      throw taskError(*t, e);
    }
  }

  bool progressTask(Task* t) {
    bool any = false;
    for (Connection* c : t->transports->active()) any |= c->progress();
    if (runs.empty() && !draining) {
      if (t->plan->scratchBytes > 0 && !t->scratch)
        LOOM_THROW(kInternalError, "rank %d: %s #%llu needs %zu bytes of scratch and has none",
                   t->rank, t->name, static_cast<unsigned long long>(t->seq), t->plan->scratchBytes);
      for (size_t ch = 0; ch < t->plan->channels.size(); ++ch)
        runs.emplace_back(*t, ch);
      if (FlightEntry* e = FlightRecorder::held(t->rec, t->seq)) e->start();
      if (t->prof) t->prof->begin();
    }
    bool all = true;
    for (auto& r : runs) {
      any |= r.progress();
      all &= r.done() && r.sharedDrained();
    }
    // Waiting, the executor drives the network connections itself (a pass of the proxy's,
    // unless the proxy thread is in one): where ranks have no spare core, the hop to the
    // proxy thread was most of a small message's time. Only when its channels moved
    // nothing, so the proxy thread still pumps large messages beside the reductions.
    if (!any) any = t->transports->pumpProxied();
    if (all) {
      // Data a socket connection holds locally must reach the peer before we return:
      // nobody would drive it afterwards.
      runs.clear();
      draining = true;
      for (Connection* c : t->transports->buffered())
        if (!c->fifo().drained()) return any;
      draining = false;
      if (t->recorder) t->recorder->complete(t->rec, t->seq);
      if (t->prof) t->prof->end();
      ++next;
      any = true;
    }
    return any;
  }

  void checkStalled(double idleSec, double timeoutSec) {
    if (done()) return;
    Task* t = tasks[next];
    throwIfInterrupted(*t);
    if (idleSec < 0.1) return;
    std::vector<Connection*> waits;
    for (auto& r : runs) {
      bool send = false;
      if (Connection* c = r.waitingOn(&send)) {
        waits.push_back(c);
        if (waits.size() == 1)
          if (FlightEntry* e = FlightRecorder::held(t->rec, t->seq)) e->noteWaiting(c->peer(), send);
      }
    }
    // Socket data still leaving after the steps are done.
    if (draining)
      for (Connection* c : t->transports->buffered())
        if (!c->fifo().drained()) {
          if (waits.empty())
            if (FlightEntry* e = FlightRecorder::held(t->rec, t->seq)) e->noteWaiting(c->peer(), true);
          waits.push_back(c);
        }
    for (Connection* c : waits) probeWait(*t, c, idleSec, timeoutSec);
  }
};

// Set once this thread's pool is destroyed; a bool needs no destructor, so it stays readable.
thread_local bool tlsPoolGone = false;
struct QueuePool {
  std::vector<CommQueue> queues;
  ~QueuePool() { tlsPoolGone = true; }
};

}  // namespace

Error taskError(const Task& t, const Error& e) {
  return Error(e.code(), strprintf("rank %d: %s #%llu: %s", t.rank, t.name,
                                   static_cast<unsigned long long>(t.seq), e.what()));
}

void throwIfInterrupted(const Task& t) {
  if (t.abortFlag && t.abortFlag->load(std::memory_order_relaxed))
    LOOM_THROW(kInvalidUsage, "rank %d: %s #%llu interrupted: communicator aborted", t.rank,
               t.name, static_cast<unsigned long long>(t.seq));
  if (t.revokeFlag && t.revokeFlag->load(std::memory_order_relaxed))
    LOOM_THROW(kInvalidUsage, "rank %d: %s #%llu interrupted: communicator revoked", t.rank,
               t.name, static_cast<unsigned long long>(t.seq));
}

void probeWait(const Task& t, Connection* c, double idleSec, double timeoutSec) {
  try {
    c->checkPeer();
  } catch (const Error& e) {
    throw taskError(t, e);  // name the operation the failure interrupted
  }
  if (timeoutSec > 0 && idleSec > timeoutSec) {
    // Ask the other ranks who holds the job up before giving up.
    std::string view = t.core ? describeStall(*t.core, c->peer()) : "";
    LOOM_THROW(kRemoteError,
               "rank %d: %s #%llu made no progress for %.0f s waiting on %s (LOOM_TIMEOUT)%s",
               t.rank, t.name, static_cast<unsigned long long>(t.seq), idleSec,
               c->describe().c_str(), view.c_str());
  }
}

int64_t hostSpinPolls(bool oversubscribed) {
  // Knobs are read once per process: getenv on every call would cost more than a small
  // collective itself.
  static const int64_t spinKnob = kSpin.get();
  static const bool spinSet = kSpin.isSet();
  // A rank that spins while its peers have no CPU to run on only delays them: with more
  // ranks than CPUs, yield from the first idle poll.
  return oversubscribed && !spinSet ? 0 : spinKnob;
}

double hostTimeoutSec() {
  static const double timeoutSec = static_cast<double>(kTimeout.get());
  return timeoutSec;
}

void runTasks(std::span<Task* const> tasks) {
  bool mixed = false;
  for (Task* t : tasks) mixed |= t->interp != tasks[0]->interp;
  if (__builtin_expect(mixed, 0))
    LOOM_THROW(kInvalidUsage,
               "rank %d: a group spans communicators created with different LOOM_EXECUTOR or "
               "LOOM_INTERP_PROTO settings; create them alike", tasks[0]->rank);
  if (__builtin_expect(tasks[0]->interp, 0)) return runTasksInterp(tasks);
  // Reused from call to call on this thread (a thread runs one launch at a time), so a
  // small collective allocates nothing here. A collective called from an atexit handler
  // runs after the thread's TLS destructors: it gets a pool of its own.
  thread_local QueuePool tls;
  std::vector<CommQueue> exiting;
  std::vector<CommQueue>& pool = tlsPoolGone ? exiting : tls.queues;
  size_t used = 0;
  for (Task* t : tasks) {
    size_t q = 0;
    while (q < used && pool[q].transports != t->transports) ++q;
    if (q == used) {
      if (used == pool.size()) pool.emplace_back();
      pool[used++].reset(t->transports);
    }
    pool[q].tasks.push_back(t);
  }
  std::span<CommQueue> queues(pool.data(), used);
  struct Clear {  // an error leaves no task pointers behind for the next launch
    std::span<CommQueue> q;
    ~Clear() {
      for (CommQueue& c : q) c.reset(nullptr);
    }
  } clear{queues};
  bool oversubscribed = false;
  for (Task* t : tasks) oversubscribed |= t->oversubscribed;
  const int64_t spin = hostSpinPolls(oversubscribed);
  const double timeoutSec = hostTimeoutSec();
  int64_t idle = 0;
  // The clock is read when a wait begins and ends, not on every step of progress.
  uint64_t idleSince = 0, lastCheck = 0;
  try {
    for (;;) {
      bool any = false, all = true;
      for (auto& q : queues) {
        any |= q.progress();
        all &= q.done();
      }
      if (any && idle >= kTimedWait) {
        // The time each operation waited for its peers (the flight recorder's: the last rank
        // to arrive waits least). Short waits are not timed: a clock read would cost more
        // than an 8-byte all-reduce can spare, and skews that matter are far longer.
        uint64_t now = nowNs();
        for (auto& q : queues)
          if (FlightEntry* e = q.idleTask ? FlightRecorder::held(q.idleTask->rec, q.idleTask->seq) : nullptr) {
            e->addWait(now - idleSince);
            e->noteActive(now);
            e->noteWaiting(-1, false);  // no longer waiting on that peer
          }
      }
      if (all) return;
      if (any) {
        idle = 0;
        continue;
      }
      if (++idle == 1) {
        idleSince = nowNs();
        if (lastCheck == 0) lastCheck = idleSince;
        for (auto& q : queues) {
          q.idleTask = q.current();
          if (FlightEntry* e = q.idleTask ? FlightRecorder::held(q.idleTask->rec, q.idleTask->seq) : nullptr)
            e->noteActive(idleSince);
        }
      }
      // Back off: spin, then yield, then sleep in growing steps up to 50 us.
      if (idle < spin) {
        cpuRelax();
      } else if (idle < spin + 1000) {
        sched_yield();
      } else {
        timespec ts{0, idle < spin + 2000 ? 2000 : 50000};
        nanosleep(&ts, nullptr);
      }
      if ((idle & 63) == 0) {
        uint64_t now = nowNs();
        if (now - lastCheck > 100000000ull) {  // every 100 ms
          lastCheck = now;
          double idleSec = (now - idleSince) / 1e9;
          for (auto& q : queues) q.checkStalled(idleSec, timeoutSec);
        }
      }
    }
  } catch (const Error& e) {
    for (auto& q : queues)
      if (Task* t = q.current()) {
        if (t->recorder) t->recorder->fail(t->rec, t->seq);
        if (t->prof) t->prof->end();
      }
    throw;
  }
}

}  // namespace loom
