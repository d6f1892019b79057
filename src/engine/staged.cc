#include "engine/staged.h"

#include <algorithm>
#include <vector>

#include "base/config.h"
#include "base/cuda_driver.h"
#include "base/error.h"
#include "base/log.h"
#include "engine/communicator.h"
#include "engine/engine.h"

namespace loom {

using cuda::CuDevicePtr;
using cuda::CuEvent;
using cuda::CuResult;
using cuda::CuStream;

// One staged launch: the host operations it runs and the pinned memory they run on. Owned
// by a process-wide pool and never freed: a stream may still reach a record's host
// functions after its communicator is gone.
// One rank's staged work waiting on a stream (of a device), for the shared-stream check.
struct StreamUse {
  void* stream;
  int device;
  uint64_t commHash;  // the same on every rank of a communicator
  int rank;
};

struct StagedRecord {
  std::vector<Op> hostOps;         // the launch's operations, rebound to the staging
  char* block = nullptr;           // pinned: the flag, then each operation's staging
  size_t capacity = 0;
  CuDevicePtr flagDev = 0;         // the flag's address for the stream's wait
  struct Event {
    CuEvent ev;
    int device;
  };
  std::vector<Event> events;       // joins the streams of a group
  std::atomic<int> gate{0};        // 1: the stream has copied the inputs (arrive ran)
  std::atomic<int> arrivals{0};    // proxies that have not reached the record yet
  std::atomic<int> holds{0};       // its proxies and its stream; 0: back to the pool
  std::atomic<bool> done{false};   // the flag is set
  std::atomic<bool> cancelled{false};  // its stream work could not all be queued
  std::vector<StreamUse> uses;     // its ranks and streams, for the shared-stream check

  uint32_t* flag() { return reinterpret_cast<uint32_t*>(block); }
};

namespace {

constexpr size_t kFlagBytes = 64;
constexpr size_t kAlign = 256;

thread_local bool tlsOnProxy = false;

// Proxies sleep here; host functions, pushes and completions wake them. Leaked: host
// functions may still run while the process exits.
struct Wake {
  std::mutex mu;
  std::condition_variable cv;
};
Wake& wake() {
  static Wake* w = new Wake();
  return *w;
}
void wakeAll() {
  Wake& w = wake();
  { std::lock_guard<std::mutex> lock(w.mu); }
  w.cv.notify_all();
}
// Waits until `ready()`; wakes at least every few milliseconds (abort flags do not notify).
template <typename Pred>
void waitFor(Pred ready) {
  Wake& w = wake();
  std::unique_lock<std::mutex> lock(w.mu);
  while (!ready()) w.cv.wait_for(lock, std::chrono::milliseconds(5));
}

struct Pool {
  std::mutex mu;
  std::vector<StagedRecord*> free;
};
Pool& pool() {
  static Pool* p = new Pool();
  return *p;
}

StagedRecord* takeRecord() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.free.empty()) return new StagedRecord();
  StagedRecord* r = p.free.back();
  p.free.pop_back();
  return r;
}

void dropHold(StagedRecord* r) {
  if (r->holds.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  p.free.push_back(r);
}

// Staged work queued and not yet run. A record holds every stream of its launch until it
// has run (a group's streams are joined), and it runs only once every rank it waits for has
// reached the host. If a rank of the same communicator that the record lacks queues work on
// one of those streams, that work never reaches the host: both wait forever. Refused instead
// (ncclInvalidUsage); what ranks of one process must do is use a stream each or one group.
struct StreamUses {
  std::mutex mu;
  std::vector<const std::vector<StreamUse>*> pending;  // each pending record's uses
};
StreamUses& streamUses() {
  static StreamUses* u = new StreamUses();
  return *u;
}

// Throws when `uses` would queue behind a pending record that waits for one of its ranks;
// otherwise registers `uses` (a record's, alive until releaseStreams).
void claimStreams(const std::vector<StreamUse>* uses, const char* coll) {
  StreamUses& u = streamUses();
  std::lock_guard<std::mutex> lock(u.mu);
  for (const StreamUse& a : *uses)
    for (const std::vector<StreamUse>* r : u.pending) {
      const StreamUse* holder = nullptr;  // the record's rank on a's stream
      bool hasRank = false;               // the record includes a's rank itself
      for (const StreamUse& b : *r) {
        if (b.commHash != a.commHash) continue;
        if (b.stream == a.stream && b.device == a.device) holder = &b;
        hasRank |= b.rank == a.rank;
      }
      if (holder && !hasRank)
        LOOM_THROW(kInvalidUsage,
                   "rank %d: %s on device buffers on stream %p (device %d), where rank %d of "
                   "the same communicator has staged work waiting: ranks of one process that "
                   "share a stream wait for each other forever (the first one's wait holds the "
                   "stream). Give each rank a stream of its own, or issue the ranks' calls in "
                   "one ncclGroupStart/ncclGroupEnd",
                   a.rank, coll, a.stream, a.device, holder->rank);
    }
  u.pending.push_back(uses);
}

void releaseStreams(const std::vector<StreamUse>* uses) {
  StreamUses& u = streamUses();
  std::lock_guard<std::mutex> lock(u.mu);
  auto it = std::find(u.pending.begin(), u.pending.end(), uses);
  if (it != u.pending.end()) u.pending.erase(it);
}

// Host functions: run by CUDA on its own thread; they flip a word and return.
void arrive(void* p) {
  static_cast<StagedRecord*>(p)->gate.store(1, std::memory_order_release);
  wakeAll();
}
void release(void* p) { dropHold(static_cast<StagedRecord*>(p)); }

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
      LOOM_CHECK_USAGE(op.mem == MemKind::kDevice,
                       "rank %d: a group mixes host-memory and device-memory operations (%s on "
                       "host memory); Loom's staged path takes device memory only: issue them "
                       "in separate groups",
                       op.comm.core->rank(), collectiveName(op.coll));
      devices_[i] = deviceOf(op);
      if (std::find(streams_.begin(), streams_.end(), op.stream) == streams_.end()) {
        streams_.push_back(op.stream);
        streamDevice_.push_back(devices_[i]);
        refuseCapture(op, devices_[i]);
      }
    }
    std::vector<StreamUse> uses;
    for (size_t i = 0; i < ops_.size(); ++i) {
      StreamUse u{ops_[i].stream, devices_[i], ops_[i].comm.core->commHash(),
                  ops_[i].comm.core->rank()};
      bool seen = false;
      for (const StreamUse& v : uses)
        seen |= v.stream == u.stream && v.device == u.device && v.commHash == u.commHash &&
                v.rank == u.rank;
      if (!seen) uses.push_back(u);
    }
    rec_ = takeRecord();
    rec_->uses = std::move(uses);
    try {
      claimStreams(&rec_->uses, collectiveName(ops_[0].coll));
    } catch (...) {
      rec_->holds.store(1);
      dropHold(rec_);
      throw;
    }
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
        releaseStreams(&rec_->uses);
        rec_->holds.store(1);
        dropHold(rec_);
      }
      throw;
    }
  }

 private:
  void refuseCapture(const Op& op, int device) {
    cuda::ScopedDevice sd;
    setDevice(sd, device, op);
    int status = cuda::kStreamCaptureStatusNone;
    check(drv_, st_.streamIsCapturing(op.stream, &status), "cuStreamIsCapturing", op);
    LOOM_CHECK_USAGE(status == cuda::kStreamCaptureStatusNone,
                     "rank %d: %s on device buffers while stream %p is being captured into a CUDA "
                     "graph: Loom's staged path cannot be captured yet (use stock NCCL through "
                     "LOOM_NCCL_FALLBACK, or launch outside the capture)",
                     op.comm.core->rank(), collectiveName(op.coll), op.stream);
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
    }
    if (need > rec_->capacity) {
      cuda::ScopedDevice sd;
      setDevice(sd, devices_[0], ops_[0]);
      if (rec_->block) st_.memFreeHost(rec_->block);
      rec_->block = nullptr;
      rec_->capacity = 0;
      size_t bytes = std::max<size_t>(need, 1 << 16);
      bytes = size_t{1} << (64 - __builtin_clzll(bytes - 1));
      void* p = nullptr;
      check(drv_, st_.memHostAlloc(&p, bytes, cuda::kMemHostAllocPortable | cuda::kMemHostAllocDeviceMap),
            "cuMemHostAlloc (staging)", ops_[0]);
      rec_->block = static_cast<char*>(p);
      rec_->capacity = bytes;
      check(drv_, st_.memHostGetDevicePointer(&rec_->flagDev, p, 0), "cuMemHostGetDevicePointer",
            ops_[0]);
    }
    rec_->hostOps.assign(ops_.begin(), ops_.end());
    char* at = rec_->block + kFlagBytes;
    for (size_t i = 0; i < ops_.size(); ++i) {
      Op& h = rec_->hostOps[i];
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
    std::vector<Communicator*> comms;
    for (const Op& op : ops_)
      if (std::find(comms.begin(), comms.end(), op.comm.core) == comms.end())
        comms.push_back(op.comm.core);
    rec_->gate.store(0);
    rec_->done.store(false);
    rec_->cancelled.store(false);
    rec_->arrivals.store(static_cast<int>(comms.size()));
    rec_->holds.store(static_cast<int>(comms.size()) + 1);  // + the stream's release
    for (Communicator* c : comms) c->staged().push(rec_);
    queued_ = true;
  }

  CuEvent event(size_t slot, int device, const Op& op) {
    if (rec_->events.size() <= slot) rec_->events.resize(slot + 1, {nullptr, -2});
    StagedRecord::Event& e = rec_->events[slot];
    if (e.ev == nullptr || e.device != device) {  // events belong to a device's context
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
    for (size_t i = 0; i < ops_.size(); ++i) {
      const Op& op = ops_[i];
      size_t bytes = inputs ? extents_[i].in : extents_[i].out;
      if (bytes == 0) continue;
      cuda::ScopedDevice sd;
      setDevice(sd, devices_[i], op);
      auto dev = [](const void* p) { return reinterpret_cast<CuDevicePtr>(p); };
      CuResult r = inputs ? st_.memcpyAsync(dev(stageIn_[i]), dev(op.sendbuff), bytes, op.stream)
                          : st_.memcpyAsync(dev(op.recvbuff), dev(stageOut_[i]), bytes, op.stream);
      check(drv_, r, inputs ? "cuMemcpyAsync (device to staging)" : "cuMemcpyAsync (staging to device)",
            op);
    }
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
    if (k > 1) {  // every stream waits for every stream's copies
      std::vector<CuEvent> copied;
      for (size_t s = 0; s < k; ++s) copied.push_back(mark(slot++, s));
      for (size_t t = 0; t < k; ++t)
        for (size_t s = 0; s < k; ++s)
          if (s != t) waitOn(t, copied[s]);
    }
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
  std::vector<Extent> extents_;
  std::vector<char*> stageIn_, stageOut_;
  StagedRecord* rec_ = nullptr;
  bool queued_ = false;
};

// Runs a record's operations on the host engine and lets its stream go on.
void runRecord(StagedRecord* rec) {
  if (!rec->cancelled.load(std::memory_order_acquire) &&
      rec->gate.load(std::memory_order_acquire)) {
    try {
      enqueue(rec->hostOps, Completion::kBeforeReturn);
    } catch (const Error& e) {
      // The call returned long ago: the error reaches ncclCommGetAsyncError.
      for (const Op& op : rec->hostOps)
        if (op.comm.onFailure) op.comm.onFailure(op.comm.owner, e);
    } catch (const std::exception& e) {
      Error err(Code::kInternalError, strprintf("staged operation: %s", e.what()));
      for (const Op& op : rec->hostOps)
        if (op.comm.onFailure) op.comm.onFailure(op.comm.owner, err);
    }
  }
  releaseStreams(&rec->uses);
  __atomic_store_n(rec->flag(), 1u, __ATOMIC_RELEASE);
  rec->done.store(true, std::memory_order_release);
  wakeAll();
}

}  // namespace

bool onStagingProxy() { return tlsOnProxy; }

namespace {
BoolKnob kStagedPath("LOOM_STAGED_PATH", "", true,
                     "serve device buffers that stock NCCL does not (LOOM_NCCL_FALLBACK) by "
                     "copying them through pinned host memory on the caller's stream; 0: "
                     "refuse them (ncclInvalidUsage)");
}  // namespace

std::string stagedUnavailableReason() {
  if (!kStagedPath.get()) return "LOOM_STAGED_PATH=0";
  const cuda::Driver* drv = cuda::driver();
  if (!drv) return "no CUDA driver";
  if (!drv->hasStreams)
    return drv->lib.path() +
           " lacks part of the stream API the staged path needs (cuMemcpyAsync, "
           "cuLaunchHostFunc, cuStreamWaitValue32_v2, cuMemHostAlloc, cuEventRecord ...)";
  return "";
}

void launchStaged(std::span<const Op> ops) {
  const cuda::Driver* drv = cuda::driver();
  std::string why = stagedUnavailableReason();
  if (!why.empty())
    LOOM_THROW(kInvalidUsage, "rank %d: %s on device buffers: Loom's staged path is unavailable: %s",
               ops[0].comm.core->rank(), collectiveName(ops[0].coll), why.c_str());
  Launcher(*drv, ops).run();
}

StagedProxy::~StagedProxy() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wakeAll();
  if (thread_.joinable()) thread_.join();
}

void StagedProxy::push(StagedRecord* rec) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    queue_.push_back(rec);
    queued_.fetch_add(1, std::memory_order_acq_rel);
  }
  wakeAll();
}

void StagedProxy::drain() {
  waitFor([&] { return queued_.load(std::memory_order_acquire) == 0; });
}

void StagedProxy::loop() {
  tlsOnProxy = true;
  auto aborted = [&] { return abort_ && abort_->load(std::memory_order_relaxed); };
  for (;;) {
    StagedRecord* rec = nullptr;
    waitFor([&] {
      std::lock_guard<std::mutex> lock(mu_);
      if (!queue_.empty()) rec = queue_.front();
      return rec != nullptr || stop_;
    });
    if (!rec) return;  // stopped with nothing queued
    waitFor([&] {
      return rec->gate.load(std::memory_order_acquire) ||
             rec->cancelled.load(std::memory_order_acquire) || aborted();
    });
    // The last proxy to reach a record runs it: every communicator's earlier records
    // are done by then.
    if (rec->arrivals.fetch_sub(1, std::memory_order_acq_rel) == 1) runRecord(rec);
    else waitFor([&] { return rec->done.load(std::memory_order_acquire); });
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.pop_front();
    }
    dropHold(rec);
    queued_.fetch_sub(1, std::memory_order_acq_rel);
    wakeAll();
  }
}

}  // namespace loom
