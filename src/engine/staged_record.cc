#include "engine/staged_record.h"

#include <algorithm>
#include <map>
#include <memory>

#include "base/error.h"

namespace loom::staged {
namespace {

// Leaked: host functions may still run while the process exits.
struct Wake {
  std::mutex mu;
  std::condition_variable cv;
};
Wake& wake() {
  static Wake* w = new Wake();
  return *w;
}

}  // namespace

std::mutex& wakeMutex() { return wake().mu; }
std::condition_variable& wakeCondition() { return wake().cv; }

void wakeAll() {
  Wake& w = wake();
  { std::lock_guard<std::mutex> lock(w.mu); }
  w.cv.notify_all();
}

namespace {

struct Pool {
  std::mutex mu;
  std::vector<StagedRecord*> free;
};
Pool& pool() {
  static Pool* p = new Pool();
  return *p;
}

}  // namespace

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

namespace {

struct Blocks {
  std::mutex mu;
  std::multimap<size_t, PinnedBlock> free;  // by size
};
Blocks& blocks() {
  static Blocks* b = new Blocks();
  return *b;
}

}  // namespace

PinnedBlock takeBlock(size_t atLeast) {
  Blocks& b = blocks();
  std::lock_guard<std::mutex> lock(b.mu);
  auto it = b.free.lower_bound(atLeast);
  if (it == b.free.end()) return {};
  PinnedBlock out = it->second;
  b.free.erase(it);
  return out;
}

void leaveBlock(const PinnedBlock& p) {
  if (!p.host) return;
  Blocks& b = blocks();
  std::lock_guard<std::mutex> lock(b.mu);
  b.free.emplace(p.bytes, p);
}

namespace {

struct Meetings {
  std::mutex mu;
  std::map<std::pair<uint64_t, uint64_t>, std::unique_ptr<LocalMeeting>> open;
};
Meetings& meetings() {
  static Meetings* m = new Meetings();
  return *m;
}

}  // namespace

bool joinMeeting(uint64_t commHash, uint64_t seq, size_t expected, size_t ranks,
                 std::span<const LocalPart> parts, Join how, LocalMeeting** meeting,
                 const Error* failure) {
  bool lead = false, woke = false;
  {
    Meetings& ms = meetings();
    std::lock_guard<std::mutex> lock(ms.mu);
    std::unique_ptr<LocalMeeting>& m = ms.open[{commHash, seq}];
    if (!m) m = std::make_unique<LocalMeeting>();
    *meeting = m.get();
    ++m->present;
    m->expected = expected;
    m->parts.insert(m->parts.end(), parts.begin(), parts.end());
    m->ranks += ranks;
    if (m->state.load() == LocalMeeting::kGathering) {
      if (how == Join::kOnHost) {
        m->state.store(LocalMeeting::kOnHost, std::memory_order_release);
        woke = true;
      } else if (how == Join::kFail) {
        m->code = failure ? failure->code() : Code::kInternalError;
        m->error = failure ? failure->what() : "a rank's launch failed";
        m->state.store(LocalMeeting::kFailed, std::memory_order_release);
        woke = true;
      } else {
        lead = m->ranks == expected;
      }
    }
  }
  if (woke) wakeAll();
  return lead;
}

void settleMeeting(LocalMeeting* m, LocalMeeting::State state, const Error* failure) {
  {
    std::lock_guard<std::mutex> lock(meetings().mu);
    if (failure) {
      m->code = failure->code();
      m->error = failure->what();
    }
    m->state.store(state, std::memory_order_release);
  }
  wakeAll();
}

bool abandonMeeting(LocalMeeting* m, const Error& why) {
  {
    std::lock_guard<std::mutex> lock(meetings().mu);
    if (m->state.load() != LocalMeeting::kGathering) return true;
    if (m->ranks == m->expected) return false;
    m->code = why.code();
    m->error = why.what();
    m->state.store(LocalMeeting::kFailed, std::memory_order_release);
  }
  wakeAll();
  return true;
}

void leaveMeeting(uint64_t commHash, uint64_t seq) {
  StagedRecord* rec = nullptr;
  {
    Meetings& ms = meetings();
    std::lock_guard<std::mutex> lock(ms.mu);
    auto it = ms.open.find({commHash, seq});
    if (it == ms.open.end()) return;
    LocalMeeting& m = *it->second;
    if (--m.present > 0 || m.ranks < m.expected || m.state.load() == LocalMeeting::kGathering)
      return;
    rec = m.leaderRec;
    ms.open.erase(it);
  }
  if (rec) dropHold(rec);
}

// Host functions: run by CUDA on its own thread; they flip a word and return.
void arrive(void* p) {
  auto* r = static_cast<StagedRecord*>(p);
  if (r->captured) {  // a replay: the record goes to its proxies now
    __atomic_store_n(r->flag(), 0u, __ATOMIC_RELEASE);
    r->done.store(false, std::memory_order_relaxed);
    r->cancelled.store(false, std::memory_order_relaxed);
    const int n = static_cast<int>(r->proxies.size());
    r->arrivals.store(n, std::memory_order_relaxed);
    r->holds.fetch_add(n, std::memory_order_relaxed);
    r->gate.store(1, std::memory_order_release);
    for (StagedProxy* px : r->proxies) px->push(r);
    return;
  }
  r->gate.store(1, std::memory_order_release);
  wakeAll();
}
void release(void* p) { dropHold(static_cast<StagedRecord*>(p)); }
// A captured record's user object went: the graph and its executables are gone.
void releaseCaptured(void* p) { dropHold(static_cast<StagedRecord*>(p)); }

}  // namespace loom::staged
