// NCCL 2.28.9's RAS report, byte for byte, from a gathered job view (ras_report.h). The
// rules here (what counts as a node, how ranks and communicators are sorted and grouped,
// when individual processes or ranks are listed) are NCCL's, so that `ncclras` output and
// scripts that parse it behave as they do against NCCL. Where NCCL 2.28.9 has a bug, the
// intended output is produced instead; each such place says so.
#include "api/ras_report.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace loom::ras {

const char* const kRasCollNames[kRasColls] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                              "AllReduce"};

namespace {

// ---- Output primitives ----

__attribute__((format(printf, 2, 3))) void appendf(std::string& out, const char* fmt, ...) {
  va_list args, again;
  va_start(args, fmt);
  va_copy(again, args);
  int n = vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  if (n > 0) {
    size_t at = out.size();
    out.resize(at + n + 1);
    vsnprintf(out.data() + at, n + 1, fmt, again);
    out.resize(at + n);  // drop vsnprintf's terminating NUL
  }
  va_end(again);
}

// NCCL's "%.3f", but deaf to LC_NUMERIC: a host program that sets a decimal-comma locale
// must not turn the JSON's number into two.
std::string seconds3(double sec) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, sec, std::chars_format::fixed, 3);
  return std::string(buf, res.ptr);
}

const char* plural(int n, const char* many, const char* one = "") { return n > 1 ? many : one; }

// ---- NCCL's vocabulary ----

// Status bits of a communicator (OR over its ranks); the column shows the highest one.
enum : unsigned { kNoComm = 1, kInit = 2, kRunning = 4, kFinalize = 8, kAbort = 16 };
const char* const kStatusNames[] = {"NOCOMM", "INIT", "RUNNING", "FINALIZE", "ABORT"};
// Error bits; the column is this table indexed by the whole mask.
enum : unsigned { kMismatch = 1, kError = 2, kIncomplete = 4 };
const char* const kErrorNames[] = {"OK",
                                   "MISMATCH",
                                   "ERROR",
                                   "ERROR,MISMATCH",
                                   "INCOMPLETE",
                                   "INCOMPLETE,MISMATCH",
                                   "INCOMPLETE,ERROR",
                                   "INCOMPLETE,ERROR,MISMATCH"};
constexpr int kNcclSuccess = 0, kNcclInProgress = 7;

// Abort outranks finalize (ncclCommAbort also sets destroyFlag), and any init state other
// than done, errors included, reads as INIT.
unsigned rankStatus(const RankView& r) {
  if (r.abortFlag) return kAbort;
  if (r.finalizeCalled || r.destroyFlag) return kFinalize;
  return r.initState == kNcclSuccess ? kRunning : kInit;
}

int statusIndex(unsigned status) {
  int i = 0;
  while (status >>= 1) ++i;
  return i;  // an empty mask (a communicator with no rank data at all) shows as NOCOMM
}

bool isError(int result) { return result != kNcclSuccess && result != kNcclInProgress; }

const char* resultName(int result) {
  switch (result) {
    case 1: return "Unhandled CUDA error";
    case 2: return "System error";
    case 3: return "Internal error";
    case 4: return "Invalid argument";
    case 5: return "Invalid usage";
    case 6: return "Remote process error";
    case 7: return "NCCL operation in progress";
    default: return "Unexpected error";
  }
}

// Whether a group of `count` processes/ranks/nodes out of `total` (-1: no total) is small
// enough to be listed one by one. VERBOSE STATUS lists anything short of half.
bool isOutlier(int count, bool verbose, int total = -1) {
  if (count == 1) return true;
  if (verbose) return total == -1 || count < total * 0.5;
  return count <= 10 && (total == -1 || count <= total * 0.25);
}

std::string gpuString(int cudaDev, int nvmlDev) {
  std::string s = std::to_string(cudaDev);
  if (cudaDev != nvmlDev) appendf(s, " (NVML %d)", nvmlDev);
  return s;
}

std::string devList(uint64_t devs) {
  std::string s;
  for (int d = 0; d < 64; ++d)
    if (devs >> d & 1) appendf(s, "%s%d", s.empty() ? "" : ",", d);
  return s;
}

std::string gpuDevsString(uint64_t cudaDevs, uint64_t nvmlDevs) {
  std::string s = devList(cudaDevs);
  if (cudaDevs != nvmlDevs) s += " (NVML " + devList(nvmlDevs) + ")";
  return s;
}

int gpuCount(const ProcessView& p) { return __builtin_popcountll(p.cudaDevs); }

// ---- Process order ----

bool parseIpv4(std::string_view s, uint8_t* out) {
  for (int i = 0; i < 4; ++i) {
    size_t dot = s.find('.');
    if ((i < 3) != (dot != std::string_view::npos)) return false;
    std::string_view field = s.substr(0, dot);
    unsigned v = 256;
    auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
    if (ec != std::errc() || end != field.data() + field.size() || field.size() > 3 || v > 255)
      return false;
    out[i] = static_cast<uint8_t>(v);
    s = i < 3 ? s.substr(dot + 1) : std::string_view();
  }
  return true;
}

// Colon-separated hex groups; the last may be a dotted IPv4 tail ("::ffff:1.2.3.4").
bool parseIpv6Groups(std::string_view part, bool lastPart, std::vector<uint8_t>& bytes) {
  while (!part.empty()) {
    size_t colon = part.find(':');
    std::string_view group = part.substr(0, colon);
    if (colon == std::string_view::npos && lastPart && group.find('.') != std::string_view::npos) {
      uint8_t v4[4];
      if (!parseIpv4(group, v4)) return false;
      bytes.insert(bytes.end(), v4, v4 + 4);
      return true;
    }
    unsigned v = 0;
    auto [end, ec] = std::from_chars(group.data(), group.data() + group.size(), v, 16);
    if (group.empty() || group.size() > 4 || ec != std::errc() || end != group.data() + group.size())
      return false;
    bytes.push_back(static_cast<uint8_t>(v >> 8));
    bytes.push_back(static_cast<uint8_t>(v));
    if (colon == std::string_view::npos) break;
    part = part.substr(colon + 1);
    if (part.empty()) return false;  // a trailing single ':'
  }
  return true;
}

bool parseIpv6(std::string_view s, uint8_t* out) {
  s = s.substr(0, s.find('%'));  // a scope ("fe80::1%eth0") is not part of the address
  size_t gap = s.find("::");
  std::vector<uint8_t> head, tail;
  if (gap == std::string_view::npos) {
    if (!parseIpv6Groups(s, true, head) || head.size() != 16) return false;
  } else {
    if (!parseIpv6Groups(s.substr(0, gap), false, head)) return false;
    if (!parseIpv6Groups(s.substr(gap + 2), true, tail)) return false;
    if (head.size() + tail.size() > 14) return false;
  }
  std::fill(out, out + 16, 0);
  std::copy(head.begin(), head.end(), out);
  std::copy(tail.begin(), tail.end(), out + 16 - tail.size());
  return true;
}

// NCCL orders processes by their binary address, so IPv4 before IPv6 and 10.0.0.9 before
// 10.0.0.10, with unknown ("") addresses last. Text that is no address sorts as text.
struct NodeKey {
  int family = 3;  // 0 IPv4, 1 IPv6, 2 other text, 3 unknown
  std::array<uint8_t, 16> bytes{};
  std::string text;

  explicit NodeKey(const std::string& node) {
    if (node.empty()) return;
    if (parseIpv4(node, bytes.data())) family = 0;
    else if (parseIpv6(node, bytes.data())) family = 1;
    else family = 2, text = node;
  }
  auto operator<=>(const NodeKey&) const = default;
};

// The job's processes in NCCL's rasPeers order: by node address, then pid (standing in
// for NCCL's port). A rank's "process index" means its position in this order.
class ProcessOrder {
 public:
  explicit ProcessOrder(const std::vector<ProcessView>& procs) : procs_(procs) {
    for (const ProcessView& p : procs) keys_.emplace_back(p.node);
    sorted_.resize(procs.size());
    for (size_t i = 0; i < procs.size(); ++i) sorted_[i] = static_cast<int>(i);
    std::stable_sort(sorted_.begin(), sorted_.end(), [&](int a, int b) {
      if (keys_[a] != keys_[b]) return keys_[a] < keys_[b];
      return procs[a].pid < procs[b].pid;
    });
    position_.resize(procs.size());
    for (size_t i = 0; i < sorted_.size(); ++i) position_[sorted_[i]] = static_cast<int>(i);
  }

  const std::vector<int>& sorted() const { return sorted_; }
  bool known(int idx) const { return idx >= 0 && idx < static_cast<int>(procs_.size()); }
  // Unknown processes (-1) first, as NCCL's -1 peer index would sort.
  int position(int idx) const { return known(idx) ? position_[idx] : -1; }
  bool sameNode(int a, int b) const {
    if (!known(a) || !known(b)) return known(a) == known(b);
    return keys_[a] == keys_[b];
  }
  const ProcessView& operator[](int idx) const { return procs_[idx]; }

 private:
  const std::vector<ProcessView>& procs_;
  std::vector<NodeKey> keys_;
  std::vector<int> sorted_, position_;
};

// "  Rank 3<qualifier> -- GPU 3 managed by process 42 on node 10.0.0.1\n": the one line
// shape every per-rank listing uses.
void appendRankLine(std::string& out, const ProcessOrder& procs, int rank, const std::string& qualifier,
                    int cudaDev, int nvmlDev, int process) {
  if (!procs.known(process)) {
    appendf(out, "  Rank %d%s -- [process information not found]\n", rank, qualifier.c_str());
    return;
  }
  appendf(out, "  Rank %d%s -- GPU %s managed by process %d on node %s\n", rank, qualifier.c_str(),
          gpuString(cudaDev, nvmlDev).c_str(), procs[process].pid, procs[process].node.c_str());
}

void appendRankLine(std::string& out, const ProcessOrder& procs, const RankView& r,
                    const std::string& qualifier = "") {
  appendRankLine(out, procs, r.rank, qualifier, r.cudaDev, r.nvmlDev, r.process);
}

void appendRankLine(std::string& out, const ProcessOrder& procs, const MissingRank& m,
                    const std::string& qualifier = "") {
  appendRankLine(out, procs, m.rank, qualifier, m.cudaDev, m.nvmlDev, m.process);
}

void appendProcessLine(std::string& out, const ProcessView& p) {
  if (gpuCount(p) == 0) {  // Loom's host-memory ranks (NCCL's processes always have one)
    appendf(out, "  Process %d on node %s managing no GPU\n", p.pid, p.node.c_str());
    return;
  }
  appendf(out, "  Process %d on node %s managing GPU%s %s\n", p.pid, p.node.c_str(),
          plural(gpuCount(p), "s"), gpuDevsString(p.cudaDevs, p.nvmlDevs).c_str());
}

// (value, how many have it), most frequent first, then the larger value: NCCL's order for
// every distribution it prints.
struct ValueCount {
  int64_t value;
  int count;
  std::vector<int> members;  // what has the value, in the order it was added
};

std::vector<ValueCount> distribution(const std::vector<std::pair<int64_t, int>>& valueAndMember) {
  std::vector<ValueCount> vcs;
  for (const auto& vm : valueAndMember) {
    const int64_t value = vm.first, member = vm.second;  // clang 14 (the fuzz build) cannot capture a binding
    auto it = std::find_if(vcs.begin(), vcs.end(), [&](const ValueCount& vc) { return vc.value == value; });
    if (it == vcs.end()) it = vcs.insert(vcs.end(), ValueCount{value, 0, {}});
    ++it->count;
    it->members.push_back(member);
  }
  std::sort(vcs.begin(), vcs.end(), [](const ValueCount& a, const ValueCount& b) {
    return a.count != b.count ? a.count > b.count : a.value > b.value;
  });
  return vcs;
}

// ---- Job summary ----

void appendJobSummary(std::string& out, const std::vector<ProcessView>& all, const ProcessOrder& procs,
                      bool verbose) {
  // Nodes as runs of the address order; each holds its processes by pid.
  // NCCL also checks GPUs per process within each node, which the job-wide check implies.
  std::vector<std::vector<int>> nodes;
  int totalGpus = 0;
  bool sameGpus = true;
  for (int idx : procs.sorted()) {
    totalGpus += gpuCount(all[idx]);
    if (nodes.empty() || !procs.sameNode(nodes.back().front(), idx)) nodes.push_back({idx});
    else nodes.back().push_back(idx);
    if (gpuCount(all[idx]) != gpuCount(all[procs.sorted().front()])) sameGpus = false;
  }
  bool sameProcsPerNode = std::all_of(nodes.begin(), nodes.end(),
                                      [&](const auto& n) { return n.size() == nodes.front().size(); });
  int nProcs = static_cast<int>(all.size()), nNodes = static_cast<int>(nodes.size());
  int firstGpus = nProcs > 0 ? gpuCount(all[procs.sorted().front()]) : 0;

  out += "Job summary\n===========\n\n";
  if (sameGpus && sameProcsPerNode) {
    appendf(out,
            "  Nodes  Processes         GPUs  Processes     GPUs\n"
            "(total)   per node  per process    (total)  (total)\n"
            "%7d  %9d  %11d  %9d  %7d\n",
            nNodes, nNodes > 0 ? static_cast<int>(nodes.front().size()) : 0, firstGpus, nProcs, totalGpus);
    return;
  }

  std::vector<std::pair<int64_t, int>> procsPerNode;
  for (int n = 0; n < nNodes; ++n) procsPerNode.emplace_back(nodes[n].size(), n);
  std::vector<ValueCount> nodeDist = distribution(procsPerNode);
  if (sameGpus) {
    out += "  Nodes  Processes         GPUs\n          per node  per process\n";
    for (const ValueCount& vc : nodeDist)
      appendf(out, "%7d  %9" PRId64 "  %11d\n", vc.count, vc.value, firstGpus);
  } else {
    out += "  Nodes  Processes\n          per node\n";
    for (const ValueCount& vc : nodeDist) appendf(out, "%7d  %9" PRId64 "\n", vc.count, vc.value);
    std::vector<std::pair<int64_t, int>> gpusPerProc;
    for (int idx : procs.sorted()) gpusPerProc.emplace_back(gpuCount(all[idx]), idx);
    out += "\n         Processes         GPUs\n                    per process\n";
    for (const ValueCount& vc : distribution(gpusPerProc))
      appendf(out, "         %9d  %11" PRId64 "\n", vc.count, vc.value);
  }
  appendf(out,
          "\n  Nodes  Processes         GPUs\n(total)    (total)      (total)\n%7d  %9d  %11d\n",
          nNodes, nProcs, totalGpus);
  if (!sameGpus) return;

  // The most frequent process count is taken as the norm; nodes with another are named.
  // NCCL 2.28.9 prints the first pids of the whole job for every such node (a bug); this
  // prints each node's own pids, as intended.
  for (size_t i = 1; i < nodeDist.size(); ++i) {
    const ValueCount& vc = nodeDist[i];
    if (!isOutlier(vc.count, verbose, nNodes)) continue;
    appendf(out, "\nThe outlier node%s:\n", plural(vc.count, "s"));
    for (int n : vc.members) {
      std::string pids;
      for (int idx : nodes[n]) appendf(pids, "%s%d", pids.empty() ? "" : ",", all[idx].pid);
      appendf(out, "  Node %s running process%s %s\n", all[nodes[n].front()].node.c_str(),
              plural(static_cast<int>(vc.value), "es"), pids.c_str());
    }
  }
}

// ---- Communicator analysis ----

struct CommFacts {
  const CommView* comm = nullptr;
  unsigned status = 0, errors = 0;
  int nNodes = 0, ranksPerNodeMin = 0, ranksPerNodeMax = 0;
  int nIncomplete = 0, nNoComm = 0;
  std::vector<const RankView*> ranks;       // in rank order
  std::vector<const MissingRank*> missing;  // in rank order
  const RankView* reference = nullptr;      // whose operation counts the others must match
};

CommFacts analyze(const CommView& comm, const ProcessOrder& procs) {
  CommFacts f;
  f.comm = &comm;
  for (const RankView& r : comm.ranks) f.ranks.push_back(&r);
  for (const MissingRank& m : comm.missing) f.missing.push_back(&m);
  std::stable_sort(f.ranks.begin(), f.ranks.end(), [](auto* a, auto* b) { return a->rank < b->rank; });
  std::stable_sort(f.missing.begin(), f.missing.end(), [](auto* a, auto* b) { return a->rank < b->rank; });

  // NCCL walks the ranks grouped by process in address order: node runs give the node
  // count and ranks per node, and the first rank becomes the reference (not always rank 0).
  std::vector<const RankView*> byProcess = f.ranks;
  std::stable_sort(byProcess.begin(), byProcess.end(), [&](auto* a, auto* b) {
    return procs.position(a->process) < procs.position(b->process);
  });
  std::vector<int> ranksPerNode;
  for (size_t i = 0; i < byProcess.size(); ++i) {
    const RankView& r = *byProcess[i];
    if (i == 0 || !procs.sameNode(byProcess[i - 1]->process, r.process)) ranksPerNode.push_back(0);
    ++ranksPerNode.back();
    f.status |= rankStatus(r);
    if (isError(r.initState) || isError(r.asyncError)) f.errors |= kError;
    if (!std::equal(r.collCounts, r.collCounts + kRasColls, byProcess[0]->collCounts)) f.errors |= kMismatch;
  }
  if (!byProcess.empty()) {
    f.reference = byProcess[0];
    f.nNodes = static_cast<int>(ranksPerNode.size());
    f.ranksPerNodeMin = *std::min_element(ranksPerNode.begin(), ranksPerNode.end());
    f.ranksPerNodeMax = *std::max_element(ranksPerNode.begin(), ranksPerNode.end());
  }

  // A rank whose process answered without it is not (or no longer, or not yet) a member;
  // one whose process did not answer leaves the communicator's data incomplete.
  for (const MissingRank* m : f.missing) {
    if (m->unresponsive) {
      ++f.nIncomplete;
      f.errors |= kIncomplete;
    } else {
      ++f.nNoComm;
      f.status |= kNoComm;
      f.errors |= kMismatch;
    }
  }
  if (__builtin_popcount(f.status) > 1) f.errors |= kMismatch;
  return f;
}

struct Group {
  size_t first, count;
};

// Sorts the communicators as NCCL does (largest first; among equals, those with the most
// ranks missing first) and groups runs that share size, node count, status and errors.
std::vector<Group> sortAndGroup(std::vector<CommFacts>& comms) {
  auto key = [](const CommFacts& c) {
    return std::make_tuple(c.comm->nranks, c.nNodes, statusIndex(c.status), c.errors);
  };
  std::stable_sort(comms.begin(), comms.end(), [&](const CommFacts& a, const CommFacts& b) {
    if (key(a) != key(b)) return key(a) > key(b);
    return a.ranks.size() < b.ranks.size();
  });
  std::vector<Group> groups;
  for (size_t i = 0; i < comms.size(); ++i) {
    if (i == 0 || key(comms[i]) != key(comms[i - 1])) groups.push_back({i, 0});
    ++groups.back().count;
  }
  return groups;
}

void appendTable(std::string& out, const std::vector<CommFacts>& comms, const std::vector<Group>& groups) {
  if (comms.empty()) {
    out += "No communicator data collected!\n";
    return;
  }
  out += "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
         "    #  in group  per comm  per node  per comm  in group\n";
  for (size_t g = 0; g < groups.size(); ++g) {
    const CommFacts& first = comms[groups[g].first];
    int minPerNode = first.ranksPerNodeMin, maxPerNode = first.ranksPerNodeMax;
    std::set<std::pair<int, int>> gpus;  // a rank is a (process, device) seen in any comm of the group
    size_t hostRanks = 0;  // ranks without a device (Loom's host memory) count one each
    for (size_t c = groups[g].first; c < groups[g].first + groups[g].count; ++c) {
      minPerNode = std::min(minPerNode, comms[c].ranksPerNodeMin);
      maxPerNode = std::max(maxPerNode, comms[c].ranksPerNodeMax);
      for (const RankView* r : comms[c].ranks) {
        if (r->nvmlDev < 0) ++hostRanks;
        else gpus.emplace(r->process, r->nvmlDev);
      }
    }
    std::string perNode = std::to_string(minPerNode);
    if (minPerNode != maxPerNode) appendf(perNode, "-%d", maxPerNode);
    appendf(out, "%5zu  %8zu  %8d  %8s  %8d  %8zu  %8s  %6s\n", g, groups[g].count, first.nNodes,
            perNode.c_str(), first.comm->nranks, gpus.size() + hostRanks, kStatusNames[statusIndex(first.status)],
            kErrorNames[first.errors]);
  }
}

// ---- Errors ----

void appendProcessBlock(std::string& out, const std::vector<ProcessView>& all, const ProcessOrder& procs,
                        bool verbose, bool dead) {
  std::vector<int> listed;
  for (int idx : procs.sorted())
    if (dead ? all[idx].dead : !all[idx].answered && !all[idx].dead) listed.push_back(idx);
  int n = static_cast<int>(listed.size());
  if (n == 0) return;
  if (dead)
    appendf(out, "DEAD\n  %d job process%s considered dead (unreachable via the RAS network)\n", n,
            plural(n, "es are", " is"));
  else
    appendf(out, "INCOMPLETE\n  Missing communicator data from %d job process%s\n", n, plural(n, "es"));
  if (isOutlier(n, verbose))
    for (int idx : listed) appendProcessLine(out, all[idx]);
  out += "\n";
}

// Error codes 1..6, most frequent first (ties: the lower code), each with its ranks when
// few enough to list.
void appendErrorBreakdown(std::string& out, const ProcessOrder& procs, const CommFacts& c, bool verbose,
                          int RankView::*field) {
  int counts[7] = {};
  for (const RankView* r : c.ranks)
    if (r->*field >= 1 && r->*field <= 6) ++counts[r->*field];
  for (;;) {
    int code = 0;
    for (int i = 1; i <= 6; ++i)
      if (counts[i] > counts[code]) code = i;
    if (code == 0) break;
    int n = counts[code];
    if (n > 1) appendf(out, "  %d ranks reported %s\n", n, resultName(code));
    if (isOutlier(n, verbose))
      for (const RankView* r : c.ranks)
        if (r->*field == code)
          appendRankLine(out, procs, *r, n > 1 ? "" : std::string(" reported ") + resultName(code));
    counts[code] = 0;
  }
}

void appendCommErrors(std::string& out, const ProcessOrder& procs, const CommFacts& c, const char* label,
                      bool verbose) {
  if (c.errors & kIncomplete) {
    appendf(out, "%s INCOMPLETE\n  Missing communicator data from %d rank%s\n", label, c.nIncomplete,
            plural(c.nIncomplete, "s"));
    if (isOutlier(c.nIncomplete, verbose))
      for (const MissingRank* m : c.missing)
        if (m->unresponsive) appendRankLine(out, procs, *m);
    out += "\n";
  }
  if (c.errors & kError) {
    appendf(out, "%s ERROR\n", label);
    struct Kind {
      const char* what;
      int RankView::*field;
    };
    for (Kind k : {Kind{"Initialization", &RankView::initState}, Kind{"Asynchronous", &RankView::asyncError}}) {
      int n = static_cast<int>(std::count_if(c.ranks.begin(), c.ranks.end(),
                                             [&](const RankView* r) { return isError(r->*k.field); }));
      if (n == 0) continue;
      appendf(out, "  %s error%s on %d rank%s\n", k.what, plural(n, "s"), n, plural(n, "s"));
      appendErrorBreakdown(out, procs, c, verbose, k.field);
    }
    out += "\n";
  }
}

// ---- Warnings ----

void appendStatusMismatch(std::string& out, const ProcessOrder& procs, const CommFacts& c, bool verbose) {
  out += "  Communicator ranks have different status\n";
  std::vector<std::pair<int64_t, int>> statusOf;
  for (size_t i = 0; i < c.ranks.size(); ++i) statusOf.emplace_back(statusIndex(rankStatus(*c.ranks[i])), i);
  // The NOCOMM ranks (missing, their process answered) join as one more group, member -1.
  for (int i = 0; i < c.nNoComm; ++i) statusOf.emplace_back(0, -1);
  for (const ValueCount& vc : distribution(statusOf)) {
    const char* name = kStatusNames[vc.value];
    if (vc.count > 1) appendf(out, "  %d ranks have status %s\n", vc.count, name);
    if (!isOutlier(vc.count, verbose, c.comm->nranks)) continue;
    std::string qualifier = vc.count > 1 ? "" : std::string(" has status ") + name;
    if (vc.value == 0) {
      for (const MissingRank* m : c.missing)
        if (!m->unresponsive) appendRankLine(out, procs, *m, qualifier);
    } else {
      for (int i : vc.members) appendRankLine(out, procs, *c.ranks[i], qualifier);
    }
  }
}

void appendCountMismatch(std::string& out, const ProcessOrder& procs, const CommFacts& c, int coll,
                         bool verbose) {
  appendf(out, "  Communicator ranks have different %s operation counts\n", kRasCollNames[coll]);
  std::vector<std::pair<int64_t, int>> countOf;
  for (size_t i = 0; i < c.ranks.size(); ++i)
    countOf.emplace_back(static_cast<int64_t>(c.ranks[i]->collCounts[coll]), i);
  for (const ValueCount& vc : distribution(countOf)) {
    std::string launched = vc.value > 0 ? "launched up to operation " + std::to_string(vc.value)
                                        : std::string("not launched any operations");
    if (vc.count > 1) appendf(out, "  %d ranks have %s\n", vc.count, launched.c_str());
    if (!isOutlier(vc.count, verbose, c.comm->nranks)) continue;
    for (int i : vc.members) appendRankLine(out, procs, *c.ranks[i], vc.count > 1 ? "" : " has " + launched);
  }
  out += "\n";
}

void appendCommWarnings(std::string& out, const ProcessOrder& procs, const CommFacts& c, const char* label,
                        bool verbose) {
  if (!(c.errors & kMismatch)) return;
  appendf(out, "%s MISMATCH\n", label);
  // As in NCCL, no blank line ends the status part; each operation-count part ends with one.
  if (__builtin_popcount(c.status) > 1) appendStatusMismatch(out, procs, c, verbose);
  for (int coll = 0; coll < kRasColls; ++coll) {
    bool differs = std::any_of(c.ranks.begin(), c.ranks.end(), [&](const RankView* r) {
      return r->collCounts[coll] != c.reference->collCounts[coll];
    });
    if (differs) appendCountMismatch(out, procs, c, coll, verbose);
  }
}

// ---- JSON ----

// NCCL writes strings unescaped; its values (IPs, hex, versions) never need it, and
// escaping keeps the document valid should a Loom value ever contain a quote.
std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\', out += static_cast<char>(ch);
    else if (ch < 0x20) appendf(out, "\\u%04x", ch);
    else out += static_cast<char>(ch);
  }
  return out + "\"";
}

const char* jsonBool(bool b) { return b ? "true" : "false"; }

// The host and pid of a rank's process, "unknown" and -1 when it is not known.
void appendJsonWhere(std::string& out, const Report& r, int rank, int process, int cudaDev, int nvmlDev) {
  bool known = process >= 0 && process < static_cast<int>(r.processes.size()) &&
               !r.processes[process].node.empty();
  appendf(out,
          "        {\n"
          "          \"rank\": %d,\n"
          "          \"host\": %s,\n"
          "          \"pid\": %d,\n"
          "          \"cuda_dev\": %d,\n"
          "          \"nvml_dev\": %d,\n",
          rank, jsonString(known ? r.processes[process].node : "unknown").c_str(),
          known ? r.processes[process].pid : -1, cudaDev, nvmlDev);
}

void appendJsonComm(std::string& out, const Report& r, const CommView& c) {
  appendf(out,
          "    {\n"
          "      \"hash\": \"0x%" PRIx64 "\",\n"
          "      \"secondary_hash\": \"0x%" PRIx64 ":0x%" PRIx64 "\",\n"
          "      \"size\": %d,\n"
          "      \"ranks_count\": %zu,\n"
          "      \"missing_ranks_count\": %zu,\n"
          "      \"ranks\": [\n",
          c.hash, c.secondary[0], c.secondary[1], c.nranks, c.ranks.size(), c.missing.size());
  for (size_t i = 0; i < c.ranks.size(); ++i) {
    const RankView& k = c.ranks[i];
    if (i > 0) out += ",\n";
    appendJsonWhere(out, r, k.rank, k.process, k.cudaDev, k.nvmlDev);
    appendf(out,
            "          \"status\": {\n"
            "            \"init_state\": %d,\n"
            "            \"async_error\": %d,\n"
            "            \"finalize_called\": %s,\n"
            "            \"destroy_flag\": %s,\n"
            "            \"abort_flag\": %s\n"
            "          },\n"
            "          \"collective_counts\": {\n",
            k.initState, k.asyncError, jsonBool(k.finalizeCalled), jsonBool(k.destroyFlag),
            jsonBool(k.abortFlag));
    for (int coll = 0; coll < kRasColls; ++coll)
      appendf(out, "            \"%s\": %" PRIu64 "%s\n", kRasCollNames[coll], k.collCounts[coll],
              coll + 1 < kRasColls ? "," : "");
    out += "          }\n        }";
  }
  out += "\n      ],\n      \"missing_ranks\": [\n";
  for (size_t i = 0; i < c.missing.size(); ++i) {
    const MissingRank& m = c.missing[i];
    bool dead = m.process >= 0 && m.process < static_cast<int>(r.processes.size()) &&
                r.processes[m.process].dead;
    if (i > 0) out += ",\n";
    // NCCL 2.28.9 omits the comma after "nvml_dev" here (invalid JSON, fixed in 2.29.2);
    // this writes it.
    appendJsonWhere(out, r, m.rank, m.process, m.cudaDev, m.nvmlDev);
    appendf(out,
            "          \"status\": {\n"
            "            \"unresponsive\": %s,\n"
            "            \"considered_dead\": %s\n"
            "          }\n"
            "        }",
            jsonBool(m.unresponsive), jsonBool(dead));
  }
  out += "\n      ]\n    }";
}

}  // namespace

std::string renderTextHead(const Report& r, bool verbose) {
  std::string out;
  appendf(out, "NCCL version %d.%d.%d%s compiled with CUDA %d.%d\n", r.ncclMajor, r.ncclMinor, r.ncclPatch,
          r.ncclSuffix.c_str(), r.cudaMajor, r.cudaMinor);
  appendf(out, "CUDA runtime version %d, driver version %d\n\n", r.cudaRuntime, r.cudaDriver);
  appendJobSummary(out, r.processes, ProcessOrder(r.processes), verbose);
  out += "\nCommunicators...";  // the collection time completes this line in the body
  return out;
}

std::string renderTextBody(const Report& r, bool verbose) {
  ProcessOrder procs(r.processes);
  std::vector<CommFacts> comms;
  for (const CommView& c : r.comms) comms.push_back(analyze(c, procs));
  std::vector<Group> groups = sortAndGroup(comms);
  // "#group-index (hash)" names a communicator in the Errors and Warnings blocks.
  auto forEachComm = [&](auto&& fn) {
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t i = 0; i < groups[g].count; ++i) {
        const CommFacts& c = comms[groups[g].first + i];
        char label[64];
        snprintf(label, sizeof label, "#%zu-%zu (%016" PRIx64 ")", g, i, c.comm->hash);
        fn(c, label);
      }
  };

  std::string out = " (" + seconds3(r.collectSec) + "s)\n=============\n\n";
  appendTable(out, comms, groups);

  out += "\nErrors\n======\n\n";
  appendProcessBlock(out, r.processes, procs, verbose, /*dead=*/false);
  appendProcessBlock(out, r.processes, procs, verbose, /*dead=*/true);
  forEachComm([&](const CommFacts& c, const char* label) { appendCommErrors(out, procs, c, label, verbose); });

  out += "Warnings\n========\n\n";
  if (r.timeouts > 0)
    appendf(out, "TIMEOUT\n  Encountered %d communication timeout%s while gathering communicator data\n\n",
            r.timeouts, plural(r.timeouts, "s"));
  forEachComm([&](const CommFacts& c, const char* label) { appendCommWarnings(out, procs, c, label, verbose); });
  return out;
}

std::string renderJson(const Report& r) {
  std::string out;
  std::string version = std::to_string(r.ncclMajor) + "." + std::to_string(r.ncclMinor) + "." +
                        std::to_string(r.ncclPatch) + r.ncclSuffix;
  appendf(out,
          "{\n"
          "  \"nccl_version\": %s,\n"
          "  \"cuda_runtime_version\": %d,\n"
          "  \"cuda_driver_version\": %d,\n"
          "  \"timestamp\": %s,\n"
          "  \"communicators_count\": %zu,\n"
          "  \"communicators\": [\n",
          jsonString(version).c_str(), r.cudaRuntime, r.cudaDriver, jsonString(r.timestamp).c_str(),
          r.comms.size());
  for (size_t i = 0; i < r.comms.size(); ++i) {
    if (i > 0) out += ",\n";
    appendJsonComm(out, r, r.comms[i]);
  }
  out += "\n  ],\n  \"ras\": {\n";
  appendf(out, "    \"collection_time_sec\": %s,\n    \"timeouts_count\": %d\n  }\n}\n",
          seconds3(r.collectSec).c_str(), r.timeouts);
  return out;
}

}  // namespace loom::ras
