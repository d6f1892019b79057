#include "engine/flight_recorder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "base/host.h"
#include "base/json.h"
#include "base/log.h"
#include "base/time.h"
#include "engine/recorder_registry.h"
#include "kernels/reduce.h"

namespace loom {
namespace {

IntKnob kEntries("LOOM_FLIGHT_RECORDER", "", 1024,
                 "Operations each communicator's flight recorder keeps (the last N, rounded up "
                 "to a power of two; 0: off). Dumped to LOOM_DUMP_DIR on a failure, an abort, "
                 "SIGUSR1 or loomDumpState; merged by loom-postmortem");
StringKnob kDumpDir("LOOM_DUMP_DIR", "", "",
                    "Directory where each rank writes its flight recorder (loom-<comm>-r<rank>"
                    ".jsonl) when an operation fails, the communicator is aborted or the "
                    "process gets SIGUSR1. Unset: no automatic dumps");

IntKnob kArrivalSummary("LOOM_ARRIVAL_SUMMARY_OPS", "", 1000,
                        "Every this many operations, each rank logs (NCCL_DEBUG=INFO, subsystem "
                        "RAS) how long they waited for their peers: the rank that waits least is "
                        "the one the others wait for (0: off)");

constexpr auto kRelaxed = std::memory_order_relaxed;

// Steady-clock nanoseconds as Unix seconds (the dump's times must line up across hosts).
double wallSeconds(uint64_t steadyNs, int64_t offsetNs) {
  if (steadyNs == 0) return 0;
  return static_cast<double>(static_cast<int64_t>(steadyNs) + offsetNs) / 1e9;
}

int64_t steadyToWallOffset() { return static_cast<int64_t>(realtimeNs()) - static_cast<int64_t>(nowNs()); }

const char* redopName(int op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  return op >= 0 && op < 5 ? kNames[op] : "user";
}

std::string recordJson(const FlightRecord& r, int64_t off) {
  std::string peers;
  for (int i = 0; i < r.npeers && i < FlightEntry::kMaxPeers; ++i)
    peers += strprintf("%s%d", i ? "," : "", r.peers[i]);
  bool ended = r.state == OpState::kCompleted || r.state == OpState::kFailed;
  uint64_t end = ended ? r.endNs : nowNs();
  std::string s = strprintf(
      "{\"type\":\"op\",\"seq\":%llu,\"coll\":\"%s\",\"algo\":\"%s\",\"count\":%llu,"
      "\"bytes\":%llu,\"dtype\":\"%s\",\"op\":\"%s\",\"root\":%d,\"peers\":[%s],"
      "\"npeers\":%d,\"state\":\"%s\",\"started_at\":%.6f,\"ended_at\":%.6f,"
      "\"duration_us\":%.1f,\"timed\":%s,\"wait_us\":%.1f",
      static_cast<unsigned long long>(r.seq), collectiveName(r.coll), algorithmName(r.algo),
      static_cast<unsigned long long>(r.count), static_cast<unsigned long long>(r.bytes),
      r.coll == Collective::kSendRecv ? "bytes" : dtypeName(r.dtype), redopName(r.redop), r.root,
      peers.c_str(), r.npeers, opStateName(r.state), wallSeconds(r.startNs, off),
      wallSeconds(ended ? r.endNs : 0, off), r.startNs && end > r.startNs ? (end - r.startNs) / 1e3 : 0.0,
      r.timed ? "true" : "false", r.waitNs / 1e3);
  if (r.waitingOn >= 0)
    s += strprintf(",\"waiting_on\":%d,\"waiting_to\":\"%s\"", r.waitingOn,
                   r.waitingSend ? "send" : "receive");
  return s + "}";
}

}  // namespace

const char* opStateName(OpState s) {
  switch (s) {
    case OpState::kEmpty: return "empty";
    case OpState::kQueued: return "queued";
    case OpState::kStarted: return "started";
    case OpState::kCompleted: return "completed";
    case OpState::kFailed: return "failed";
  }
  return "?";
}

size_t FlightRecorder::configuredCapacity() {
  int64_t n = kEntries.get();
  if (n <= 0) return 0;
  if (n > (1 << 20)) n = 1 << 20;
  return static_cast<size_t>(n);
}

std::string FlightRecorder::dumpDir() { return kDumpDir.get(); }

FlightRecorder::FlightRecorder(uint64_t commHash, int rank, int nranks, size_t capacity)
    : commHash_(commHash), rank_(rank), nranks_(nranks) {
  if (capacity > 0) {
    capacity_ = 1;
    while (capacity_ < capacity) capacity_ <<= 1;
    mask_ = capacity_ - 1;
    ring_ = std::make_unique<FlightEntry[]>(capacity_);
  }
  int64_t every = kArrivalSummary.get();
  summaryEvery_ = every > 0 ? static_cast<uint64_t>(every) : 0;
  registerRecorder(this);
}

FlightRecorder::~FlightRecorder() { unregisterRecorder(this); }

FlightEntry* FlightRecorder::record(uint64_t seq, Collective coll, Algorithm algo,
                                    uint64_t bytes, int dtype, int redop, int root,
                                    const int* peers, int npeers) {
  lastQueued_.store(seq, kRelaxed);
  std::atomic<uint64_t>& q = queued_[static_cast<int>(coll)];
  q.store(q.load(kRelaxed) + 1, kRelaxed);  // one caller at a time: no locked add
  if (!ring_) return nullptr;
  FlightEntry& e = ring_[seq & mask_];
  e.seq.store(0, kRelaxed);  // readers skip it while it changes
  std::atomic_thread_fence(std::memory_order_release);  // ... and never see new fields first
  e.bytes.store(bytes, kRelaxed);
  e.startNs.store(0, kRelaxed);
  e.endNs.store(0, kRelaxed);
  e.waitNs.store(0, kRelaxed);
  FlightEntry::Meta m{};
  m.coll = static_cast<uint8_t>(coll);
  m.algo = static_cast<uint8_t>(algo);
  m.state = static_cast<uint8_t>(OpState::kQueued);
  m.dtype = static_cast<uint8_t>(dtype);
  m.redop = static_cast<uint8_t>(redop < 0 || redop > 255 ? 255 : redop);
  m.npeers = static_cast<uint16_t>(npeers > 65535 ? 65535 : npeers);
  e.setMeta(m);
  e.ranks.store(FlightEntry::pack(root, -1), kRelaxed);
  e.peers.store(FlightEntry::pack(npeers > 0 ? peers[0] : -1, npeers > 1 ? peers[1] : -1), kRelaxed);
  e.seq.store(seq, std::memory_order_release);
  return &e;
}

void FlightRecorder::add(FlightEntry* e, uint64_t start, uint64_t end) {
  e->endNs.store(end, kRelaxed);
  Totals& t = totals_[e->getMeta().coll % kCollectiveCount];
  // One thread at a time finishes a communicator's operations (they run in issue order).
  uint64_t bytes = e->bytes.load(kRelaxed);
  t.ops.store(t.ops.load(kRelaxed) + 1, kRelaxed);
  t.bytes.store(t.bytes.load(kRelaxed) + bytes, kRelaxed);
  if (e->timed() && end > start) {
    uint64_t weight = bytes >= FlightEntry::kTimedBytes ? 1 : FlightEntry::kSampleEvery;
    t.ns.store(t.ns.load(kRelaxed) + (end - start) * weight, kRelaxed);
  }
}

void FlightRecorder::complete(FlightEntry* e, uint64_t seq) {
  if ((e = held(e, seq))) {
    // See FlightEntry: untimed operations end at their last activity the executor noted;
    // one that never waited is stamped now, coarsely ("ended N s ago" needs it).
    uint64_t start = e->startNs.load(kRelaxed);
    uint64_t end = e->timed() ? nowNs() : e->endNs.load(kRelaxed);
    if (end == 0) end = coarseNowNs();
    if (start == 0) e->startNs.store(start = end, kRelaxed);
    add(e, start, end);
    e->setState(OpState::kCompleted);
  }
  if (seq > lastCompleted_.load(kRelaxed)) lastCompleted_.store(seq, kRelaxed);
  if (summaryEvery_ && ++summaryOps_ >= summaryEvery_) summarise(seq);
}

void FlightRecorder::summarise(uint64_t seq) {
  if (!logEnabled(LogLevel::kInfo, kLogRas)) {
    summaryOps_ = 0;
    return;
  }
  uint64_t n = 0, waitNs = 0, maxNs = 0;
  FlightRecord r;
  for (uint64_t q = seq; q > seq - summaryOps_ && read(q, &r); --q) {
    if (r.state != OpState::kCompleted) continue;
    ++n;
    waitNs += r.waitNs;
    maxNs = std::max(maxNs, r.waitNs);
  }
  summaryOps_ = 0;
  if (n == 0) return;
  LOOM_INFO(kLogRas,
            "comm %016llx rank %d: operations #%llu-#%llu waited for their peers %.1f us each on "
            "average, %.1f us at most (the rank that waits least arrives last; loom-status "
            "compares all ranks)",
            static_cast<unsigned long long>(commHash_), rank_,
            static_cast<unsigned long long>(seq - n + 1), static_cast<unsigned long long>(seq),
            waitNs / 1e3 / n, maxNs / 1e3);
}

void FlightRecorder::fail(FlightEntry* e, uint64_t seq) {
  failures_.fetch_add(1, kRelaxed);
  if (!(e = held(e, seq))) return;
  e->endNs.store(nowNs(), kRelaxed);
  e->setState(OpState::kFailed);
}

void FlightRecorder::noteError(const std::string& what) {
  std::lock_guard<std::mutex> lock(errMu_);
  if (error_.empty()) error_ = what;
}

std::string FlightRecorder::error() const {
  std::lock_guard<std::mutex> lock(errMu_);
  return error_;
}

uint64_t FlightRecorder::lastStarted() const {
  uint64_t done = lastCompleted(), last = lastQueued();
  uint64_t started = done;
  for (uint64_t s = done + 1; s <= last && s <= done + capacity_; ++s) {
    FlightRecord r;
    if (read(s, &r) && r.state != OpState::kQueued) started = s;
    else break;
  }
  return started;
}

bool FlightRecorder::read(uint64_t seq, FlightRecord* out) const {
  if (!ring_ || seq == 0) return false;
  const FlightEntry& e = ring_[seq & mask_];
  if (e.seq.load(std::memory_order_acquire) != seq) return false;
  FlightRecord r;
  r.seq = seq;
  FlightEntry::Meta m = e.getMeta();
  r.coll = static_cast<Collective>(m.coll);
  r.algo = static_cast<Algorithm>(m.algo);
  r.bytes = e.bytes.load(kRelaxed);
  r.dtype = m.dtype;
  r.redop = m.redop;
  r.state = static_cast<OpState>(m.state);
  r.waitingSend = m.flags & FlightEntry::kFlagSend;
  r.timed = m.flags & FlightEntry::kFlagTimed;
  uint64_t ranks = e.ranks.load(kRelaxed), peers = e.peers.load(kRelaxed);
  r.root = FlightEntry::low(ranks);
  r.waitingOn = FlightEntry::high(ranks);
  r.startNs = e.startNs.load(kRelaxed);
  r.endNs = e.endNs.load(kRelaxed);
  r.waitNs = e.waitNs.load(kRelaxed);
  r.npeers = m.npeers;
  r.peers[0] = FlightEntry::low(peers);
  r.peers[1] = FlightEntry::high(peers);
  size_t elt = r.coll == Collective::kSendRecv || !dtypeValid(r.dtype) ? 1 : dtypeSize(r.dtype);
  r.count = r.bytes / elt;
  std::atomic_thread_fence(std::memory_order_acquire);
  if (e.seq.load(kRelaxed) != seq) return false;  // rewritten while we read
  *out = r;
  return true;
}

CollTotals FlightRecorder::totals(Collective c) const {
  const Totals& t = totals_[static_cast<int>(c) % kCollectiveCount];
  return {t.ops.load(kRelaxed), t.bytes.load(kRelaxed), t.ns.load(kRelaxed)};
}

double FlightRecorder::recentWaitUs(uint64_t* ops) const {
  uint64_t n = 0, waitNs = 0;
  FlightRecord r;
  for (uint64_t q = lastCompleted(); q > 0 && n < 64; --q) {
    if (!read(q, &r)) break;
    if (r.state != OpState::kCompleted) continue;
    waitNs += r.waitNs;
    ++n;
  }
  if (ops) *ops = n;
  return n ? waitNs / 1e3 / n : 0;
}

std::string FlightRecorder::statusJson() const {
  uint64_t done = lastCompleted(), started = lastStarted(), queued = lastQueued();
  std::string s = strprintf(
      "{\"rank\":%d,\"nranks\":%d,\"comm\":\"%016llx\",\"host\":%s,\"pid\":%d,"
      "\"last_queued\":%llu,\"last_started\":%llu,\"last_completed\":%llu,\"failures\":%llu",
      rank_, nranks_, static_cast<unsigned long long>(commHash_), jsonString(hostName()).c_str(),
      static_cast<int>(getpid()), static_cast<unsigned long long>(queued),
      static_cast<unsigned long long>(started), static_cast<unsigned long long>(done),
      static_cast<unsigned long long>(failures()));
  FlightRecord r;
  if (done < queued && read(done + 1, &r)) s += ",\"current\":" + recordJson(r, steadyToWallOffset());
  // Mean time the last operations waited for their peers: the rank that waits least is the
  // one the others wait for.
  uint64_t n = 0;
  double wait = recentWaitUs(&n);
  if (n) s += strprintf(",\"recent_ops\":%llu,\"recent_wait_us\":%.1f",
                        static_cast<unsigned long long>(n), wait);
  return s + "}";
}

std::string FlightRecorder::dump(const char* reason) const {
  int64_t off = steadyToWallOffset();
  uint64_t last = lastQueued();
  uint64_t first = last > capacity_ ? last - capacity_ + 1 : 1;
  std::string out = strprintf(
      "{\"type\":\"comm\",\"version\":1,\"comm\":\"%016llx\",\"rank\":%d,\"nranks\":%d,"
      "\"host\":%s,\"pid\":%d,\"reason\":%s,\"error\":%s,\"dumped_at\":%.6f,"
      "\"capacity\":%zu,\"last_queued\":%llu,\"last_started\":%llu,\"last_completed\":%llu,"
      "\"recent_wait_us\":%.1f}\n",
      static_cast<unsigned long long>(commHash_), rank_, nranks_, jsonString(hostName()).c_str(),
      static_cast<int>(getpid()), jsonString(reason ? reason : "").c_str(),
      jsonString(error()).c_str(), wallSeconds(nowNs(), off), capacity_,
      static_cast<unsigned long long>(last), static_cast<unsigned long long>(lastStarted()),
      static_cast<unsigned long long>(lastCompleted()), recentWaitUs());
  if (last == 0) return out;
  for (uint64_t s = first; s <= last; ++s) {
    FlightRecord r;
    if (read(s, &r)) out += recordJson(r, off) + "\n";
  }
  return out;
}

void writeFileAtomically(const std::string& path, const std::string& text, int mode) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp = strprintf("%s.%d.%llu.tmp", path.c_str(), static_cast<int>(getpid()),
                              static_cast<unsigned long long>(counter.fetch_add(1)));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) LOOM_THROW(kSystemError, "cannot create %s: %s", tmp.c_str(), strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      LOOM_THROW(kSystemError, "cannot write %s: %s", tmp.c_str(), strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    LOOM_THROW(kSystemError, "cannot rename %s to %s: %s", tmp.c_str(), path.c_str(), strerror(err));
  }
}

std::string FlightRecorder::writeDump(const std::string& dir, const char* reason) const {
  std::string path = strprintf("%s/loom-%016llx-r%d.jsonl", dir.c_str(),
                               static_cast<unsigned long long>(commHash_), rank_);
  std::lock_guard<std::mutex> lock(dumpMu_);
  writeFileAtomically(path, dump(reason), 0644);
  return path;
}

void FlightRecorder::dumpOnEvent(const char* reason) const {
  std::string dir = dumpDir();
  if (dir.empty()) {
    LOOM_INFO(kLogInit, "rank %d: flight recorder not written (%s): set LOOM_DUMP_DIR to keep "
              "it; loom-postmortem merges the ranks' dumps", rank_, reason);
    return;
  }
  try {
    std::string path = writeDump(dir, reason);
    LOOM_WARN("rank %d: flight recorder (%s) written to %s", rank_, reason, path.c_str());
  } catch (const std::exception& e) {
    LOOM_WARN("rank %d: %s", rank_, e.what());
  }
}

}  // namespace loom
