// The device executor's plan interpreter against the CPU executor (issue 11): the
// collectives matrix (coll_matrix.h: every collective, data type, op, in and out of place,
// counts 0, 1, 1001, 3 slots + 7 and > 2 MiB) for every all-reduce algorithm on 1..8 ranks
// as threads, run once by the CPU executor and once by the interpreter on host threads
// (LOOM_EXECUTOR=interp: one thread per channel, as a GPU runs one block per channel).
// Both runs are checked against the reference; and every reduced output must hold the
// same bits under both executors (the reference allows reductions a tolerance; every other
// output must equal it exactly).
#include <gtest/gtest.h>

#include "collectives/coll_env.h"
#include "collectives/coll_matrix.h"

namespace colltest {
namespace {

using loomtest::Mode;

std::vector<MatrixConfig> configs() {
  std::vector<MatrixConfig> v;
  for (int n = 1; n <= 8; ++n)
    for (Algo a : {Algo::kDefault, Algo::kRing, Algo::kTree, Algo::kHalvingDoubling, Algo::kDirect})
      v.push_back({Mode::kThreads, n, a, true});
  return v;
}

class InterpMatrix : public testing::TestWithParam<MatrixConfig> {};

TEST_P(InterpMatrix, SameBitsAsTheCpuExecutor) {
  const MatrixConfig& cfg = GetParam();
  AlgoEnv env(cfg.algo);
  const std::vector<Case> cases = buildCases(cfg);
  std::vector<std::vector<uint64_t>> cpu(cfg.nranks), interp(cfg.nranks);
  auto run = [&](const char* executor, std::vector<std::vector<uint64_t>>& digests) {
    ScopedEnv exec("LOOM_EXECUTOR", executor);
    return loomtest::joinFailures(loomtest::runRanks(
        Mode::kThreads, cfg.nranks,
        [&](int rank, int nranks, ncclComm_t comm) {
          return runCases(rank, nranks, comm, cfg.algo, cases, &digests[rank]);
        },
        280));
  };
  const std::string cpuErr = run("cpu", cpu);
  ASSERT_EQ(cpuErr, "") << configName(cfg) << ", CPU executor";
  const std::string interpErr = run("interp", interp);
  ASSERT_EQ(interpErr, "") << configName(cfg) << ", interpreter";
  size_t compared = 0, differ = 0;
  std::string shown;
  for (int r = 0; r < cfg.nranks; ++r)
    for (size_t i = 0; i < cases.size(); ++i) {
      if (!cpu[r][i]) continue;
      ++compared;
      if (cpu[r][i] == interp[r][i]) continue;
      if (++differ <= 6) shown += "\n  " + describe(cases[i], cfg.nranks, cfg.algo, r);
    }
  EXPECT_EQ(differ, 0u) << configName(cfg) << ": reduced outputs whose bits differ from the CPU executor's:"
                        << shown;
  EXPECT_GT(compared, 0u);
}

INSTANTIATE_TEST_SUITE_P(Collectives, InterpMatrix, testing::ValuesIn(configs()),
                         [](const testing::TestParamInfo<MatrixConfig>& info) {
                           return configName(info.param);
                         });

}  // namespace
}  // namespace colltest
