#include "engine/job_status.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/json.h"
#include "base/log.h"
#include "base/time.h"
#include "engine/communicator.h"
#include "engine/flight_recorder.h"

namespace loom {
namespace {

StatusWire localStatus(const FlightRecorder& rec) {
  StatusWire w{};
  w.magic = kStatusMagic;
  w.rank = rec.rank();
  w.lastQueued = rec.lastQueued();
  w.lastStarted = rec.lastStarted();
  w.lastCompleted = rec.lastCompleted();
  w.currentColl = -1;
  w.waitingOn = -1;
  uint64_t now = nowNs();
  FlightRecord r;
  if (w.lastCompleted < w.lastQueued) {
    w.currentSeq = w.lastCompleted + 1;
    if (rec.read(w.currentSeq, &r)) {
      w.currentColl = static_cast<int>(r.coll);
      w.currentState = static_cast<uint8_t>(r.state);
      if (r.state == OpState::kStarted) {
        w.waitingOn = r.waitingOn;
        w.waitingSend = r.waitingSend;
      }
      w.currentAgeSec = r.startNs && now > r.startNs ? (now - r.startNs) / 1e9 : 0;
    }
  }
  if (w.lastCompleted > 0 && rec.read(w.lastCompleted, &r) && r.endNs && now > r.endNs)
    w.idleSec = (now - r.endNs) / 1e9;
  w.recentWaitUs = rec.recentWaitUs();
  return w;
}

// What /proc says of a process on this host ("stopped", "a zombie", ...); "" if nothing odd.
std::string processState(int pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = fopen(path, "r");
  if (!f) return "gone";
  char buf[512] = {};
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* paren = strrchr(buf, ')');
  if (!paren || paren[1] != ' ') return "";
  switch (paren[2]) {
    case 'T': return "stopped (SIGSTOP?)";
    case 't': return "stopped by a debugger";
    case 'Z': return "a zombie";
    case 'D': return "in uninterruptible sleep";
    default: return "";
  }
}

std::string rankList(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += strprintf("%s%d", i ? ", " : "", v[i]);
  return s;
}

const char* collName(int c) {
  return c >= 0 && c < kCollectiveCount ? collectiveName(static_cast<Collective>(c)) : "operation";
}

}  // namespace

namespace {
std::atomic<std::string (*)()> gProcessReport{nullptr};
}  // namespace

void setProcessReportSource(std::string (*source)()) { gProcessReport.store(source); }

std::string statusPayload(Communicator& c, uint64_t detail) {
  if (detail == kProcessReportDetail) {
    auto source = gProcessReport.load();
    return source ? source() : std::string();
  }
  StatusWire w = localStatus(c.recorder());
  std::string out(reinterpret_cast<const char*>(&w), sizeof(w));
  if (detail == 0) return out;
  std::string json = c.recorder().statusJson();
  if (detail != 1) return out + json;
  json.pop_back();  // the closing brace: the addresses of every rank follow
  json += ",\"listen\":[";
  for (int r = 0; r < c.nranks(); ++r)
    json += (r ? "," : "") + jsonString(c.bootstrap().peerAddr(r).str());
  return out + json + "]}";
}

std::string statusFilePath(Communicator& c) {
  std::string dir = FlightRecorder::dumpDir();
  if (dir.empty()) return "";
  return strprintf("%s/loom-%016llx.status", dir.c_str(),
                   static_cast<unsigned long long>(c.commHash()));
}

void publishStatusAddress(Communicator& c) {
  if (c.rank() != 0) return;
  std::string addr = c.bootstrap().peerAddr(0).str();
  LOOM_INFO(kLogInit, "comm %016llx: job status at %s (loom-status)",
            static_cast<unsigned long long>(c.commHash()), addr.c_str());
  std::string path = statusFilePath(c);
  if (path.empty()) return;
  auto key = Bootstrap::statusKey(c.bootstrap().job());
  std::string hex;
  for (uint8_t b : key) hex += strprintf("%02x", b);
  std::string text = strprintf("{\"comm\":\"%016llx\",\"nranks\":%d,\"address\":%s,\"key\":\"%s\"}\n",
                               static_cast<unsigned long long>(c.commHash()), c.nranks(),
                               jsonString(addr).c_str(), hex.c_str());
  try {
    writeFileAtomically(path, text, 0600);
  } catch (const Error& e) {
    LOOM_WARN("%s", e.what());
  }
}

void unpublishStatusAddress(Communicator& c) {
  if (c.rank() != 0) return;
  std::string path = statusFilePath(c);
  if (!path.empty()) ::unlink(path.c_str());
}

std::string describeStall(Communicator& c, int waitedPeer) {
  const int n = c.nranks(), me = c.rank();
  if (waitedPeer < 0 || waitedPeer >= n) return "";
  std::vector<std::optional<StatusWire>> st(n);
  st[me] = localStatus(c.recorder());
  std::vector<int> ask;
  for (int r = 0; r < n; ++r)
    if (r != me && (n <= 256 || r == waitedPeer)) ask.push_back(r);
  {
    std::vector<std::thread> threads;
    threads.reserve(ask.size());
    for (int r : ask) {
      try {
        threads.emplace_back([&, r] {
          std::string p = c.bootstrap().queryStatus(r, 1.0);
          StatusWire w;
          if (p.size() < sizeof(w)) return;
          memcpy(&w, p.data(), sizeof(w));
          if (w.magic == kStatusMagic && w.rank == r) st[r] = w;
        });
      } catch (const std::system_error&) {  // out of threads: ask fewer
        break;
      }
    }
    for (auto& t : threads) t.join();
  }
  std::vector<bool> asked(n);
  for (int r : ask) asked[r] = true;
  const StatusWire& mine = *st[me];
  std::string what = strprintf("%s #%llu", collName(mine.currentColl),
                               static_cast<unsigned long long>(mine.currentSeq));
  // Ranks at the same sequence number in different collectives: the classic hang (a rank
  // that took another branch of the program).
  std::string mismatch;
  for (int r = 0; r < n; ++r)
    if (st[r] && r != me && st[r]->currentSeq == mine.currentSeq && st[r]->currentColl >= 0 &&
        mine.currentColl >= 0 && st[r]->currentColl != mine.currentColl)
      mismatch += strprintf("%s rank %d is in %s", mismatch.empty() ? "" : ",", r,
                            collName(st[r]->currentColl));
  if (!mismatch.empty())
    mismatch = strprintf("; the ranks disagree on operation #%llu: this rank is in %s,%s",
                         static_cast<unsigned long long>(mine.currentSeq),
                         collName(mine.currentColl), mismatch.c_str());
  // Follow who waits on whom from the peer we wait on to a rank that waits on nobody (or
  // back to a rank already passed: ranks waiting on each other).
  std::vector<bool> seen(n);
  seen[me] = true;
  std::vector<int> chain{me};
  int p = waitedPeer;
  bool cycle = false;
  for (;;) {
    chain.push_back(p);
    if (seen[p]) {
      cycle = true;
      break;
    }
    seen[p] = true;
    if (!st[p] || !st[p]->currentSeq || st[p]->waitingOn < 0 || st[p]->waitingOn >= n) break;
    p = st[p]->waitingOn;
  }
  if (cycle) {
    std::string ring;
    for (size_t i = std::find(chain.begin(), chain.end() - 1, p) - chain.begin(); i < chain.size(); ++i)
      ring += strprintf("%s%d", ring.empty() ? "" : " -> ", chain[i]);
    return strprintf("; job view: ranks %s wait on each other in %s%s", ring.c_str(), what.c_str(),
                     mismatch.c_str());
  }
  std::vector<int> waiters, silent;
  for (int r = 0; r < n; ++r) {
    if (r == p) continue;
    if (!st[r]) {
      if (asked[r]) silent.push_back(r);
    } else if (st[r]->waitingOn == p && st[r]->currentSeq) {
      waiters.push_back(r);
    }
  }
  std::string s = strprintf("; job view: rank %d", p);
  const PeerInfo& info = c.peers()[p];
  if (!st[p] && !asked[p]) {
    s += strprintf(" (reached through rank %d) was not asked (only the peer waited on is, in "
                   "communicators of more than 256 ranks)",
                   chain[chain.size() - 2]);
  } else if (!st[p]) {
    s += " does not answer status queries";
    bool local = info.hostHash == c.peers()[me].hostHash && info.pidNs == c.peers()[me].pidNs;
    std::string ps = local ? processState(info.pid) : "";
    if (!ps.empty()) s += strprintf(" (pid %d on this host is %s)", info.pid, ps.c_str());
    else s += strprintf(" (%s pid %d)", info.hostname, info.pid);
    s += strprintf(" and has not completed %s", what.c_str());
  } else if (st[p]->lastQueued < mine.currentSeq) {
    s += strprintf(" has not called %s yet: its last operation, #%llu, ended %.1f s ago",
                   what.c_str(), static_cast<unsigned long long>(st[p]->lastQueued),
                   st[p]->idleSec);
  } else if (st[p]->currentSeq) {
    s += strprintf(" is in %s #%llu (for %.1f s)", collName(st[p]->currentColl),
                   static_cast<unsigned long long>(st[p]->currentSeq), st[p]->currentAgeSec);
    if (st[p]->waitingOn >= 0) s += strprintf(", waiting on rank %d", st[p]->waitingOn);
  } else {
    s += strprintf(" is not in any operation (it completed #%llu)",
                   static_cast<unsigned long long>(st[p]->lastCompleted));
  }
  if (!waiters.empty()) s += strprintf("; waiting on it: rank%s %s", waiters.size() > 1 ? "s" : "",
                                       rankList(waiters).c_str());
  if (!silent.empty()) s += strprintf("; not answering either: rank%s %s", silent.size() > 1 ? "s" : "",
                                      rankList(silent).c_str());
  return s + mismatch;
}

}  // namespace loom
