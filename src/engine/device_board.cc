// The board of rank processes on one GPU (engine/device_board.h).
#include "engine/device_board.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <exception>

#include "base/error.h"
#include "base/log.h"
#include "bootstrap/bootstrap.h"
#include "engine/communicator.h"
#include "engine/direct_moves.h"
#include "engine/executor.h"

namespace loom {
namespace {

// "loomb" and the layout's version (2): a board of another build is not misread.
constexpr uint64_t kMagic = 0x6c6f6f6d62000002ull;
constexpr uint32_t kRecords = 16;  // meetings a rank that cannot take part may run ahead
constexpr size_t kMaxMaps = 128;   // peers' allocations kept mapped (then all are closed)
enum : uint32_t { kDirect = 1, kOnHost = 2, kFailed = 3 };

// A rank's lasting entries: its pid, and its events once it made them.
struct alignas(64) RankSlot {
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> hasEvents;  // 1: the handles below are written (release)
  cuda::CuIpcHandle ready, done;
};

}  // namespace

// A rank's part of one meeting.
struct alignas(64) DeviceBoard::Post {
  uint64_t seq;  // the meeting it is for
  uint32_t can;  // 0: the rank cannot take part
  staged::DirectShape shape;
  uint64_t scalarBits;
  uint32_t hasSend, hasRecv;  // broadcast off the root reads nothing, reduce writes nothing
  cuda::CuIpcHandle send, recv;
  uint64_t sendOff, recvOff;
};

namespace {

// One meeting in flight; meeting n uses record (n - 1) % kRecords. Its counters only grow
// over the record's uses: use u is complete once (u + 1) * nranks ranks joined, and the
// record is free for use u once u * nranks ranks left.
struct alignas(64) Record {
  std::atomic<uint64_t> joined, left, settled;  // settled: the meeting its outcome is for
  uint32_t state;
  int32_t leader, code;
  uint32_t doneRecorded;  // kFailed: the leader had queued work, and its `done` follows it
  char error[240];
};

// Meeting seq's record: free once this many ranks have left it, complete once this many
// have joined it (its counters count every use of the record).
uint64_t freeAt(uint64_t seq, int nranks) { return (seq - 1) / kRecords * static_cast<uint64_t>(nranks); }
uint64_t completeAt(uint64_t seq, int nranks) { return freeAt(seq, nranks) + static_cast<uint64_t>(nranks); }

}  // namespace

struct DeviceBoard::Shared {
  uint64_t magic;
  int32_t nranks;
  uint32_t records;
  std::atomic<uint32_t> broken;  // 1: being broken, 2: brokenCode and brokenWhy are written
  int32_t brokenCode;
  char brokenWhy[400];
  // Then RankSlot[nranks], Record[kRecords], Post[kRecords][nranks].

  static size_t bytes(int n) {
    return align(sizeof(Shared)) + sizeof(RankSlot) * n + sizeof(Record) * kRecords +
           sizeof(Post) * kRecords * n;
  }
  static size_t align(size_t b) { return (b + 63) / 64 * 64; }
  char* base() { return reinterpret_cast<char*>(this); }
  RankSlot& slot(int r) {
    return reinterpret_cast<RankSlot*>(base() + align(sizeof(Shared)))[r];
  }
  Record& record(uint64_t seq) {
    auto* recs = reinterpret_cast<Record*>(base() + align(sizeof(Shared)) + sizeof(RankSlot) * nranks);
    return recs[(seq - 1) % kRecords];
  }
  Post& post(uint64_t seq, int r) {
    auto* posts = reinterpret_cast<Post*>(base() + align(sizeof(Shared)) + sizeof(RankSlot) * nranks +
                                          sizeof(Record) * kRecords);
    return posts[((seq - 1) % kRecords) * static_cast<uint64_t>(nranks) + static_cast<uint64_t>(r)];
  }
};

std::unique_ptr<DeviceBoard> DeviceBoard::create(Bootstrap& bs, int device) {
  const int rank = bs.rank(), n = bs.nranks();
  const size_t bytes = Shared::bytes(n);
  constexpr size_t kName = 128;
  std::vector<char> names(kName * static_cast<size_t>(n), 0);
  ShmSegment seg;
  std::string why;
  if (rank == 0) {
    try {
      seg = ShmSegment::create("board", bytes);
      auto* sh = static_cast<Shared*>(seg.data());
      sh->magic = kMagic;
      sh->nranks = n;
      sh->records = kRecords;
      snprintf(names.data(), kName, "%s", seg.name().c_str());
    } catch (const Error& e) {
      why = e.what();
    }
  }
  bs.allGather(names.data(), kName);  // rank 0's name, or "" when it could not make one
  const std::string name(names.data(), strnlen(names.data(), kName));
  if (rank != 0 && !name.empty()) {
    try {
      seg = ShmSegment::open(name, bytes);
      auto* sh = static_cast<Shared*>(seg.data());
      if (sh->magic != kMagic || sh->nranks != n || sh->records != kRecords)
        why = name + " is not this communicator's board (another build of Loom?)";
    } catch (const Error& e) {
      why = e.what();  // another IPC namespace (a container's own /dev/shm), another user
    }
  }
  // Every rank maps it, or none uses it: collectives then take the staged path.
  std::vector<uint8_t> ok(static_cast<size_t>(n), 0);
  ok[static_cast<size_t>(rank)] = !name.empty() && why.empty() ? 1 : 0;
  bs.allGather(ok.data(), 1);
  if (rank == 0 && seg.valid()) seg.unlink();
  for (int r = 0; r < n; ++r)
    if (!ok[static_cast<size_t>(r)]) {
      LOOM_INFO(kLogInit, "rank %d: no direct collectives for the rank processes on device %d: "
                "rank %d could not map their board%s%s", rank, device, r,
                why.empty() ? "" : ": ", why.c_str());
      return nullptr;
    }
  auto* sh = static_cast<Shared*>(seg.data());
  sh->slot(rank).pid.store(static_cast<int32_t>(getpid()), std::memory_order_release);
  bs.barrier();  // every pid is in place
  return std::unique_ptr<DeviceBoard>(new DeviceBoard(std::move(seg), rank, n, device));
}

DeviceBoard::DeviceBoard(ShmSegment seg, int rank, int nranks, int device)
    : seg_(std::move(seg)), sh_(static_cast<Shared*>(seg_.data())), rank_(rank), nranks_(nranks),
      device_(device), peerReady_(static_cast<size_t>(nranks), nullptr),
      peerDone_(static_cast<size_t>(nranks), nullptr) {}

DeviceBoard::~DeviceBoard() {
  const cuda::Driver* drv = cuda::driver();
  if (!drv || !drv->hasIpc || cuda::forkedSinceLoad()) return;
  cuda::ScopedDevice sd;
  std::string why;
  if (!sd.set(device_, &why)) return;
  // Best effort: at exit the driver may already refuse (its results do not matter here).
  closeMaps(*drv);
  for (cuda::CuEvent e : peerReady_)
    if (e) drv->streams.eventDestroy(e);
  for (cuda::CuEvent e : peerDone_)
    if (e) drv->streams.eventDestroy(e);
  if (ready_) drv->streams.eventDestroy(ready_);
  if (done_) drv->streams.eventDestroy(done_);
}

void DeviceBoard::checkBroken(const Op& op) const {
  uint32_t b = sh_->broken.load(std::memory_order_acquire);
  if (b == 0) return;
  for (int spins = 0; b == 1 && spins < 100000; ++spins) {  // its breaker is writing why
    sched_yield();
    b = sh_->broken.load(std::memory_order_acquire);
  }
  if (b == 1)  // its breaker died halfway
    throw Error(Code::kRemoteError, strprintf("rank %d: %s on device buffers: the communicator's "
                                              "direct path is broken", rank_, collectiveName(op.coll)));
  throw Error(static_cast<Code>(sh_->brokenCode),
              strprintf("rank %d: %s on device buffers: the communicator's direct path is broken: "
                        "%s", rank_, collectiveName(op.coll), sh_->brokenWhy));
}

void DeviceBoard::breakBoard(int code, const std::string& why) {
  uint32_t expected = 0;
  if (sh_->broken.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    sh_->brokenCode = code;
    snprintf(sh_->brokenWhy, sizeof sh_->brokenWhy, "%s", why.c_str());
    sh_->broken.store(2, std::memory_order_release);
  }
  throw Error(static_cast<Code>(code), strprintf("rank %d: %s", rank_, why.c_str()));
}

template <typename Ready, typename MayGiveUp>
void DeviceBoard::waitUntil(const Op& op, const char* what, Ready ready, MayGiveUp mayGiveUp) {
  if (ready()) return;
  const double limit = hostTimeoutSec();
  const auto t0 = std::chrono::steady_clock::now();
  auto lastCheck = t0;
  for (unsigned polls = 0; !ready(); ++polls) {
    if (polls < 2000) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    if (polls < 4000) {
      sched_yield();
    } else {
      timespec pause{0, 50000};
      nanosleep(&pause, nullptr);
    }
    checkBroken(op);
    // Once every rank has joined, the leader is at work on this rank's buffers: only a dead
    // peer ends the wait (the leader settles at once otherwise).
    const bool giveUp = mayGiveUp();
    if (const char* how = op.comm.interrupted(); giveUp && how)
      breakBoard(static_cast<int>(Code::kInvalidUsage),
                 strprintf("the communicator was %s on rank %d while it waited for %s", how,
                           rank_, what));
    const auto now = std::chrono::steady_clock::now();
    if (now - lastCheck < std::chrono::milliseconds(100)) continue;
    lastCheck = now;
    for (int r = 0; r < nranks_; ++r) {
      const int pid = sh_->slot(r).pid.load(std::memory_order_acquire);
      if (r != rank_ && pid > 0 && processGone(pid))
        breakBoard(static_cast<int>(Code::kRemoteError),
                   strprintf("rank %d (pid %d, a process on the same GPU) exited while rank %d "
                             "waited for %s", r, pid, rank_, what));
    }
    if (giveUp && limit > 0 && std::chrono::duration<double>(now - t0).count() > limit)
      breakBoard(static_cast<int>(Code::kRemoteError),
                 strprintf("rank %d waited for %s longer than LOOM_TIMEOUT (%.0f s)", rank_, what,
                           limit));
  }
}

void DeviceBoard::ensureEvents(const cuda::Driver& drv) {
  if (ready_ && done_) return;
  auto make = [&](cuda::CuEvent* ev, cuda::CuIpcHandle* h, const char* name) {
    if (cuda::CuResult r = drv.streams.eventCreate(ev, cuda::kEventDisableTiming | cuda::kEventInterprocess);
        r != cuda::kCudaSuccess) {
      *ev = nullptr;
      LOOM_THROW(kUnhandledCudaError, "rank %d: cuEventCreate (interprocess, %s) failed: %s",
                 rank_, name, drv.errorText(r).c_str());
    }
    if (cuda::CuResult r = drv.ipc.ipcGetEventHandle(h, *ev); r != cuda::kCudaSuccess)
      LOOM_THROW(kUnhandledCudaError, "rank %d: cuIpcGetEventHandle (%s) failed: %s", rank_, name,
                 drv.errorText(r).c_str());
  };
  RankSlot& s = sh_->slot(rank_);
  try {
    make(&ready_, &s.ready, "ready");
    make(&done_, &s.done, "done");
  } catch (...) {  // none half made: the next call tries again
    for (cuda::CuEvent* ev : {&ready_, &done_})
      if (*ev) drv.streams.eventDestroy(*ev);
    ready_ = done_ = nullptr;
    throw;
  }
  s.hasEvents.store(1, std::memory_order_release);
}

bool DeviceBoard::exportBuffers(const cuda::Driver& drv, const Op& op, Post* out,
                                std::string* why) {
  const bool root = op.root == rank_;
  out->hasSend = op.coll != Collective::kBroadcast || root;
  out->hasRecv = op.coll != Collective::kReduce || root;
  cuda::CuDevicePtr base = 0;  // the allocation last exported, and its size
  size_t size = 0;
  auto one = [&](const void* p, cuda::CuIpcHandle* h, uint64_t* off, const char* name) {
    const auto a = reinterpret_cast<cuda::CuDevicePtr>(p);
    if (base && a >= base && a < base + size) {  // in the send buffer's allocation (in place)
      *h = out->send;
      *off = a - base;
      return true;
    }
    cuda::CuResult r = drv.ipc.memGetAddressRange(&base, &size, a);
    if (r == cuda::kCudaSuccess) r = drv.ipc.ipcGetMemHandle(h, base);
    if (r != cuda::kCudaSuccess) {
      *why = strprintf("its %s buffer %p cannot be shared with CUDA IPC (%s; memory from "
                       "cudaMalloc can, memory from a stream-ordered pool or cuMemCreate "
                       "cannot)", name, p, drv.errorText(r).c_str());
      return false;
    }
    *off = a - base;
    return true;
  };
  return (!out->hasSend || one(op.sendbuff, &out->send, &out->sendOff, "send")) &&
         (!out->hasRecv || one(op.recvbuff, &out->recv, &out->recvOff, "receive"));
}

bool DeviceBoard::join(uint64_t seq) {
  return sh_->record(seq).joined.fetch_add(1, std::memory_order_acq_rel) + 1 ==
         completeAt(seq, nranks_);
}

void DeviceBoard::settle(uint64_t seq, uint32_t state, int code, const std::string& error,
                         bool doneRecorded) {
  Record& rec = sh_->record(seq);
  rec.state = state;
  rec.leader = rank_;
  rec.code = code;
  rec.doneRecorded = doneRecorded ? 1 : 0;
  snprintf(rec.error, sizeof rec.error, "%s", error.c_str());
  rec.settled.store(seq, std::memory_order_release);
}

void DeviceBoard::skip(const Op& op, uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  checkBroken(op);
  waitFree(op, seq);
  postCannot(seq);
}

void DeviceBoard::waitFree(const Op& op, uint64_t seq) {
  Record& rec = sh_->record(seq);
  waitUntil(op, "the other ranks to leave an earlier collective",
            [&] { return rec.left.load(std::memory_order_acquire) >= freeAt(seq, nranks_); },
            [] { return true; });
}

// A rank that cannot take part knows the outcome: it posts so, settles the meeting if it
// completes it, and goes on without waiting.
void DeviceBoard::postCannot(uint64_t seq) {
  Post& p = sh_->post(seq, rank_);
  p.seq = seq;
  p.can = 0;
  if (join(seq)) settle(seq, kOnHost, 0, "");
  sh_->record(seq).left.fetch_add(1, std::memory_order_release);
}

bool DeviceBoard::meet(const cuda::Driver& drv, const Op& op, uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  checkBroken(op);
  waitFree(op, seq);
  Record& rec = sh_->record(seq);
  Post& p = sh_->post(seq, rank_);  // this rank's, free since waitFree
  std::string why;
  bool can = drv.hasIpc && op.comm.core->localDirect() && staged::canGoDirect(op, cuda::kernels());
  cuda::ScopedDevice sd;
  if (can && !sd.set(device_, &why)) can = false;
  if (can && !exportBuffers(drv, op, &p, &why)) {
    can = false;
    if (!warnedNoExport_) LOOM_INFO(kLogColl, "rank %d: %s", rank_, why.c_str());
    warnedNoExport_ = true;
  }
  if (can) {
    // Events first: the leader may wait on this rank's "ready" once it has joined.
    try {
      ensureEvents(drv);
      if (cuda::CuResult r = drv.streams.eventRecord(ready_, op.stream); r != cuda::kCudaSuccess)
        LOOM_THROW(kUnhandledCudaError, "rank %d: cuEventRecord (ready) failed: %s", rank_,
                   drv.errorText(r).c_str());
    } catch (const Error& e) {
      can = false;
      why = e.what();
      LOOM_WARN("rank %d: %s on device buffers goes through the host engine: %s", rank_,
                collectiveName(op.coll), why.c_str());
    }
  }
  if (!can) {
    postCannot(seq);
    return false;
  }
  p.seq = seq;
  p.can = 1;
  p.shape = staged::DirectShape::of(op);
  p.scalarBits = op.red.scalarBits;
  if (join(seq)) {
    lead(drv, op, seq);
  } else {
    waitUntil(op, "the other ranks to issue the same collective",
              [&] { return rec.settled.load(std::memory_order_acquire) == seq; },
              [&] { return rec.joined.load(std::memory_order_acquire) < completeAt(seq, nranks_); });
  }
  const uint32_t state = rec.state;
  const int leader = rec.leader, code = rec.code;
  const std::string error = rec.error;
  std::string waitError;
  if (leader != rank_ && (state == kDirect || (state == kFailed && rec.doneRecorded))) {
    // After the leader's work, never before (also work it queued before it failed).
    try {
      cuda::CuEvent ev = openedEvent(drv, leader, true);
      if (cuda::CuResult r = drv.streams.streamWaitEvent(op.stream, ev, 0); r != cuda::kCudaSuccess)
        waitError = "cuStreamWaitEvent (the leader's done) failed: " + drv.errorText(r);
    } catch (const Error& e) {
      waitError = e.what();
    }
  }
  rec.left.fetch_add(1, std::memory_order_release);
  if (!waitError.empty())
    LOOM_THROW(kUnhandledCudaError, "rank %d: %s on device buffers: %s", rank_,
               collectiveName(op.coll), waitError.c_str());
  if (state == kFailed)
    throw Error(static_cast<Code>(code),
                strprintf("rank %d: %s on device buffers, led by rank %d: %s", rank_,
                          collectiveName(op.coll), leader, error.c_str()));
  return state == kDirect;
}

void DeviceBoard::lead(const cuda::Driver& drv, const Op& op, uint64_t seq) {
  // Where every rank can, with one shape: direct.
  std::string why;
  std::vector<staged::DirectRank> ranks(static_cast<size_t>(nranks_));
  for (int r = 0; r < nranks_ && why.empty(); ++r) {
    const Post& q = sh_->post(seq, r);
    if (q.seq != seq) {
      why = strprintf("rank %d's post is for meeting %llu, not %llu", r,
                      static_cast<unsigned long long>(q.seq), static_cast<unsigned long long>(seq));
    } else if (!q.can) {
      why = strprintf("rank %d cannot take part", r);
    } else if (!(q.shape == staged::DirectShape::of(op))) {
      why = strprintf("rank %d issued another shape", r);
    }
  }
  if (!why.empty()) {
    LOOM_INFO(kLogColl, "rank %d: %s #%llu of processes on one GPU goes through the host engine: "
              "%s", rank_, collectiveName(op.coll), static_cast<unsigned long long>(seq),
              why.c_str());
    return settle(seq, kOnHost, 0, "");
  }
  // Fetched once: another thread may give the module up meanwhile (cuda::disableKernels).
  const cuda::Kernels* kern = cuda::kernels();
  if (!staged::canGoDirect(op, kern)) return settle(seq, kOnHost, 0, "");
  cuda::ScopedDevice sd;
  std::string devWhy;
  if (!sd.set(device_, &devWhy)) return settle(seq, kOnHost, 0, "");
  std::vector<cuda::CuEvent> waits;
  try {
    // Bounded: a freed allocation's mapping is never used again (a new one has a new
    // handle), and it may hold the peer's memory. Before this meeting could overflow the
    // cache, once the GPU has finished with them all, every mapping is closed; the ones
    // still in use are opened again.
    if (maps_.size() + 2 * static_cast<size_t>(nranks_) > kMaxMaps) closeMaps(drv);
    for (int r = 0; r < nranks_; ++r) {
      const Post& q = sh_->post(seq, r);
      staged::DirectRank& d = ranks[static_cast<size_t>(r)];
      d.scalarBits = q.scalarBits;
      if (r == rank_) {
        d.send = op.sendbuff;
        d.recv = op.recvbuff;
        continue;
      }
      d.send = q.hasSend ? reinterpret_cast<const void*>(mapped(drv, q.send) + q.sendOff) : nullptr;
      d.recv = q.hasRecv ? reinterpret_cast<void*>(mapped(drv, q.recv) + q.recvOff) : nullptr;
      waits.push_back(openedEvent(drv, r, false));
    }
  } catch (const std::exception& e) {
    LOOM_WARN("rank %d: %s of processes on one GPU goes through the host engine: %s", rank_,
              collectiveName(op.coll), e.what());
    return settle(seq, kOnHost, 0, "");
  } catch (...) {
    return settle(seq, kOnHost, 0, "");
  }
  bool queued = false;
  try {
    for (cuda::CuEvent ev : waits)
      if (cuda::CuResult r = drv.streams.streamWaitEvent(op.stream, ev, 0); r != cuda::kCudaSuccess)
        LOOM_THROW(kUnhandledCudaError, "cuStreamWaitEvent (a rank's ready) failed: %s",
                   drv.errorText(r).c_str());
    staged::queueDirect(drv, kern, op, ranks, op.stream, &queued);
    if (cuda::CuResult r = drv.streams.eventRecord(done_, op.stream); r != cuda::kCudaSuccess)
      LOOM_THROW(kUnhandledCudaError, "cuEventRecord (done) failed: %s", drv.errorText(r).c_str());
  } catch (const staged::KernelsUnusable&) {
    return settle(seq, kOnHost, 0, "");
  } catch (...) {
    // The others must still wait for what was queued: `done` follows it.
    Code code = Code::kInternalError;
    std::string what = "an unknown exception";
    try {
      throw;
    } catch (const Error& e) {
      code = e.code();
      what = e.what();
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    const bool recorded = queued && drv.streams.eventRecord(done_, op.stream) == cuda::kCudaSuccess;
    return settle(seq, kFailed, static_cast<int>(code), what, recorded);
  }
  // Said once it is queued (a module that cannot launch sends it to the host instead).
  LOOM_INFO(kLogColl, "%s #%llu: %zu bytes per rank, moved by rank %d between the buffers of %d "
            "rank processes on device %d through CUDA IPC, on stream %p",
            collectiveName(op.coll), static_cast<unsigned long long>(seq), op.bytes(), rank_,
            nranks_, device_, op.stream);
  settle(seq, kDirect, 0, "");
}

cuda::CuDevicePtr DeviceBoard::mapped(const cuda::Driver& drv, const cuda::CuIpcHandle& h) {
  std::string key(h.reserved, sizeof h.reserved);
  auto it = maps_.find(key);
  if (it != maps_.end()) return it->second;
  cuda::CuDevicePtr p = 0;
  if (cuda::CuResult r = drv.ipc.ipcOpenMemHandle(&p, h, cuda::kIpcMemLazyEnablePeerAccess);
      r != cuda::kCudaSuccess)
    LOOM_THROW(kUnhandledCudaError, "cuIpcOpenMemHandle failed: %s", drv.errorText(r).c_str());
  maps_[key] = p;
  return p;
}

void DeviceBoard::closeMaps(const cuda::Driver& drv) {
  if (maps_.empty()) return;
  drv.ipc.ctxSynchronize();  // the work queued on them has finished (the device is current)
  for (const auto& [h, p] : maps_) drv.ipc.ipcCloseMemHandle(p);
  maps_.clear();
}

cuda::CuEvent DeviceBoard::openedEvent(const cuda::Driver& drv, int rank, bool done) {
  cuda::CuEvent& ev = (done ? peerDone_ : peerReady_)[static_cast<size_t>(rank)];
  if (ev) return ev;
  const RankSlot& s = sh_->slot(rank);
  if (s.hasEvents.load(std::memory_order_acquire) != 1)
    LOOM_THROW(kInternalError, "rank %d's events are not on the board", rank);
  if (cuda::CuResult r = drv.ipc.ipcOpenEventHandle(&ev, done ? s.done : s.ready);
      r != cuda::kCudaSuccess) {
    ev = nullptr;
    LOOM_THROW(kUnhandledCudaError, "cuIpcOpenEventHandle (rank %d's %s event) failed: %s", rank,
               done ? "done" : "ready", drv.errorText(r).c_str());
  }
  return ev;
}

}  // namespace loom
