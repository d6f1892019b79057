// The collectives matrix (issue 3): every collective x data type x op x in/out of place x
// all-reduce algorithm x nranks {1, 2, 3, 4, 7, 8} x counts {0, 1, 1001, 3 slots + 7,
// > 2 MiB}, ranks as threads (every type) and as processes (float32, bfloat16, int8 on 2,
// 3 and 8 ranks). One communicator per test; every case is checked against the reference
// in coll_reference.h. A test per (mode, nranks, algorithm) lets CTest run them in
// parallel; "default" runs the collectives other than all-reduce, whose algorithms are
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
  for (int n : {1, 2, 3, 4, 7, 8})
    for (Algo a : kAlgos) v.push_back({Mode::kThreads, n, a, true});
  for (int n : {2, 3, 8})
    for (Algo a : kAlgos) v.push_back({Mode::kProcesses, n, a, false});
  // The same over TCP instead of shared memory.
  for (Algo a : {Algo::kDefault, Algo::kRing}) v.push_back({Mode::kProcesses, 3, a, false, true});
  return v;
}

class Matrix : public testing::TestWithParam<MatrixConfig> {};

TEST_P(Matrix, EveryCase) {
  const MatrixConfig& cfg = GetParam();
  AlgoEnv env(cfg.algo);
  std::optional<ScopedEnv> noShm;
  if (cfg.socket) noShm.emplace("NCCL_SHM_DISABLE", "1");
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

// The inputs themselves: every reduction's inputs are representable, and the reference
// agrees with a few hand-computed results (so a wrong reference cannot pass silently).
TEST(Reference, HandComputedCases) {
  EXPECT_EQ(encodeFloatExact(ncclFloat16, 1.5), 0x3e00u);
  EXPECT_EQ(encodeFloatExact(ncclBfloat16, -2.0), 0xc000u);
  EXPECT_EQ(encodeFloatExact(ncclFloat8e4m3, 448.0), 0x7eu);
  EXPECT_EQ(encodeFloatExact(ncclFloat8e5m2, 57344.0), 0x7bu);
  EXPECT_EQ(encodeFloatExact(ncclFloat8e4m3, 0x1p-9), 0x01u);
  EXPECT_EQ(encodeFloatExact(ncclFloat16, -0x1p-24), 0x8001u);
  EXPECT_THROW(encodeFloatExact(ncclFloat8e5m2, 9.0), std::invalid_argument);
  EXPECT_THROW(encodeFloatExact(ncclFloat8e4m3, 17.0), std::invalid_argument);
  EXPECT_TRUE(std::isnan(decodeFloatSlow(ncclFloat8e4m3, 0xff)));
  EXPECT_TRUE(std::isinf(decodeFloatSlow(ncclFloat8e5m2, 0x7c)));
  EXPECT_EQ(decodeFloatSlow(ncclBfloat16, 0x3f80), 1.0);

  // int8 avg over 3 ranks truncates toward zero; uint8 sum wraps.
  for (ncclDataType_t t : kTypes)
    for (Op op : {Op::kSum, Op::kProd, Op::kMax, Op::kMin, Op::kAvg, Op::kPreMulSum}) {
      ReduceInputs in(t, op, 1234);
      for (size_t i = 0; i < 64; ++i) {
        int64_t sacc = 0;
        uint64_t uacc = 0;
        for (int r = 0; r < 3; ++r) {
          uint64_t b = in.bits(r, i);
          ASSERT_EQ(b & ~widthMask(t), 0u);
          if (isFloat(t)) {
            ASSERT_FALSE(std::isnan(decodeFloatSlow(t, b))) << typeName(t);
          }
          sacc += isSignedInt(t) ? signExtend(t, b) : static_cast<int64_t>(b);
          uacc += op == Op::kPreMulSum ? 3 * b : b;
        }
        Expect e = in.expect(3, i);
        if (!isFloat(t) && op == Op::kAvg) {
          EXPECT_EQ(e.bits, static_cast<uint64_t>(sacc / 3) & widthMask(t));
        }
        if (!isFloat(t) && (op == Op::kSum || op == Op::kPreMulSum)) {
          EXPECT_EQ(e.bits, uacc & widthMask(t));
        }
        if (isFloat(t) && op == Op::kSum) {
          double s = 0;
          for (int r = 0; r < 3; ++r) s += decodeFloatSlow(t, in.bits(r, i));
          EXPECT_EQ(e.value, s);
          EXPECT_EQ(e.tol, 0);
          // The exact sum is representable: it encodes without throwing.
          EXPECT_NO_THROW(encodeFloatExact(t, s)) << typeName(t);
        }
      }
    }
}

}  // namespace
}  // namespace colltest
