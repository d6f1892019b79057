// The device executor's plan interpreter against the CPU executor (issue 11): the
// collectives matrix (coll_matrix.h: every collective (on 1, 2, 3, 5 and 8 ranks), data
// type (on 2, 3 and 8 ranks; three element sizes elsewhere), op, in and out of place,
// counts 0, 1, 1001, 3 slots + 7 and > 2 MiB) for every all-reduce algorithm on 1..8 ranks
// as threads, run once by the CPU executor and once by the interpreter on host threads
// (LOOM_EXECUTOR=interp: one thread per channel, as a GPU runs one block per channel), with
// the Simple protocol and, for a few configurations, LL. The CPU executor's run is checked
// against the reference (which allows reductions a tolerance; every other output must
// equal it exactly); then every byte of every buffer of every case, guards included, must
// be the same under the interpreter: bit-identical outputs, and nothing written that the
// CPU executor leaves alone. (Same bytes pass the same checks, so the interpreter's run
// is not compared with the reference a second time.)
//
// On 2, 3 and 8 ranks (every data type) the CPU executor's half is the collectives
// matrix's threads configuration (matrix_test.cc), which therefore runs only here.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "collectives/coll_env.h"
#include "collectives/coll_matrix.h"
#include "kernels/ll.h"

namespace colltest {
namespace {

using loomtest::Mode;

struct InterpConfig {
  MatrixConfig cfg;
  bool ll = false;  // LOOM_INTERP_PROTO=ll
};

std::vector<InterpConfig> configs() {
  std::vector<InterpConfig> v;
  // Every data type on 2, 3 and 8 ranks; elsewhere float32, bfloat16 and int8 (element
  // sizes 4, 2, 1): the interpreter's control flow sees types only through their size, and
  // the CI budget does not hold the full matrix twice for every rank count.
  // The other collectives (kDefault) on 1, 2, 3, 5 and 8 ranks.
  for (int n = 1; n <= 8; ++n)
    for (Algo a : {Algo::kDefault, Algo::kRing, Algo::kTree, Algo::kHalvingDoubling, Algo::kDirect})
      if (a != Algo::kDefault || n <= 3 || n == 5 || n == 8)
        v.push_back({{Mode::kThreads, n, a, n == 2 || n == 3 || n == 8}});
  // The LL protocol (kernels/ll.h): every collective, and each all-reduce algorithm once.
  v.push_back({{Mode::kThreads, 3, Algo::kDefault, false}, true});
  v.push_back({{Mode::kThreads, 8, Algo::kRing, false}, true});
  v.push_back({{Mode::kThreads, 4, Algo::kTree, false}, true});
  v.push_back({{Mode::kThreads, 5, Algo::kHalvingDoubling, false}, true});
  v.push_back({{Mode::kThreads, 7, Algo::kDirect, false}, true});
  return v;
}

class InterpMatrix : public testing::TestWithParam<InterpConfig> {};

TEST_P(InterpMatrix, SameBitsAsTheCpuExecutor) {
  const MatrixConfig& cfg = GetParam().cfg;
  AlgoEnv env(cfg.algo);
  ScopedEnv proto("LOOM_INTERP_PROTO", GetParam().ll ? "ll" : "simple");
  const std::vector<Case> cases = buildCases(cfg);
  std::vector<std::vector<uint64_t>> cpu(cfg.nranks), interp(cfg.nranks);
  auto run = [&](const char* executor, std::vector<std::vector<uint64_t>>& digests, bool check) {
    ScopedEnv exec("LOOM_EXECUTOR", executor);
    return loomtest::joinFailures(loomtest::runRanks(
        Mode::kThreads, cfg.nranks,
        [&](int rank, int nranks, ncclComm_t comm) {
          return runCases(rank, nranks, comm, cfg.algo, cases, &digests[rank], check);
        },
        280));
  };
  // With LL the interpreter's plans are cut for LL's payload per slot: the CPU executor
  // gets FIFO slots of that size, so that both run the same plans (reductions in the same
  // order).
  std::optional<ScopedEnv> slot;
  if (GetParam().ll) slot.emplace("LOOM_SLOT_BYTES", std::to_string(loom::llCapacity(256 << 10)).c_str());
  const std::string cpuErr = run("cpu", cpu, true);
  slot.reset();
  ASSERT_EQ(cpuErr, "") << configName(cfg) << ", CPU executor";
  const std::string interpErr = run("interp", interp, false);
  ASSERT_EQ(interpErr, "") << configName(cfg) << ", interpreter";
  size_t compared = 0, differ = 0;
  std::string shown;
  for (int r = 0; r < cfg.nranks; ++r)
    for (size_t i = 0; i < cases.size(); ++i) {
      ++compared;
      if (cpu[r][i] != 0 && cpu[r][i] == interp[r][i]) continue;
      if (++differ <= 6) shown += "\n  " + describe(cases[i], cfg.nranks, cfg.algo, r);
    }
  EXPECT_EQ(differ, 0u) << configName(cfg) << ": cases whose buffers hold other bytes after "
                        << "the interpreter than after the CPU executor (" << differ << " of "
                        << compared << "):" << shown;
  EXPECT_EQ(compared, cases.size() * cfg.nranks);
}

INSTANTIATE_TEST_SUITE_P(Collectives, InterpMatrix, testing::ValuesIn(configs()),
                         [](const testing::TestParamInfo<InterpConfig>& info) {
                           return configName(info.param.cfg) + (info.param.ll ? "_ll" : "");
                         });

}  // namespace
}  // namespace colltest
