#include "api/ras_gather.h"

#include <nccl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <system_error>
#include <thread>
#include <tuple>

#include "api/comm.h"
#include "api/guard.h"
#include "base/cuda_driver.h"
#include "base/time.h"
#include "bootstrap/bootstrap.h"
#include "engine/job_status.h"
#include "loom/version_gen.h"

namespace loom::ras {
namespace {

// NCCL's RAS order of collectives, in Loom's enum.
constexpr Collective kRasOrder[kRasColls] = {Collective::kBroadcast, Collective::kReduce,
                                             Collective::kAllGather, Collective::kReduceScatter,
                                             Collective::kAllReduce};

// Calls fn on every communicator of this process whose init has completed, each held
// (enterCall) so that a destroy on another thread waits until fn is done with it.
template <class Fn>
void forEachInitialised(Fn fn) {
  for (auto [comm, serial] : api::liveComms()) {
    if (!api::enterCall(comm, serial)) continue;
    struct Leave {
      ncclComm_t c;
      ~Leave() { api::leaveCall(c); }
    } leave{comm};
    // core is set before initState turns ncclSuccess, and stays until the destroy.
    if (comm->initState.load(std::memory_order_acquire) == ncclSuccess) fn(*comm);
  }
}

// "10.0.0.1" of "10.0.0.1:4242", "::1" of "[::1]:4242".
std::string hostOf(const SocketAddr& a) {
  std::string s = a.str();
  if (!s.empty() && s[0] == '[') return s.substr(1, s.find(']') - 1);
  return s.substr(0, s.rfind(':'));
}

RankRecord rankRecord(const ncclComm& c) {
  RankRecord r;
  r.rank = c.rank;
  r.cudaDev = c.cudaDev;
  r.initState = c.initState.load(std::memory_order_relaxed);
  r.asyncError = c.asyncError.load(std::memory_order_relaxed);
  r.finalizeCalled = c.finalized.load(std::memory_order_relaxed);
  r.destroyFlag = c.teardown.load(std::memory_order_relaxed);
  r.abortFlag = c.abortFlag.load(std::memory_order_relaxed);
  for (int i = 0; i < kRasColls; ++i) r.collCounts[i] = c.core->recorder().queuedOps(kRasOrder[i]);
  return r;
}

uint64_t devBit(int dev) { return dev >= 0 && dev < 64 ? uint64_t{1} << dev : 0; }

// Adds c's rank to p (one record per communicator, however many of its ranks live here).
void addRank(ProcessRecord& p, const ncclComm& c) {
  const PeerInfo& me = c.core->peers()[c.rank];
  if (p.node.empty()) {
    p.node = hostOf(c.core->bootstrap().peerAddr(c.rank));
    p.hostHash = me.hostHash;
    p.pidNs = me.pidNs;
  }
  p.cudaDevs |= devBit(c.cudaDev);
  uint64_t hash = c.core->commHash();
  auto it = std::find_if(p.comms.begin(), p.comms.end(), [&](const CommRecord& r) {
    return r.hash == hash && r.nranks == c.nranks;
  });
  if (it == p.comms.end()) {
    CommRecord r;
    r.hash = hash;
    r.nranks = c.nranks;
    r.secondary[0] = c.core->peers()[0].hostHash;
    r.secondary[1] = static_cast<uint64_t>(c.core->peers()[0].pid);
    it = p.comms.insert(p.comms.end(), std::move(r));
  }
  it->ranks.push_back(rankRecord(c));
}

}  // namespace

ProcessRecord localProcess() {
  ProcessRecord p;
  p.pid = getpid();
  forEachInitialised([&](const ncclComm& c) { addRank(p, c); });
  return p;
}

std::string localProcessPayload() { return encodeProcess(localProcess()); }

struct JobView::Known {
  uint64_t hostHash = 0, pidNs = 0;
  int pid = 0;
  // Its ranks' status channels, one per communicator shared with it (none for this process):
  // a rank it has destroyed since refuses, and the next is asked.
  std::vector<Bootstrap::StatusTarget> targets;
  std::optional<ProcessRecord> answer;
  bool timedOut = false;
};

namespace {

// A process that will never answer: gone, or a zombie (it exited; nobody reaped it yet).
bool processGone(int pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = fopen(path, "r");
  if (!f) return errno == ENOENT;
  char buf[512] = {};
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* paren = strrchr(buf, ')');
  return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

// Ranks of communicators this process is not in that nobody reported: bounded, so that a
// peer's record cannot make the report (or this process's memory) grow without end.
constexpr size_t kMaxUnplacedMissing = 1 << 20;

}  // namespace

JobView::JobView() {
  self_.pid = getpid();
  Report& r = report_;
  r.ncclMajor = NCCL_MAJOR;
  r.ncclMinor = NCCL_MINOR;
  r.ncclPatch = NCCL_PATCH;
  r.ncclSuffix = std::string(NCCL_SUFFIX) + "+loom." LOOM_VERSION_STRING;
  if (loom::cuda::detail::gDriverState.load(std::memory_order_acquire) == loom::cuda::detail::kPresent)
    r.cudaDriver = loom::cuda::detail::gDriver->version;  // never loads a driver just to say so
  known_.emplace_back();
  known_[0].pid = self_.pid;
  r.processes.emplace_back();
  r.processes[0].pid = self_.pid;
  // (host, pid namespace, pid) -> index in known_.
  std::map<std::tuple<uint64_t, uint64_t, int>, size_t> index;
  forEachInitialised([&](const ncclComm& c) {
    addRank(self_, c);
    const std::vector<PeerInfo>& peers = c.core->peers();
    const PeerInfo& me = peers[c.rank];
    index.emplace(std::make_tuple(me.hostHash, me.pidNs, me.pid), 0);
    std::vector<Home>& homes = homes_[{c.core->commHash(), c.nranks}];
    homes.assign(peers.size(), Home{});
    std::vector<bool> targeted(known_.size() + peers.size());  // one target per process here
    for (int rank = 0; rank < static_cast<int>(peers.size()); ++rank) {
      const PeerInfo& p = peers[rank];
      auto [it, added] = index.emplace(std::make_tuple(p.hostHash, p.pidNs, p.pid), known_.size());
      const size_t i = it->second;
      if (added) {
        known_.push_back(Known{p.hostHash, p.pidNs, p.pid, {}, {}, false});
        r.processes.emplace_back();
        r.processes.back().pid = p.pid;
        targeted.resize(known_.size() + peers.size());
      }
      homes[rank].process = static_cast<int>(i);
      if (rank < static_cast<int>(c.peerCudaDevs.size())) homes[rank].cudaDev = c.peerCudaDevs[rank];
      ProcessView& v = r.processes[i];
      if (v.node.empty()) v.node = hostOf(c.core->bootstrap().peerAddr(rank));
      v.cudaDevs |= devBit(homes[rank].cudaDev);
      v.nvmlDevs = v.cudaDevs;
      if (i != 0 && !targeted[i]) {
        known_[i].targets.push_back(c.core->bootstrap().statusTarget(rank));
        targeted[i] = true;
      }
    }
  });
  known_[0].hostHash = self_.hostHash;
  known_[0].pidNs = self_.pidNs;
  r.processes[0].node = self_.node;
  r.processes[0].cudaDevs = r.processes[0].nvmlDevs = self_.cudaDevs;
}

JobView::~JobView() = default;

const Report& JobView::gather(double timeoutSec) {
  const uint64_t start = nowNs();
  // One deadline for every process: the client waits for the slowest, not their sum.
  const Deadline deadline = Deadline::in(timeoutSec > 0 ? timeoutSec : 1e6);
  std::atomic<size_t> next{1};
  auto ask = [&] {
    for (size_t i; (i = next.fetch_add(1)) < known_.size();) {
      Known& k = known_[i];
      for (const Bootstrap::StatusTarget& t : k.targets) {
        const double left = static_cast<double>(deadline.ns() - std::min(deadline.ns(), nowNs())) / 1e9;
        if (left <= 0) {
          k.timedOut = true;
          break;
        }
        std::string reply = Bootstrap::queryStatusAt(t, left, kProcessReportDetail);
        ProcessRecord p;
        if (!reply.empty() && decodeProcess(reply, &p)) {
          k.answer = std::move(p);
          break;
        }
        if (deadline.expired()) {  // no answer in time: a stopped or slow process
          k.timedOut = true;
          break;
        }
      }
    }
  };
  auto askSafely = [&] {
    try {
      ask();
    } catch (...) {  // out of memory: the processes not asked yet stay unanswered
    }
  };
  {
    std::vector<std::thread> threads;
    size_t n = std::min<size_t>(known_.size() - 1, 32);
    for (size_t t = 0; t < n; ++t) {
      try {
        threads.emplace_back(askSafely);
      } catch (const std::system_error&) {
        break;  // out of threads: the ones started ask for the rest
      }
    }
    if (threads.empty()) askSafely();
    for (auto& t : threads) t.join();
  }
  known_[0].answer = self_;

  Report& r = report_;
  std::map<std::pair<uint64_t, int>, CommView> comms;
  for (size_t i = 0; i < known_.size(); ++i) {
    ProcessView& v = r.processes[i];
    v.answered = known_[i].answer.has_value();
    r.timeouts += known_[i].timedOut;
    if (!v.answered) {
      // A process of this host (and pid namespace) that no longer runs is dead, not late.
      v.dead = known_[i].hostHash == self_.hostHash && known_[i].pidNs == self_.pidNs &&
               processGone(known_[i].pid);
      continue;
    }
    for (const CommRecord& c : known_[i].answer->comms) {
      CommView& view = comms[{c.hash, c.nranks}];
      if (view.nranks == 0) {
        view.hash = c.hash;
        view.nranks = c.nranks;
        view.secondary[0] = c.secondary[0];
        view.secondary[1] = c.secondary[1];
      }
      for (const RankRecord& k : c.ranks) {
        RankView x;
        x.rank = k.rank;
        x.process = static_cast<int>(i);
        x.cudaDev = x.nvmlDev = k.cudaDev;
        x.initState = k.initState;
        x.asyncError = k.asyncError;
        x.finalizeCalled = k.finalizeCalled;
        x.destroyFlag = k.destroyFlag;
        x.abortFlag = k.abortFlag;
        std::copy(std::begin(k.collCounts), std::end(k.collCounts), x.collCounts);
        view.ranks.push_back(x);
      }
    }
  }
  size_t unplaced = 0;
  for (auto& [key, view] : comms) {
    // In rank order, each rank once (the first process to report it).
    std::stable_sort(view.ranks.begin(), view.ranks.end(),
                     [](const RankView& a, const RankView& b) { return a.rank < b.rank; });
    view.ranks.erase(std::unique(view.ranks.begin(), view.ranks.end(),
                                 [](const RankView& a, const RankView& b) { return a.rank == b.rank; }),
                     view.ranks.end());
    const auto homes = homes_.find(key);
    const bool mine = homes != homes_.end();
    if (!mine) {
      unplaced += static_cast<size_t>(view.nranks) - view.ranks.size();
      if (unplaced > kMaxUnplacedMissing) continue;
    }
    size_t next = 0;
    for (int rank = 0; rank < view.nranks; ++rank) {
      if (next < view.ranks.size() && view.ranks[next].rank == rank) {
        ++next;
        continue;
      }
      MissingRank m;
      m.rank = rank;
      if (mine) {
        m.process = homes->second[rank].process;
        m.cudaDev = m.nvmlDev = homes->second[rank].cudaDev;
        // Its process answered without it: not (or no longer, or not yet) a member.
        m.unresponsive = !r.processes[m.process].answered;
      } else {
        // A communicator this process is not in: where the rank lives is not known here, so
        // it may be a process nobody asked. Missing data, not a mismatch.
        m.unresponsive = true;
      }
      view.missing.push_back(m);
    }
    r.comms.push_back(std::move(view));
  }
  r.collectSec = (nowNs() - start) / 1e9;
  char stamp[32];
  time_t now = time(nullptr);
  struct tm tm{};
  localtime_r(&now, &tm);
  strftime(stamp, sizeof(stamp), "%F %T", &tm);
  r.timestamp = stamp;
  return r;
}

}  // namespace loom::ras
