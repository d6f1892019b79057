// Communicators spanning "hosts" (LOOM_HOSTID per rank, so the ranks of different hosts
// talk over TCP and those of one host over shared memory): the collectives matrix with the
// hierarchical algorithm forced and with the tuner's own choice, on even, interleaved and
// uneven layouts; and the tuner's choice itself.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "algo/select.h"
#include "api/comm.h"
#include "collectives/coll_env.h"
#include "collectives/coll_matrix.h"

namespace colltest {
namespace {

using loomtest::Mode;

struct HierConfig {
  std::string name;
  std::vector<std::string> hosts;  // LOOM_HOSTID of each rank
  const char* algo;                // NCCL_ALGO, or nullptr for the tuner's choice
  std::map<std::string, std::string> topoFile = {};  // LOOM_TOPO_FILE per host id, if any
};

std::vector<HierConfig> configs() {
  return {
      {"2x2_hier", {"a", "a", "b", "b"}, "hierarchical"},
      {"2x2_default", {"a", "a", "b", "b"}, nullptr},
      {"interleaved_2x2_hier", {"a", "b", "a", "b"}, "allreduce:hier;allgather:hier;reducescatter:hier"},
      {"uneven_2_1_3_hier", {"a", "a", "b", "c", "c", "c"}, "hierarchical"},
      {"uneven_3_1_default", {"a", "b", "a", "a"}, nullptr},
      {"3x2_hier", {"a", "a", "b", "b", "c", "c"}, "hierarchical"},
      {"uneven_3_2_interleaved_hier", {"a", "b", "a", "b", "a"}, "hierarchical"},
      // Hosts that describe their networks differently (one sees 200 Gb/s RDMA ports, the
      // other plain Ethernet) must still rank the algorithms alike.
      {"hetero_networks_default", {"a", "a", "b", "b"}, nullptr,
       {{"a", LOOM_TOPO_FIXTURES "/cpu_only.xml"}, {"b", LOOM_TOPO_FIXTURES "/dgx_h100.xml"}}},
  };
}

// The host layout the communicator must have derived from the host ids.
std::string checkLayout(const HierConfig& cfg, int rank, ncclComm_t comm) {
  const loom::HostLayout& l = comm->core->planContext().layout;
  std::map<std::string, std::vector<int>> byId;
  for (size_t r = 0; r < cfg.hosts.size(); ++r) byId[cfg.hosts[r]].push_back(static_cast<int>(r));
  if (static_cast<size_t>(l.nhosts()) != byId.size())
    return "layout has " + std::to_string(l.nhosts()) + " hosts, expected " + std::to_string(byId.size());
  const std::vector<int>& mine = byId[cfg.hosts[rank]];
  if (l.hosts[l.host] != mine || l.hosts[l.host][l.local] != rank) return "wrong host or local index";
  return "";
}

// Where the hierarchical algorithm can serve, the tuner must take it for large messages
// (the network is the bottleneck; the flat ring sends 2(n-1)/n of the buffer per host,
// the hierarchical composition 2(N-1)/N), unless NCCL_ALGO forbids it.
std::string checkTuner(ncclComm_t comm) {
  const loom::PlanContext& ctx = comm->core->planContext();
  for (loom::Collective coll : {loom::Collective::kAllReduce, loom::Collective::kAllGather,
                                loom::Collective::kReduceScatter}) {
    loom::CollRequest req{coll, size_t{16} << 20, 4, 0};
    if (!loom::canServe(loom::Algorithm::kHierarchical, req, ctx)) continue;
    loom::Algorithm got = loom::selectAlgorithm(req, ctx);
    if (got != loom::Algorithm::kHierarchical)
      return std::string("tuner picks ") + loom::algorithmName(got) + " for 64 MiB " +
             loom::collectiveName(coll);
  }
  return "";
}

// With NCCL_ALGO=hierarchical every collective that has a hierarchical composition must
// run it: otherwise the matrix would silently test the flat ring.
std::string checkForced(ncclComm_t comm) {
  const loom::PlanContext& ctx = comm->core->planContext();
  for (loom::Collective coll : {loom::Collective::kAllReduce, loom::Collective::kAllGather,
                                loom::Collective::kReduceScatter, loom::Collective::kBroadcast,
                                loom::Collective::kReduce})
    for (size_t bytes : {size_t{8}, size_t{1} << 20, size_t{64} << 20}) {
      loom::CollRequest req{coll, bytes / 4, 4, 1};
      loom::Algorithm got = loom::selectAlgorithm(req, ctx);
      if (got != loom::Algorithm::kHierarchical)
        return std::string("NCCL_ALGO=hierarchical, yet ") + loom::collectiveName(coll) + " of " +
               std::to_string(bytes) + " bytes runs " + loom::algorithmName(got);
    }
  return "";
}

// Every rank must hold the same ranking of algorithms, or ranks would run different plans.
std::string checkSameRanking(ncclComm_t comm, int nranks) {
  // Field by field: padding bytes carry whatever the memory held.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* v, size_t n) {
    const unsigned char* p = static_cast<const unsigned char*>(v);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  for (const auto& perSize : comm->core->planContext().ranking)
    for (const loom::PlanContext::Ranking& r : perSize) {
      for (const loom::algo::Ranked& x : r.order) {
        mix(&x.us, sizeof(x.us));
        mix(&x.algo, sizeof(x.algo));
        mix(&x.proto, sizeof(x.proto));
      }
      mix(&r.channels, sizeof(r.channels));
    }
  std::vector<uint64_t> all(nranks);
  if (ncclAllGather(&h, all.data(), 1, ncclUint64, comm, nullptr) != ncclSuccess)
    return std::string("all-gather of the ranking hashes: ") + ncclGetLastError(comm);
  for (int r = 0; r < nranks; ++r)
    if (all[r] != h) return "rank " + std::to_string(r) + " ranks the algorithms differently";
  return "";
}

class Hier : public testing::TestWithParam<HierConfig> {};

TEST_P(Hier, EveryCase) {
  const HierConfig& cfg = GetParam();
  int n = static_cast<int>(cfg.hosts.size());
  ScopedEnv algo("NCCL_ALGO", cfg.algo);
  ScopedEnv timeout("LOOM_TIMEOUT", "60");
  const std::vector<Case> cases = buildCases({Mode::kProcesses, n, Algo::kDefault, false});
  loomtest::RankOptions opt;
  opt.timeoutSec = 280;
  opt.beforeInit = [&](int rank) {
    setenv("LOOM_HOSTID", cfg.hosts[rank].c_str(), 1);
    auto topo = cfg.topoFile.find(cfg.hosts[rank]);
    if (topo != cfg.topoFile.end()) setenv("LOOM_TOPO_FILE", topo->second.c_str(), 1);
  };
  auto failures = loomtest::runRanks(
      Mode::kProcesses, n,
      [&](int rank, int nranks, ncclComm_t comm) {
        std::string err = checkLayout(cfg, rank, comm);
        if (err.empty()) err = checkSameRanking(comm, nranks);
        if (err.empty() && !cfg.algo && cfg.topoFile.empty()) err = checkTuner(comm);
        if (err.empty() && cfg.algo && std::string(cfg.algo) == "hierarchical") err = checkForced(comm);
        if (err.empty()) err = runCases(rank, nranks, comm, Algo::kDefault, cases);
        return err;
      },
      opt);
  EXPECT_TRUE(failures.empty()) << cfg.name << " (" << cases.size() << " cases):\n"
                                << loomtest::joinFailures(failures);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Hier, testing::ValuesIn(configs()),
                         [](const testing::TestParamInfo<HierConfig>& info) { return info.param.name; });

}  // namespace
}  // namespace colltest
