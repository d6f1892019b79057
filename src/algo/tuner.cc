#include "algo/tuner.h"

#include <algorithm>
#include <cctype>
#include <sstream>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"

namespace loom::algo {
namespace {

StringKnob kAlgo("LOOM_ALGO", "NCCL_ALGO", "",
                 "Restrict algorithms (NCCL syntax: ring,tree | ^tree | allreduce:tree;broadcast:ring); "
                 "Loom: ring, tree, halvingdoubling, direct, hierarchical");
StringKnob kProto("LOOM_PROTO", "NCCL_PROTO", "",
                  "Restrict protocols (NCCL syntax: LL,Simple | ^LL128 | allreduce:LL;broadcast:Simple)");

constexpr int kAlgoCount = static_cast<int>(Algorithm::kCount);
constexpr int kProtoCount = static_cast<int>(Protocol::kCount);

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) out.push_back(item);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

// Collective prefixes as NCCL spells them (case-insensitive), plus Loom's extra ones.
bool matchCollective(const std::string& name, Collective* out) {
  std::string l = lower(name);
  if (l == "send" || l == "recv") l = "sendrecv";
  for (int c = 0; c < static_cast<int>(Collective::kCount); ++c) {
    if (l == lower(collectiveName(static_cast<Collective>(c)))) {
      *out = static_cast<Collective>(c);
      return true;
    }
  }
  return false;
}

// Returns the index set by a token, -1 for a known name with no Loom counterpart.
int algoToken(const std::string& t, const std::string& spec) {
  std::string l = lower(t);
  if (l == "ring") return static_cast<int>(Algorithm::kRing);
  if (l == "tree") return static_cast<int>(Algorithm::kTree);
  if (l == "halvingdoubling" || l == "hd" || l == "rhd") return static_cast<int>(Algorithm::kHalvingDoubling);
  if (l == "direct" || l == "oneshot") return static_cast<int>(Algorithm::kDirect);
  if (l == "hierarchical" || l == "hier") return static_cast<int>(Algorithm::kHierarchical);
  if (l == "collnetdirect" || l == "collnetchain" || l == "collnet" || l == "nvls" || l == "nvlstree" || l == "pat")
    return -1;
  LOOM_THROW(kInvalidArgument,
             "NCCL_ALGO=%s: unknown algorithm '%s' (Loom: ring, tree, halvingdoubling, direct, hierarchical; "
             "NCCL's collnetdirect, collnetchain, nvls, nvlstree, pat are accepted but unavailable)",
             spec.c_str(), t.c_str());
}

int protoToken(const std::string& t, const std::string& spec) {
  std::string l = lower(t);
  if (l == "simple") return static_cast<int>(Protocol::kSimple);
  if (l == "ll") return static_cast<int>(Protocol::kLL);
  if (l == "ll128") return static_cast<int>(Protocol::kLL128);
  LOOM_THROW(kInvalidArgument, "NCCL_PROTO=%s: unknown protocol '%s' (LL, LL128, Simple)", spec.c_str(), t.c_str());
}

// NCCL's parseList, for one collective: returns the enabled mask.
template <size_t N, typename Token>
std::array<bool, N> parseList(const std::string& spec, Collective coll, Token token, const char* var) {
  std::array<bool, N> mask;
  mask.fill(true);
  if (trim(spec).empty()) return mask;
  std::vector<std::string> entries = split(spec, ';');
  for (size_t i = 0; i < entries.size(); ++i) {
    std::string entry = trim(entries[i]);
    std::string list = entry;
    bool applies = true;
    size_t colon = entry.find(':');
    if (colon != std::string::npos) {
      Collective c;
      std::string prefix = trim(entry.substr(0, colon));
      if (!matchCollective(prefix, &c))
        LOOM_THROW(kInvalidArgument, "%s=%s: unknown collective '%s'", var, spec.c_str(), prefix.c_str());
      applies = c == coll;
      list = trim(entry.substr(colon + 1));
    } else if (i > 0) {
      LOOM_THROW(kInvalidArgument, "%s=%s: every entry after the first needs a collective prefix ('%s')", var,
                 spec.c_str(), entry.c_str());
    }
    bool negate = !list.empty() && list[0] == '^';
    if (negate) list = trim(list.substr(1));
    if (list.empty()) LOOM_THROW(kInvalidArgument, "%s=%s: empty list in '%s'", var, spec.c_str(), entry.c_str());
    std::array<bool, N> m;
    m.fill(negate);
    for (const std::string& tok : split(list, ',')) {
      std::string t = trim(tok);
      if (t.empty()) LOOM_THROW(kInvalidArgument, "%s=%s: empty name in '%s'", var, spec.c_str(), entry.c_str());
      int idx = token(t, spec);  // validates even when the entry is for another collective
      if (idx >= 0) m[static_cast<size_t>(idx)] = !negate;
    }
    if (applies) mask = m;
  }
  return mask;
}

bool p2pStyle(Collective c) {
  return c == Collective::kAlltoAll || c == Collective::kGather || c == Collective::kScatter ||
         c == Collective::kSendRecv;
}

struct Candidate {
  Algorithm algo;
  Protocol proto;
  Estimate est;
};

std::string describeModel(const NodeModel& m, const TuningRequest& req) {
  std::string s = strprintf("model: %d local rank(s), %s ring %.1f GB/s", m.localRanks, linkClassName(m.intra),
                            m.ringBw);
  if (req.nnodes > 1) s += strprintf(", %s %.1f GB/s over %d rail(s)", linkClassName(m.inter), m.netBw, m.rails);
  if (!m.notes.empty()) s += "; " + m.notes.substr(0, m.notes.size() - 2);
  return s;
}

}  // namespace

AlgoFilter parseAlgoSpec(const std::string& ncclAlgo, Collective coll) {
  AlgoFilter f;
  f.algorithms = parseList<kAlgoCount>(ncclAlgo, coll, algoToken, "NCCL_ALGO");
  if (!trim(ncclAlgo).empty()) f.restriction = "NCCL_ALGO=" + ncclAlgo;
  return f;
}

AlgoFilter parseProtoSpec(const std::string& ncclProto, Collective coll) {
  AlgoFilter f;
  f.protocols = parseList<kProtoCount>(ncclProto, coll, protoToken, "NCCL_PROTO");
  if (!trim(ncclProto).empty()) f.restriction = "NCCL_PROTO=" + ncclProto;
  return f;
}

AlgoFilter combine(const AlgoFilter& algos, const AlgoFilter& protos) {
  AlgoFilter f;
  f.algorithms = algos.algorithms;
  f.protocols = protos.protocols;
  f.restriction = algos.restriction;
  if (!protos.restriction.empty())
    f.restriction += (f.restriction.empty() ? "" : " ") + protos.restriction;
  return f;
}

AlgoFilter filterFromEnv(Collective coll) {
  return combine(parseAlgoSpec(kAlgo.get(), coll), parseProtoSpec(kProto.get(), coll));
}

int localRanksOf(const TuningRequest& req) {
  return (req.nranks + std::max(1, req.nnodes) - 1) / std::max(1, req.nnodes);
}

TuningChoice tune(const NodeModel& node, const TuningRequest& req, const AlgoFilter& allowed) {
  LOOM_CHECK_ARG(req.nranks >= 1 && req.nnodes >= 1 && req.nnodes <= req.nranks,
                 "tune: %d ranks on %d hosts is not a valid layout", req.nranks, req.nnodes);
  const bool ignoreAlgoFilter = p2pStyle(req.coll);
  std::vector<Candidate> feasible;
  std::vector<std::string> rejected;  // one line per distinct reason
  for (int a = 0; a < kAlgoCount; ++a) {
    Algorithm algo = static_cast<Algorithm>(a);
    if (!ignoreAlgoFilter && !allowed.allows(algo)) continue;
    for (int p = 0; p < kProtoCount; ++p) {
      Protocol proto = static_cast<Protocol>(p);
      if (!allowed.allows(proto)) continue;
      if (node.hostMemory && proto != Protocol::kSimple) {
        std::string line = strprintf("%s: the CPU executor (host memory) moves data in Simple slots only",
                                     protocolName(proto));
        if (std::find(rejected.begin(), rejected.end(), line) == rejected.end()) rejected.push_back(line);
        continue;
      }
      Estimate e = estimate(node, req.coll, algo, proto, req.bytes, req.nranks, req.nnodes);
      if (e.feasible) {
        feasible.push_back({algo, proto, e});
        continue;
      }
      std::string line = e.why.rfind("LL128", 0) == 0 ? e.why : strprintf("%s: %s", algorithmName(algo), e.why.c_str());
      if (std::find(rejected.begin(), rejected.end(), line) == rejected.end()) rejected.push_back(line);
    }
  }
  std::string reasons;
  for (const std::string& r : rejected) reasons += (reasons.empty() ? "" : "; ") + r;
  if (feasible.empty())
    LOOM_THROW(kInvalidUsage, "no algorithm/protocol can run %s of %zu bytes on %d ranks over %d host(s)%s%s: %s",
               collectiveName(req.coll), req.bytes, req.nranks, req.nnodes,
               allowed.restriction.empty() ? "" : " with ", allowed.restriction.c_str(),
               reasons.empty() ? "every candidate is excluded" : reasons.c_str());
  // stable: on equal predictions the enum order (Ring, Tree, ...; Simple, LL, LL128) decides.
  std::stable_sort(feasible.begin(), feasible.end(),
                   [](const Candidate& x, const Candidate& y) { return x.est.us < y.est.us; });
  const Candidate& best = feasible.front();
  TuningChoice c;
  c.algorithm = best.algo;
  c.protocol = best.proto;
  c.channels = best.est.channels;
  c.chunkBytes = best.est.chunkBytes;
  c.predictedUs = best.est.us;
  c.busBw = best.est.busBw;
  c.why = strprintf("%s/%s %.1f us", algorithmName(best.algo), protocolName(best.proto), best.est.us);
  for (size_t i = 1; i < feasible.size() && i < 4; ++i)
    c.why += strprintf("%s %s/%s %.1f us", i == 1 ? "; next" : ",", algorithmName(feasible[i].algo),
                       protocolName(feasible[i].proto), feasible[i].est.us);
  c.why += "; " + describeModel(node, req);
  if (!allowed.restriction.empty() && !ignoreAlgoFilter) c.why += "; restricted by " + allowed.restriction;
  LOOM_INFO(kLogTuning, "%s %zu bytes, %d ranks on %d host(s)%s -> %s/%s, %d channel(s), chunk %zu: %s",
            collectiveName(req.coll), req.bytes, req.nranks, req.nnodes, req.hostMemory ? " (host memory)" : "",
            algorithmName(c.algorithm), protocolName(c.protocol), c.channels, c.chunkBytes, c.why.c_str());
  return c;
}

TuningChoice tune(const topo::System& sys, const TuningRequest& req, const AlgoFilter& allowed) {
  LOOM_CHECK_ARG(req.nranks >= 1 && req.nnodes >= 1, "tune: %d ranks on %d hosts is not a valid layout",
                 req.nranks, req.nnodes);
  return tune(buildNodeModel(sys, localRanksOf(req), req.hostMemory), req, allowed);
}

}  // namespace loom::algo
