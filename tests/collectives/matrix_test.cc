// The collectives matrix (issue 3): every collective x data type x op x in/out of place x
// all-reduce algorithm x nranks {1, 2, 3, 4, 7, 8} x counts {0, 1, 1001, 3 slots + 7,
// > 2 MiB}, ranks as threads (every type) and as processes (float32, bfloat16, int8 on 2,
// 3 and 8 ranks). Threads on 2, 3 and 8 ranks run in interp_test.cc: its CPU executor
// run is that configuration, checked the same way, before the interpreter's. One communicator per test; every case is checked against the reference
// in coll_reference.h. A test per (mode, nranks, algorithm) lets CTest run them in
// parallel; "_cma0"/"_cma1" force either shared-memory data path
// ("_stream": streaming stores); "default" runs the collectives other than all-reduce, whose algorithms are
// not selectable, plus all-reduce under the size rule.
#include <gtest/gtest.h>

#include <optional>

#include "collectives/coll_env.h"
#include "collectives/coll_matrix.h"

namespace colltest {
namespace {

using loomtest::Mode;

std::vector<MatrixConfig> configs() {
  const Algo kAlgos[] = {Algo::kDefault, Algo::kRing, Algo::kTree, Algo::kHalvingDoubling,
                         Algo::kDirect};
  std::vector<MatrixConfig> v;
  for (int n : {1, 4, 7})
    for (Algo a : kAlgos) v.push_back({Mode::kThreads, n, a, true});
  for (int n : {2, 3, 8})
    for (Algo a : kAlgos) v.push_back({Mode::kProcesses, n, a, false});
  // The same over TCP instead of shared memory.
  for (Algo a : {Algo::kDefault, Algo::kRing}) v.push_back({Mode::kProcesses, 3, a, false, true});
  // Both shared-memory data paths whatever LOOM_SHM_CMA=auto picks on this machine:
  // processes reading each other's buffers (cross-memory attach), threads copying
  // through the FIFO; on 2 ranks with results written by streaming stores.
  for (Algo a : {Algo::kDefault, Algo::kRing}) {
    v.push_back({Mode::kProcesses, 2, a, false, false, "1", "1M"});
    v.push_back({Mode::kProcesses, 3, a, false, false, "1"});
    v.push_back({Mode::kThreads, 2, a, true, false, "0", "1M"});
    v.push_back({Mode::kThreads, 3, a, true, false, "0"});
  }
  return v;
}

class Matrix : public testing::TestWithParam<MatrixConfig> {};

TEST_P(Matrix, EveryCase) {
  const MatrixConfig& cfg = GetParam();
  AlgoEnv env(cfg.algo);
  std::optional<ScopedEnv> noShm;
  if (cfg.socket) noShm.emplace("NCCL_SHM_DISABLE", "1");
  std::optional<ScopedEnv> cma;
  if (*cfg.cma) cma.emplace("LOOM_SHM_CMA", cfg.cma);
  std::optional<ScopedEnv> stream;
  if (*cfg.streamMin) stream.emplace("LOOM_STREAM_MIN_BYTES", cfg.streamMin);
  const std::vector<Case> cases = buildCases(cfg);
  auto failures = loomtest::runRanks(
      cfg.mode, cfg.nranks,
      [&](int rank, int nranks, ncclComm_t comm) {
        return runCases(rank, nranks, comm, cfg.algo, cases);
      },
      280);
  EXPECT_TRUE(failures.empty()) << configName(cfg) << " (" << cases.size() << " cases):\n"
                                << loomtest::joinFailures(failures);
}

INSTANTIATE_TEST_SUITE_P(Collectives, Matrix, testing::ValuesIn(configs()),
                         [](const testing::TestParamInfo<MatrixConfig>& info) {
                           return configName(info.param);
                         });

}  // namespace
}  // namespace colltest
