// The flight recorder: each communicator keeps its last N operations (LOOM_FLIGHT_RECORDER)
// in a ring of fixed entries, written with relaxed atomic stores on the path of every call
// (no allocation, no lock), and read at any time by whoever dumps them: a failure, an abort,
// SIGUSR1, loomDumpState, or a status query from a peer or loom-status. The same object
// counts operations, bytes and time per collective for the metrics exporter.
//
// An entry's life: queued (enqueue gave it a sequence number) -> started (the executor began
// it) -> completed or failed. While an operation waits without progress, the executor notes
// the peer it waits on; the time it spent waiting is what tells a late rank from its peers
// (the last to arrive waits least).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "algo/collective.h"
#include "base/time.h"

namespace loom {

enum class OpState : uint8_t { kEmpty = 0, kQueued, kStarted, kCompleted, kFailed };
const char* opStateName(OpState s);

// One operation, one cache line. Every field is an atomic written relaxed (plain stores
// on x86 and ARM): readers may see an entry mid-way (they check `seq` before and after),
// never a torn value.
//
// Time stamps must cost next to nothing next to an 8-byte all-reduce (LOOM_FLIGHT_RECORDER
// on vs off: within 3%), so most small operations read no clock of their own: the executor
// already reads one when a wait begins (and when a long wait ends), and those times give the
// operation's start and last activity (noteActive), enough for a dump's time line and for
// how long a stuck operation has been waiting. Timed operations read the clock at start and
// end and are what the metrics' time in collectives is made of: every operation of
// kTimedBytes or more, and one small operation in kSampleEvery (chosen by a hash of its
// sequence number, so that a training step's repeating pattern of calls cannot alias with
// it), whose duration counts kSampleEvery times: an unbiased estimate.
struct alignas(64) FlightEntry {
  static constexpr int kMaxPeers = 2;  // the first peers kept; npeers counts them all
  static constexpr uint64_t kTimedBytes = 64 << 10;
  static constexpr uint64_t kSampleEvery = 64;
  static constexpr uint8_t kFlagSend = 1;   // waitingOn: waiting to send (else to receive)
  static constexpr uint8_t kFlagTimed = 2;  // startNs/endNs read at start and end

  // The small fields, packed so that claiming an entry is a few stores.
  struct Meta {
    uint8_t coll, algo, state, flags, dtype, redop;
    uint16_t npeers;
  };
  static_assert(sizeof(Meta) == 8);

  std::atomic<uint64_t> seq{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> startNs{0};  // steady clock (nowNs); 0: not known
  std::atomic<uint64_t> endNs{0};    // once completed or failed; before: the last activity
  std::atomic<uint64_t> waitNs{0};   // time waited for peers (waits of >~10 us)
  std::atomic<uint64_t> meta{0};     // Meta
  std::atomic<uint64_t> ranks{0};    // root | the peer a stalled wait is on (-1 none) << 32
  std::atomic<uint64_t> peers{0};    // the first two peers (-1 none)

  static uint64_t pack(int32_t lo, int32_t hi) {
    return static_cast<uint32_t>(lo) | static_cast<uint64_t>(static_cast<uint32_t>(hi)) << 32;
  }
  static int32_t low(uint64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v)); }
  static int32_t high(uint64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v >> 32)); }
  Meta getMeta() const {
    uint64_t v = meta.load(std::memory_order_relaxed);
    Meta m;
    memcpy(&m, &v, sizeof(m));
    return m;
  }
  void setMeta(const Meta& m) {
    uint64_t v;
    memcpy(&v, &m, sizeof(v));
    meta.store(v, std::memory_order_relaxed);
  }
  void setState(OpState s) {
    Meta m = getMeta();
    m.state = static_cast<uint8_t>(s);
    setMeta(m);
  }
  bool timed() const { return getMeta().flags & kFlagTimed; }

  void start() {
    Meta m = getMeta();
    m.state = static_cast<uint8_t>(OpState::kStarted);
    if (bytes.load(std::memory_order_relaxed) >= kTimedBytes ||
        (seq.load(std::memory_order_relaxed) * 0x9E3779B97F4A7C15ull) >> 58 == 0) {
      m.flags |= kFlagTimed;
      startNs.store(nowNs(), std::memory_order_relaxed);
    }
    setMeta(m);
  }
  // The executor read the clock (nowNs) while this operation was running: a wait began or
  // a long one ended.
  void noteActive(uint64_t ns) {
    if (startNs.load(std::memory_order_relaxed) == 0) startNs.store(ns, std::memory_order_relaxed);
    if (!timed()) endNs.store(ns, std::memory_order_relaxed);
  }
  void addWait(uint64_t ns) {
    waitNs.store(waitNs.load(std::memory_order_relaxed) + ns, std::memory_order_relaxed);
  }
  // peer -1: waits on nobody (any more).
  void noteWaiting(int peer, bool send) {
    ranks.store(pack(low(ranks.load(std::memory_order_relaxed)), peer), std::memory_order_relaxed);
    Meta m = getMeta();
    m.flags = send ? m.flags | kFlagSend : m.flags & ~kFlagSend;
    setMeta(m);
  }
};
static_assert(sizeof(FlightEntry) == 64, "one cache line per operation");

// A plain copy of an entry, for readers.
struct FlightRecord {
  uint64_t seq = 0;
  Collective coll = Collective::kAllReduce;
  Algorithm algo = Algorithm::kRing;
  uint64_t count = 0, bytes = 0;
  int dtype = 0, redop = 0, root = -1;
  OpState state = OpState::kEmpty;
  int waitingOn = -1;
  bool waitingSend = false;
  bool timed = false;
  uint64_t startNs = 0, endNs = 0, waitNs = 0;
  int npeers = 0;
  std::array<int, FlightEntry::kMaxPeers> peers{};
};

// Totals per collective since the communicator was created (metrics).
struct CollTotals {
  uint64_t ops = 0, bytes = 0, ns = 0;
};

// Writes `text` to `path` through a uniquely named temporary file in the same directory
// (created exclusively, never through a symbolic link) renamed over it. Throws loom::Error.
void writeFileAtomically(const std::string& path, const std::string& text, int mode);

class FlightRecorder {
 public:
  // capacity 0: the recorder is off (record() returns nullptr); else rounded up to a power
  // of two.
  FlightRecorder(uint64_t commHash, int rank, int nranks, size_t capacity);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // LOOM_FLIGHT_RECORDER: entries per communicator (0: off).
  static size_t configuredCapacity();
  // LOOM_DUMP_DIR: where automatic dumps go ("" : none).
  static std::string dumpDir();

  bool enabled() const { return capacity_ != 0; }
  size_t capacity() const { return capacity_; }
  uint64_t commHash() const { return commHash_; }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }

  // Claims the entry of operation `seq` (queued now) or returns nullptr when off. The
  // element count is bytes / the type's size (SendRecv groups: bytes, mixed types).
  FlightEntry* record(uint64_t seq, Collective coll, Algorithm algo, uint64_t bytes, int dtype,
                      int redop, int root, const int* peers, int npeers);
  // The executor's transitions of operation `seq`; e is its entry, nullptr when the
  // recorder is off, and is left alone when a later operation has taken it over (a group
  // of more operations than the ring holds).
  void complete(FlightEntry* e, uint64_t seq);
  void fail(FlightEntry* e, uint64_t seq);
  // e if it still holds operation `seq`.
  static FlightEntry* held(FlightEntry* e, uint64_t seq) {
    return e && e->seq.load(std::memory_order_relaxed) == seq ? e : nullptr;
  }
  void noteError(const std::string& what);  // the first failure's message, for dumps

  uint64_t lastQueued() const { return lastQueued_.load(std::memory_order_relaxed); }
  uint64_t lastCompleted() const { return lastCompleted_.load(std::memory_order_relaxed); }
  uint64_t lastStarted() const;
  // The entry of `seq`, if still held and readable; false if overwritten or torn.
  bool read(uint64_t seq, FlightRecord* out) const;
  CollTotals totals(Collective c) const;
  // Operations of collective c queued so far (NCCL's RAS counts per collective).
  uint64_t queuedOps(Collective c) const {
    return queued_[static_cast<int>(c)].load(std::memory_order_relaxed);
  }
  // Mean time the last (up to 64) completed operations waited for their peers, in us.
  double recentWaitUs(uint64_t* ops = nullptr) const;
  uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }
  std::string error() const;

  // The whole recorder as JSON lines: a "comm" header, then one "op" line per entry held.
  std::string dump(const char* reason) const;
  // One line: this rank's place in the job (for status queries): last queued, started and
  // completed sequence numbers and the operation in flight, with what it waits on.
  std::string statusJson() const;
  // Writes dump(reason) to `dir`/loom-<comm>-r<rank>.jsonl (replaced atomically). Returns
  // the path; throws loom::Error if the directory cannot be written.
  std::string writeDump(const std::string& dir, const char* reason) const;
  // The automatic dumps (failure, abort, SIGUSR1) go to LOOM_DUMP_DIR; none when unset.
  // Logs where the dump went, or how to get one. Never throws.
  void dumpOnEvent(const char* reason) const;

 private:
  void add(FlightEntry* e, uint64_t start, uint64_t end);  // totals of a finished entry

  uint64_t commHash_;
  int rank_, nranks_;
  size_t capacity_ = 0, mask_ = 0;
  std::unique_ptr<FlightEntry[]> ring_;
  std::atomic<uint64_t> lastQueued_{0}, lastCompleted_{0};
  std::atomic<uint64_t> failures_{0};
  std::array<std::atomic<uint64_t>, kCollectiveCount> queued_{};  // written by the caller only
  struct Totals {
    std::atomic<uint64_t> ops{0}, bytes{0}, ns{0};
  };
  std::array<Totals, kCollectiveCount> totals_{};
  // Arrival summary every LOOM_ARRIVAL_SUMMARY_OPS operations (RAS log lines), from the
  // entries still held.
  uint64_t summaryEvery_ = 0, summaryOps_ = 0;
  void summarise(uint64_t seq);
  mutable std::mutex dumpMu_;  // one dump of this recorder at a time
  mutable std::mutex errMu_;
  std::string error_;
};

}  // namespace loom
