// The staged path's launcher: stages a launch's buffers and queues its work on the
// caller's streams (engine/staged.h describes the sequence).
#include <algorithm>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <mutex>
#include <vector>

#include "base/cuda_driver.h"
#include "base/error.h"
#include "base/log.h"
#include "engine/communicator.h"
#include "engine/cuda_kernels.h"
#include "engine/direct_moves.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "engine/staged_record.h"

namespace loom::staged {
namespace {

using cuda::CuDevicePtr;
using cuda::CuEvent;
using cuda::CuResult;

size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Bytes an operation reads from its send buffer and writes to its receive buffer on this
// rank.
struct Extent {
  size_t in, out;
};
Extent extentOf(const Op& op) {
  const size_t b = op.bytes();
  const int rank = op.comm.core->rank(), n = op.comm.core->nranks();
  if (op.isSend) return {b, 0};
  if (op.isRecv) return {0, b};
  switch (op.coll) {
    case Collective::kAllReduce: return {b, b};
    case Collective::kBroadcast: return {rank == op.root ? b : 0, b};
    case Collective::kReduce: return {b, rank == op.root ? b : 0};
    case Collective::kAllGather: return {b, b * n};
    case Collective::kReduceScatter: return {b * n, b};
    default: break;
  }
  LOOM_THROW(kInternalError, "%s has no staged form", collectiveName(op.coll));
}

void check(const cuda::Driver& drv, CuResult r, const char* what, const Op& op) {
  if (r != cuda::kCudaSuccess)
    LOOM_THROW(kUnhandledCudaError, "rank %d: %s on device buffers: %s failed: %s",
               op.comm.core->rank(), collectiveName(op.coll), what, drv.errorText(r).c_str());
}

int deviceOf(const Op& op) {
  if (op.device >= 0) return op.device;
  return classifyPointer(op.sendbuff ? op.sendbuff : op.recvbuff).device;
}

class Launcher {
 public:
  Launcher(const cuda::Driver& drv, std::span<const Op> ops) : drv_(drv), st_(drv.streams), ops_(ops) {}

  void run() {
    devices_.resize(ops_.size());
    for (size_t i = 0; i < ops_.size(); ++i) {
      const Op& op = ops_[i];
      // Device memory only: enqueue (engine.cc) refuses a group mixing in host memory.
      devices_[i] = deviceOf(op);
      // A stream is a (handle, device) pair: the legacy and per-thread default streams have
      // one handle on every device.
      size_t s = 0;
      while (s < streams_.size() && !(streams_[s] == op.stream && streamDevice_[s] == devices_[i])) ++s;
      if (s == streams_.size()) {
        streams_.push_back(op.stream);
        streamDevice_.push_back(devices_[i]);
        capturing_.push_back(isCapturing(op, devices_[i]));
      }
      opStream_.push_back(s);
    }
    captured_ = capturing_[0];
    for (size_t s = 0; s < streams_.size(); ++s)
      LOOM_CHECK_USAGE(capturing_[s] == captured_,
                       "rank %d: a group on device buffers spans streams %p (%s) and %p (%s): "
                       "its streams must all be captured into the CUDA graph, or none",
                       ops_[0].comm.core->rank(), streams_[0],
                       captured_ ? "captured" : "not captured", streams_[s],
                       capturing_[s] ? "captured" : "not captured");
    bool sameContext = false;  // a rank shares its CUDA context with another of its comm
    for (const Op& op : ops_) sameContext |= !op.comm.core->sameContextRanks().empty();
    if (captured_) return runCaptured();
    if (meetOnBoards()) return;
    if (sameContext) return meet() ? void() : runOnCaller();
    rec_ = takeRecord();
    rec_->captured = false;
    try {
      bindStaging();
      queueOnProxies();
      issue();
    } catch (...) {
      if (queued_) {
        // The proxies skip it; a stream that already holds part of its work keeps the
        // record (it never returns to the pool, so that work stays valid).
        rec_->cancelled.store(true, std::memory_order_release);
        wakeAll();
      } else {
        rec_->holds.store(1);
        dropHold(rec_);
      }
      throw;
    }
  }

 private:
  bool isCapturing(const Op& op, int device) {
    cuda::ScopedDevice sd;
    setDevice(sd, device, op);
    int status = cuda::kStreamCaptureStatusNone;
    check(drv_, st_.streamIsCapturing(op.stream, &status), "cuStreamIsCapturing", op);
    if (status == cuda::kStreamCaptureStatusNone) return false;
    LOOM_CHECK_USAGE(status == cuda::kStreamCaptureStatusActive,
                     "rank %d: %s on device buffers on stream %p, whose CUDA graph capture has "
                     "been invalidated (status %d)",
                     op.comm.core->rank(), collectiveName(op.coll), op.stream, status);
    LOOM_CHECK_USAGE(drv_.hasCapture,
                     "rank %d: %s on device buffers while stream %p is being captured into a CUDA "
                     "graph: %s lacks cuStreamGetCaptureInfo_v3, cuUserObjectCreate, "
                     "cuGraphRetainUserObject or cuThreadExchangeStreamCaptureMode, which the "
                     "staged path needs to be captured (CUDA 12.3 or newer)",
                     op.comm.core->rank(), collectiveName(op.coll), op.stream,
                     drv_.lib.path().c_str());
    return true;
  }

  // Captured into a CUDA graph: the stream work is recorded, not run. Each replay's arrive
  // hands the record to its proxies; a user object moved into the graph returns the record
  // to the pool once the graph and every executable made from it are gone.
  void runCaptured() {
    for (const Op& op : ops_) {
      const std::vector<int>& others = op.comm.core->sameContextRanks();
      if (others.empty()) continue;
      std::string list;
      for (int r : others) list += (list.empty() ? "" : ", ") + std::to_string(r);
      LOOM_THROW(kInvalidUsage,
                 "rank %d: %s on device buffers is being captured into a CUDA graph, but "
                 "rank(s) %s of this communicator run in this process on the same CUDA device: "
                 "a replay would hold this rank's stream on the GPU until those ranks' streams "
                 "arrive, an order CUDA cannot see, which can deadlock the GPU (seen on an "
                 "H100). Run one process per rank to capture Loom's staged calls, or call "
                 "without capturing (such calls run on the calling thread)",
                 op.comm.core->rank(), collectiveName(op.coll), list.c_str());
    }
    for (const Op& op : ops_)
      LOOM_CHECK_USAGE(op.comm.core == ops_[0].comm.core,
                       "rank %d: a group spanning several communicators on device buffers is "
                       "being captured into a CUDA graph: Loom's staged path captures groups "
                       "of one communicator only (capture each communicator's calls in a "
                       "group of its own)",
                       ops_[0].comm.core->rank());
    rec_ = takeRecord();
    rec_->captured = true;
    rec_->proxies.clear();
    for (const Op& op : ops_) {
      StagedProxy* px = &op.comm.core->staged();
      if (std::find(rec_->proxies.begin(), rec_->proxies.end(), px) == rec_->proxies.end())
        rec_->proxies.push_back(px);
    }
    for (StagedProxy* px : rec_->proxies) px->start();  // no thread starts in a host function
    rec_->holds.store(1);  // the graph's
    // On failure the capture may hold part of the work: the record stays out of the pool.
    cuda::RelaxedCapture relaxed(st_, true);
    bindStaging();
    issue();
    const Op& op = ops_[0];
    cuda::ScopedDevice sd;
    setDevice(sd, streamDevice_[0], op);
    void* graph = nullptr;
    int status = 0;
    unsigned long long id = 0;
    check(drv_, st_.streamGetCaptureInfo(streams_[0], &status, &id, &graph, nullptr, nullptr,
                                         nullptr),
          "cuStreamGetCaptureInfo", op);
    void* obj = nullptr;
    check(drv_, st_.userObjectCreate(&obj, rec_, &releaseCaptured, 1,
                                     cuda::kUserObjectNoDestructorSync),
          "cuUserObjectCreate", op);
    check(drv_, st_.graphRetainUserObject(graph, obj, 1, cuda::kGraphUserObjectMove),
          "cuGraphRetainUserObject", op);
  }

  // A collective of a communicator whose ranks all share this CUDA context: every rank's
  // launch of it meets the others' on the host (staged_record.h), each collective numbered
  // per communicator in issue order, whatever the grouping. The launch completing a meeting
  // leads it: it moves the data between the ranks' device buffers on its stream (direct),
  // or sends every rank to the host engine. A launch that cannot be led (point-to-point
  // calls, several collectives or communicators of different jobs) sends its meetings to
  // the host at once. Returns true when the launch's work is queued (direct).
  bool meet() {
    struct Key {
      Communicator* comm;
      uint64_t seq;
    };
    std::vector<Key> keys;  // one per collective of a communicator of one context
    bool lonely = false;    // something here cannot take part in a direct meeting
    for (const Op& op : ops_) {
      Communicator* c = op.comm.core;
      if (op.isP2p() || !c->allInOneContext()) {
        lonely = true;
        continue;
      }
      keys.push_back({c, c->nextMeeting()});
    }
    if (keys.empty()) return false;
    // Direct needs one meeting: one collective per communicator, all of one job, same number.
    bool one = !lonely;
    for (const Key& k : keys)
      one &= k.comm->commHash() == keys[0].comm->commHash() && k.seq == keys[0].seq;
    for (size_t i = 0; i < keys.size() && one; ++i)
      for (size_t j = 0; j < i; ++j) one &= keys[i].comm != keys[j].comm;
    if (!one) {
      for (const Key& k : keys) {
        LocalMeeting* m = nullptr;
        joinMeeting(k.comm->commHash(), k.seq, static_cast<size_t>(k.comm->nranks()), 1, {},
                    Join::kOnHost, &m);
        leaveMeeting(k.comm->commHash(), k.seq);
      }
      return false;
    }
    Communicator* first = keys[0].comm;
    const uint64_t hash = first->commHash(), seq = keys[0].seq;
    const size_t expected = static_cast<size_t>(first->nranks());
    LocalMeeting* m = nullptr;
    std::vector<LocalPart> parts;
    try {
      rec_ = takeRecord();
      rec_->captured = false;
      rec_->holds.store(1);
      size_t slot = 0;
      for (size_t i = 0; i < ops_.size(); ++i) parts.push_back({&ops_[i], mark(slot++, opStream_[i])});
    } catch (const Error& e) {  // the other ranks must not wait for this one
      joinMeeting(hash, seq, expected, keys.size(), {}, Join::kFail, &m, &e);
      leaveMeeting(hash, seq);
      if (rec_) dropHold(rec_);  // (its events may be half recorded: nothing waits on them)
      rec_ = nullptr;
      throw;
    }
    if (joinMeeting(hash, seq, expected, keys.size(), parts, Join::kWait, &m)) lead(m, ops_.size());
    waitMeeting(m);
    const LocalMeeting::State state = m->state.load(std::memory_order_acquire);
    std::string error = state == LocalMeeting::kFailed ? m->error : "";
    const Code code = state == LocalMeeting::kFailed ? m->code : Code::kSuccess;
    std::string waitError;
    if (m->done && (state == LocalMeeting::kDirect || state == LocalMeeting::kFailed)) {
      // After the leader's work (also work it queued before failing), never before.
      try {
        for (size_t s = 0; s < streams_.size(); ++s) waitOn(s, m->done);
      } catch (const Error& e) {
        waitError = e.what();
      }
    }
    leaveMeeting(hash, seq);
    if (rec_) dropHold(rec_);
    rec_ = nullptr;
    if (!waitError.empty())
      LOOM_THROW(kUnhandledCudaError, "rank %d: %s on device buffers: %s", first->rank(),
                 collectiveName(ops_[0].coll), waitError.c_str());
    if (state == LocalMeeting::kFailed)
      throw Error(code, strprintf("rank %d: %s on device buffers: %s", first->rank(),
                                  collectiveName(ops_[0].coll), error.c_str()));
    return state == LocalMeeting::kDirect;
  }

  // Each collective of a communicator whose ranks are processes on one GPU takes a meeting
  // number (engine/device_board.h). A launch of one such collective alone meets the other
  // ranks' launches on the board; any other launch posts that its meetings go to the host
  // engine. True when the collective went direct (its work is queued).
  bool meetOnBoards() {
    std::vector<const Op*> onBoard;
    bool other = false;
    for (const Op& op : ops_) {
      if (!op.isP2p() && op.comm.core->deviceBoard())
        onBoard.push_back(&op);
      else
        other = true;
    }
    if (onBoard.empty()) return false;
    // Every number first: a skip that throws (a broken board) must not leave another
    // communicator's numbers behind the other ranks'.
    std::vector<uint64_t> seqs;
    for (const Op* op : onBoard) seqs.push_back(op->comm.core->nextMeeting());
    if (onBoard.size() == 1 && !other)
      return onBoard[0]->comm.core->deviceBoard()->meet(drv_, *onBoard[0], seqs[0]);
    std::exception_ptr first;
    for (size_t i = 0; i < onBoard.size(); ++i) {
      try {
        onBoard[i]->comm.core->deviceBoard()->skip(*onBoard[i], seqs[i]);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
    return false;
  }

  // The leader: direct when it can (its record then holds the meeting's `done` event), else
  // every rank to the host engine; a failure after work was queued still records `done`.
  void lead(LocalMeeting* m, size_t slot) {
    bool queued = false;
    try {
      if (!direct(m->parts, &queued)) return settleMeeting(m, LocalMeeting::kOnHost);
    } catch (const KernelsUnusable&) {
      return settleMeeting(m, LocalMeeting::kOnHost);
    } catch (const std::exception& ex) {
      return fail(m, ex, queued, slot);
    } catch (...) {
      return fail(m, std::runtime_error("an unknown exception"), queued, slot);
    }
    try {
      m->done = mark(slot, 0);
      m->leaderRec = rec_;
      rec_ = nullptr;  // leaveMeeting returns it to the pool
      settleMeeting(m, LocalMeeting::kDirect);
    } catch (const std::exception& ex) {
      fail(m, ex, true, slot);
    } catch (...) {
      fail(m, std::runtime_error("an unknown exception"), true, slot);
    }
  }
  void fail(LocalMeeting* m, const std::exception& ex, bool queued, size_t slot) {
    const auto* err = dynamic_cast<const Error*>(&ex);
    Error e = err ? *err : Error(Code::kInternalError, ex.what());
    if (queued) {  // the other streams must still wait for what was queued
      try {
        m->done = mark(slot, 0);
        m->leaderRec = rec_;
        rec_ = nullptr;
      } catch (...) {
        m->done = nullptr;
      }
    }
    settleMeeting(m, LocalMeeting::kFailed, &e);
  }

  // Until the meeting is settled. Before every rank has joined, an abort, a revoke or
  // LOOM_TIMEOUT fails it; after, its leader settles it at once.
  void waitMeeting(LocalMeeting* m) {
    const double limit = hostTimeoutSec();
    const auto t0 = std::chrono::steady_clock::now();
    bool mayGiveUp = true;
    for (;;) {
      std::string why;
      Code code = Code::kInvalidUsage;
      waitFor([&] {
        if (m->state.load(std::memory_order_acquire) != LocalMeeting::kGathering) return true;
        if (!mayGiveUp) return false;
        why = interrupted();
        if (why.empty() && limit > 0 &&
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit) {
          why = strprintf("the other ranks did not issue it within LOOM_TIMEOUT (%.0f s)", limit);
          code = Code::kRemoteError;
        }
        return !why.empty();
      });
      if (why.empty() || abandonMeeting(m, Error(code, why))) return;
      mayGiveUp = false;
    }
  }

  // "" or why the launch's communicators stop waiting (ncclCommAbort, ncclCommRevoke).
  std::string interrupted() const {
    for (const Op& op : ops_)
      if (const char* how = op.comm.interrupted()) return std::string("the communicator was ") + how;
    return "";
  }

  // The leader's part: when every rank gave one collective of one shape, stream 0 waits for
  // every rank's stream and moves the data between the ranks' buffers: copies for an
  // all-gather or a broadcast, the CUDA kernels module's reductions (cuda_kernels.h) for the
  // others. Returns false, touching nothing, where it cannot (the host engine then runs it on
  // every rank): several operations of a rank, shapes or reductions that differ, a device
  // scalar, a reduction without the kernels module.
  bool direct(const std::vector<LocalPart>& parts, bool* queued) {
    const Op& o = *parts[0].op;
    const int n = o.comm.core->nranks();
    const cuda::Kernels* kern = cuda::kernels();  // once: another thread may give it up
    if (!canGoDirect(o, kern)) return false;
    for (const LocalPart& p : parts)  // any rank's LOOM_LOCAL_DIRECT=0 sends it to the host engine
      if (!p.op->comm.core->localDirect()) return false;
    std::vector<const Op*> byRank(static_cast<size_t>(n), nullptr);
    for (const LocalPart& p : parts) {
      const Op& q = *p.op;
      const int r = q.comm.core->rank();
      if (!(DirectShape::of(q) == DirectShape::of(o)) || q.deviceScalar ||
          byRank[static_cast<size_t>(r)])
        return false;
      byRank[static_cast<size_t>(r)] = &q;
    }
    const bool copyOnly = o.coll == Collective::kAllGather || o.coll == Collective::kBroadcast;
    LOOM_INFO(kLogColl, "%s: %zu bytes per rank, moved between the buffers of %d ranks sharing "
              "a CUDA context (device %d) on stream %p%s%s",
              collectiveName(o.coll), o.bytes(), n, streamDevice_[0], streams_[0],
              copyOnly || !kern ? "" : " with ", copyOnly || !kern ? "" : kern->path.c_str());
    for (const LocalPart& p : parts) waitOn(0, p.ready);
    cuda::ScopedDevice sd;
    setDevice(sd, streamDevice_[0], o);
    std::vector<DirectRank> ranks;
    for (const Op* q : byRank) ranks.push_back({q->sendbuff, q->recvbuff, q->red.scalarBits});
    queueDirect(drv_, kern, o, ranks, streams_[0], queued);
    return true;
  }

  // Ranks of one process on one device (threads) share a CUDA context, whose streams the
  // GPU may serialize behind each other: a stream held by cuStreamWaitValue32 until another
  // rank's call arrives can hold that rank's own stream work behind it (CUDA asks for such
  // waits to be ordered by dependencies it can see; 8 rank threads on an H100 hung). Their
  // calls run on the caller's thread instead: the inputs are staged and waited for on the
  // host, the host engine runs the operations (waiting there for the other ranks' calls),
  // and the results are copied back on the streams. Nothing on the GPU waits for the host.
  void runOnCaller() {
    const std::vector<Communicator*> comms = communicators();
    for (Communicator* c : comms) c->drainStaged();  // their earlier queued records run first
    rec_ = takeRecord();
    rec_->captured = false;
    rec_->gate.store(0);
    rec_->holds.store(1);
    bool streamsUseIt = false;  // a queued copy may still touch the staging: never pooled
    try {
      bindStaging();
      streamsUseIt = true;
      const size_t k = streams_.size();
      copies(true);
      size_t slot = 0;
      for (size_t s = 1; s < k; ++s) waitOn(0, mark(slot++, s));
      {
        cuda::ScopedDevice sd;
        setDevice(sd, streamDevice_[0], ops_[0]);
        check(drv_, st_.launchHostFunc(streams_[0], &arrive, rec_), "cuLaunchHostFunc", ops_[0]);
      }
      std::string why;
      waitFor([&] {
        if (rec_->gate.load(std::memory_order_acquire)) return true;
        why = interrupted();
        return !why.empty();
      });
      LOOM_CHECK_USAGE(why.empty(), "rank %d: %s on device buffers: %s while its inputs were "
                       "being copied",
                       ops_[0].comm.core->rank(), collectiveName(ops_[0].coll), why.c_str());
      streamsUseIt = false;  // the inputs are in; nothing queued reads the staging now
      for (Op& op : rec_->hostOps)
        if (op.deviceScalar) op.red = Reducer::preMulSum(op.dtype, op.deviceScalar);
      enqueue(rec_->hostOps, Completion::kBeforeReturn);
      streamsUseIt = true;
      copies(false);
      joinStreams(slot);  // as ncclGroupEnd does: each stream goes on after all of the group
      rec_->holds.store(static_cast<int>(k) + 1);  // each stream's release, and this call's
      for (size_t s = 0; s < k; ++s) {
        cuda::ScopedDevice sd;
        setDevice(sd, streamDevice_[s], ops_[0]);
        if (CuResult r = st_.launchHostFunc(streams_[s], &release, rec_); r != cuda::kCudaSuccess) {
          rec_->holds.fetch_sub(static_cast<int>(k - s));  // the releases not queued
          check(drv_, r, "cuLaunchHostFunc", ops_[0]);
        }
      }
      dropHold(rec_);
    } catch (...) {
      if (!streamsUseIt) dropHold(rec_);
      throw;
    }
  }

  // The launch's communicators, each once, in the order of its operations.
  std::vector<Communicator*> communicators() const {
    std::vector<Communicator*> comms;
    for (const Op& op : ops_)
      if (std::find(comms.begin(), comms.end(), op.comm.core) == comms.end())
        comms.push_back(op.comm.core);
    return comms;
  }

  void setDevice(cuda::ScopedDevice& sd, int device, const Op& op) {
    std::string why;
    if (device >= 0 && !sd.set(device, &why))
      LOOM_THROW(kUnhandledCudaError, "rank %d: %s on device buffers: %s", op.comm.core->rank(),
                 collectiveName(op.coll), why.c_str());
  }

  // Lays the operations out in the record's pinned block (grown as needed) and rebinds
  // them to it.
  void bindStaging() {
    size_t need = kFlagBytes;
    extents_.clear();
    for (const Op& op : ops_) {
      extents_.push_back(extentOf(op));
      need += alignUp(extents_.back().in) + alignUp(extents_.back().out);
      if (op.deviceScalar) need += kAlign;  // the scalar, copied when the stream gets here
    }
    if (need > rec_->capacity) {
      // The old block goes back to the pinned pool, never to the driver (takeBlock says why).
      leaveBlock({rec_->block, rec_->capacity, rec_->flagDev});
      rec_->block = nullptr;
      rec_->capacity = 0;
      rec_->flagDev = 0;
      PinnedBlock b = takeBlock(need);
      if (!b.host) {
        cuda::ScopedDevice sd;
        setDevice(sd, devices_[0], ops_[0]);
        size_t bytes = std::max<size_t>(need, 1 << 16);
        bytes = size_t{1} << (64 - __builtin_clzll(bytes - 1));
        void* p = nullptr;
        check(drv_, st_.memHostAlloc(&p, bytes, cuda::kMemHostAllocPortable | cuda::kMemHostAllocDeviceMap),
              "cuMemHostAlloc (staging)", ops_[0]);
        CuDevicePtr flagDev = 0;
        if (CuResult r = st_.memHostGetDevicePointer(&flagDev, p, 0); r != cuda::kCudaSuccess) {
          // Leaked: freeing it could wait for a held stream, and without a device address
          // it is of no use to the pool.
          check(drv_, r, "cuMemHostGetDevicePointer", ops_[0]);
        }
        b = {static_cast<char*>(p), bytes, flagDev};
      }
      // Only a block whose flag address is known is kept (a pooled record reuses it).
      rec_->block = b.host;
      rec_->capacity = b.bytes;
      rec_->flagDev = b.dev;
    }
    rec_->hostOps.assign(ops_.begin(), ops_.end());
    // The profiler's task events, now (with the caller's buffers), as NCCL makes them when a
    // call is queued; the host engine adds the channel events. None when captured: a graph
    // replays the work after the call's API events are gone.
    if (!captured_) profileQueued(rec_->hostOps);
    char* at = rec_->block + kFlagBytes;
    for (size_t i = 0; i < ops_.size(); ++i) {
      Op& h = rec_->hostOps[i];
      if (captured_) {
        h.comm.profiler = nullptr;
        h.profApi = nullptr;
      }
      if (h.deviceScalar) {  // the proxy makes the reducer from this copy (runRecord)
        h.deviceScalar = at;
        at += kAlign;
      }
      char* in = at;
      char* out = at + alignUp(extents_[i].in);
      at = out + alignUp(extents_[i].out);
      // A rank that reads nothing (broadcast off the root) or writes nothing (reduce off
      // the root) gets the other staging buffer: in place, never a device address.
      h.sendbuff = extents_[i].in ? in : out;
      h.recvbuff = extents_[i].out ? out : in;
      h.mem = MemKind::kHost;
      h.stream = nullptr;
      stageIn_.push_back(in);
      stageOut_.push_back(out);
    }
    __atomic_store_n(rec_->flag(), 0u, __ATOMIC_RELEASE);
  }

  void queueOnProxies() {
    const std::vector<Communicator*> comms = communicators();
    rec_->gate.store(0);
    rec_->done.store(false);
    rec_->cancelled.store(false);
    rec_->arrivals.store(static_cast<int>(comms.size()));
    rec_->holds.store(static_cast<int>(comms.size()) + 1);  // + the stream's release
    {
      // Records spanning several communicators reach every proxy in one order.
      static std::mutex pushMu;
      std::lock_guard<std::mutex> lock(pushMu);
      for (Communicator* c : comms) c->staged().push(rec_);
    }
    queued_ = true;
  }

  CuEvent event(size_t slot, int device, const Op& op) {
    if (rec_->events.size() <= slot) rec_->events.resize(slot + 1, {nullptr, -2});
    StagedRecord::Event& e = rec_->events[slot];
    if (e.ev == nullptr || e.device != device) {  // events belong to a device's context
      if (e.ev && st_.eventDestroy) {  // the old device's, destroyed under its device
        cuda::ScopedDevice old;
        std::string why;
        if (old.set(e.device, &why)) st_.eventDestroy(e.ev);
      }
      e.ev = nullptr;
      check(drv_, st_.eventCreate(&e.ev, cuda::kEventDisableTiming), "cuEventCreate", op);
      e.device = device;
    }
    return e.ev;
  }

  // An event marking what stream `s` has queued so far.
  CuEvent mark(size_t slot, size_t s) {
    const Op& op = ops_[0];
    cuda::ScopedDevice sd;
    setDevice(sd, streamDevice_[s], op);
    CuEvent ev = event(slot, streamDevice_[s], op);
    check(drv_, st_.eventRecord(ev, streams_[s]), "cuEventRecord", op);
    return ev;
  }
  void waitOn(size_t waiter, CuEvent ev) {
    const Op& op = ops_[0];
    cuda::ScopedDevice sd;
    setDevice(sd, streamDevice_[waiter], op);
    check(drv_, st_.streamWaitEvent(streams_[waiter], ev, 0), "cuStreamWaitEvent", op);
  }

  void copies(bool inputs) {
    auto dev = [](const void* p) { return reinterpret_cast<CuDevicePtr>(p); };
    for (size_t i = 0; i < ops_.size(); ++i) {
      const Op& op = ops_[i];
      size_t bytes = inputs ? extents_[i].in : extents_[i].out;
      if (bytes == 0 && !(inputs && op.deviceScalar)) continue;
      cuda::ScopedDevice sd;
      setDevice(sd, devices_[i], op);
      if (inputs && op.deviceScalar)
        check(drv_, st_.memcpyAsync(dev(rec_->hostOps[i].deviceScalar), dev(op.deviceScalar),
                                    op.eltSize, op.stream),
              "cuMemcpyAsync (device scalar to staging)", op);
      if (bytes == 0) continue;
      CuResult r = inputs ? st_.memcpyAsync(dev(stageIn_[i]), dev(op.sendbuff), bytes, op.stream)
                          : st_.memcpyAsync(dev(op.recvbuff), dev(stageOut_[i]), bytes, op.stream);
      check(drv_, r, inputs ? "cuMemcpyAsync (device to staging)" : "cuMemcpyAsync (staging to device)",
            op);
    }
  }

  // Every stream of the launch waits for every stream's copies back (events from `slot` on).
  void joinStreams(size_t slot) {
    const size_t k = streams_.size();
    if (k < 2) return;
    std::vector<CuEvent> copied;
    for (size_t s = 0; s < k; ++s) copied.push_back(mark(slot++, s));
    for (size_t t = 0; t < k; ++t)
      for (size_t s = 0; s < k; ++s)
        if (s != t) waitOn(t, copied[s]);
  }

  // As ncclGroupEnd does, the group's streams are joined: its work starts once every
  // stream has reached it, and every stream goes on only after all of it (here: after
  // every operation's results were copied back).
  void issue() {
    const Op& op = ops_[0];
    const size_t k = streams_.size();
    copies(true);
    size_t slot = 0;
    for (size_t s = 1; s < k; ++s) waitOn(0, mark(slot++, s));  // the first stream has every input
    {
      cuda::ScopedDevice sd;
      setDevice(sd, streamDevice_[0], op);
      check(drv_, st_.launchHostFunc(streams_[0], &arrive, rec_), "cuLaunchHostFunc", op);
      check(drv_, st_.streamWaitValue32(streams_[0], rec_->flagDev, 1, cuda::kStreamWaitValueEq),
            "cuStreamWaitValue32", op);
    }
    if (k > 1) {
      CuEvent ran = mark(slot++, 0);
      for (size_t s = 1; s < k; ++s) waitOn(s, ran);  // every stream waits for the results
    }
    copies(false);
    joinStreams(slot);
    if (captured_) return;  // the graph holds the record (runCaptured)
    cuda::ScopedDevice sd;
    setDevice(sd, streamDevice_[0], op);
    check(drv_, st_.launchHostFunc(streams_[0], &release, rec_), "cuLaunchHostFunc", op);
  }

  const cuda::Driver& drv_;
  const cuda::StreamApi& st_;
  std::span<const Op> ops_;
  std::vector<int> devices_;
  std::vector<void*> streams_;
  std::vector<int> streamDevice_;
  std::vector<bool> capturing_;
  bool captured_ = false;
  std::vector<size_t> opStream_;  // each operation's index in streams_
  std::vector<Extent> extents_;
  std::vector<char*> stageIn_, stageOut_;
  StagedRecord* rec_ = nullptr;
  bool queued_ = false;
};

}  // namespace

void launch(const cuda::Driver& drv, std::span<const Op> ops) { Launcher(drv, ops).run(); }

}  // namespace loom::staged
