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
                 "Loom: ring, tree, halvingdoubling, direct, hierarchical",
                 KnobScope::kJob);
StringKnob kProto("LOOM_PROTO", "NCCL_PROTO", "",
                  "Restrict protocols (NCCL syntax: LL,Simple | ^LL128 | allreduce:LL;broadcast:Simple)",
                  KnobScope::kJob);

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

CostTable costTable(const NodeModel& node, Collective coll, size_t bytes, int nranks, int nnodes) {
  CostTable t;
  t.coll = coll;
  t.bytes = bytes;
  t.nranks = nranks;
  t.nnodes = nnodes;
  for (int a = 0; a < kAlgoCount; ++a)
    for (int p = 0; p < kProtoCount; ++p) {
      Algorithm algo = static_cast<Algorithm>(a);
      Protocol proto = static_cast<Protocol>(p);
      double& us = t.at(algo, proto);
      us = -1;
      if (!protocolRuns(node, proto, nnodes)) continue;
      Estimate e = estimate(node, coll, algo, proto, bytes, nranks, nnodes);
      if (e.feasible) us = e.us;
    }
  return t;
}

Ranking rankCosts(const CostTable& table) {
  Ranking r;
  size_t i = 0;
  for (int a = 0; a < kAlgoCount; ++a)
    for (int p = 0; p < kProtoCount; ++p) {
      Algorithm algo = static_cast<Algorithm>(a);
      Protocol proto = static_cast<Protocol>(p);
      r[i++] = {table.at(algo, proto), algo, proto};
    }
  std::stable_sort(r.begin(), r.end(), [](const Ranked& x, const Ranked& y) {
    if ((x.us < 0) != (y.us < 0)) return y.us < 0;  // ruled out last
    return x.us >= 0 && x.us < y.us;
  });
  return r;
}

int localRanksOf(const TuningRequest& req) {
  return (req.nranks + std::max(1, req.nnodes) - 1) / std::max(1, req.nnodes);
}

TuningChoice tune(const NodeModel& node, const TuningRequest& req, const AlgoFilter& allowed) {
  LOOM_CHECK_ARG(req.nranks >= 1 && req.nnodes >= 1 && req.nnodes <= req.nranks,
                 "tune: %d ranks on %d hosts is not a valid layout", req.nranks, req.nnodes);
  const bool ignoreAlgoFilter = p2pStyle(req.coll);
  CostTable table;
  table.coll = req.coll;
  table.bytes = req.bytes;
  table.nranks = req.nranks;
  table.nnodes = req.nnodes;
  std::array<std::array<Estimate, kProtoCount>, kAlgoCount> est;
  std::vector<std::string> rejected;  // one line per distinct reason
  auto reject = [&](const std::string& line) {
    if (std::find(rejected.begin(), rejected.end(), line) == rejected.end()) rejected.push_back(line);
  };
  for (int a = 0; a < kAlgoCount; ++a) {
    Algorithm algo = static_cast<Algorithm>(a);
    for (int p = 0; p < kProtoCount; ++p) {
      Protocol proto = static_cast<Protocol>(p);
      double& us = table.at(algo, proto);
      us = -1;
      if (!ignoreAlgoFilter && !allowed.allows(algo)) continue;
      if (!allowed.allows(proto)) continue;
      std::string why;
      if (node.hostMemory && !protocolRuns(node, proto, req.nnodes, &why)) {
        reject(strprintf("%s: %s", protocolName(proto), why.c_str()));
        continue;
      }
      Estimate& e = est[static_cast<size_t>(a)][static_cast<size_t>(p)];
      e = estimate(node, req.coll, algo, proto, req.bytes, req.nranks, req.nnodes);
      if (e.feasible) {
        us = e.us;
        continue;
      }
      reject(e.why.rfind("LL128", 0) == 0 ? e.why : strprintf("%s: %s", algorithmName(algo), e.why.c_str()));
    }
  }
  std::string reasons;
  for (const std::string& r : rejected) reasons += (reasons.empty() ? "" : "; ") + r;
  const Ranking ranked = rankCosts(table);
  if (ranked[0].us < 0)
    LOOM_THROW(kInvalidUsage, "no algorithm/protocol can run %s of %zu bytes on %d ranks over %d host(s)%s%s: %s",
               collectiveName(req.coll), req.bytes, req.nranks, req.nnodes,
               allowed.restriction.empty() ? "" : " with ", allowed.restriction.c_str(),
               reasons.empty() ? "every candidate is excluded" : reasons.c_str());
  const Ranked& best = ranked[0];
  const Estimate& be = est[static_cast<size_t>(best.algo)][static_cast<size_t>(best.proto)];
  TuningChoice c;
  c.algorithm = best.algo;
  c.protocol = best.proto;
  c.channels = be.channels;
  c.chunkBytes = be.chunkBytes;
  c.predictedUs = be.us;
  c.busBw = be.busBw;
  c.why = strprintf("%s/%s %.1f us", algorithmName(best.algo), protocolName(best.proto), best.us);
  for (size_t i = 1; i < ranked.size() && i < 4 && ranked[i].us >= 0; ++i)
    c.why += strprintf("%s %s/%s %.1f us", i == 1 ? "; next" : ",", algorithmName(ranked[i].algo),
                       protocolName(ranked[i].proto), ranked[i].us);
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
