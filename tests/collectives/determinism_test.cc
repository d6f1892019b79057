// All-reduce determinism (issue 3): for each algorithm and 3 or 8 ranks, random float32
// and bfloat16 inputs (sums that round differently in different orders) must give every
// rank bitwise-identical results, the same bits when repeated on the communicator, and
// the same bits on fresh communicators: twice with ranks as threads, once as processes.
// The result must also be close to the exact sum, so that agreement is not vacuous.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "collectives/coll_buffers.h"
#include "collectives/coll_env.h"
#include "collectives/coll_matrix.h"

namespace colltest {
namespace {

using loomtest::Mode;

struct DetCase {
  ncclDataType_t type;
  Op op;
  size_t count;
};

std::vector<DetCase> detCases() {
  std::vector<DetCase> v;
  for (ncclDataType_t t : {ncclFloat32, ncclBfloat16})
    for (Op op : {Op::kSum, Op::kAvg})
      for (size_t count : {size_t{1001}, kMidCount, largeCount(t)}) v.push_back({t, op, count});
  return v;
}

// A float with a random sign, a random 23-bit mantissa and an exponent in [-8, 8]: sums
// of these lose different low bits in different orders. bfloat16 keeps its top half.
uint32_t randomFloatBits(int rank, size_t i, uint64_t seed) {
  uint64_t r = randomBits(seed, rank, i);
  uint32_t sign = static_cast<uint32_t>(r >> 63) << 31;
  uint32_t exp = static_cast<uint32_t>(127 - 8 + below(r, 17));
  return sign | (exp << 23) | static_cast<uint32_t>((r >> 8) & 0x7fffff);
}
uint64_t inputBits(ncclDataType_t t, int rank, size_t i, uint64_t seed) {
  uint32_t f = randomFloatBits(rank, i, seed);
  return t == ncclFloat32 ? f : f >> 16;
}
double asDouble(ncclDataType_t t, uint64_t bits) {
  uint32_t f = t == ncclFloat32 ? static_cast<uint32_t>(bits) : static_cast<uint32_t>(bits) << 16;
  float v;
  memcpy(&v, &f, 4);
  return v;
}

// One communicator's run of every case: returns per-case hashes through `hashes` (rank 0
// writes them; the all-gather has already shown that every rank holds the same).
std::string runDeterminism(int rank, int nranks, ncclComm_t comm, const char* label,
                           const std::vector<uint64_t>* want, std::vector<uint64_t>* hashes) {
  const auto cases = detCases();
  for (size_t k = 0; k < cases.size(); ++k) {
    const DetCase& c = cases[k];
    const size_t sz = typeSize(c.type), n = c.count;
    const uint64_t seed = 0xde7e + k;
    std::vector<uint8_t> send(n * sz), recv(n * sz, kPoison), again(n * sz, kPoison);
    for (size_t i = 0; i < n; ++i) storeBits(&send[i * sz], sz, inputBits(c.type, rank, i, seed));
    ncclRedOp_t op = builtinOp(c.op);
    RANK_NCCL(ncclAllReduce(send.data(), recv.data(), n, c.type, op, comm, nullptr));
    char what[160];
    snprintf(what, sizeof(what), "%s: allreduce %s %s count=%zu nranks=%d", label, typeName(c.type),
             opName(c.op), n, nranks);

    // Close to the exact result: recursive summation's bound, plus the output rounding
    // and (Avg) the rounded 1/nranks.
    const double u = unitRoundoff(c.type);
    for (size_t i = 0; i < n; ++i) {
      double exact = 0, abs = 0;
      for (int r = 0; r < nranks; ++r) {
        double x = asDouble(c.type, inputBits(c.type, r, i, seed));
        exact += x;
        abs += std::fabs(x);
      }
      double scale = c.op == Op::kAvg ? 1.0 / nranks : 1.0;
      double got = asDouble(c.type, loadBits(&recv[i * sz], sz));
      double tol = (nranks + 3) * u * abs * scale;
      RANK_CHECK(std::fabs(got - exact * scale) <= tol,
                 "%s rank=%d: element %zu is %.9g, expected %.9g +- %.3g", what, rank, i, got,
                 exact * scale, tol);
    }

    // Every rank holds the same bits.
    uint64_t h = hashBytes(recv.data(), recv.size());
    std::vector<uint64_t> all(nranks);
    RANK_NCCL(ncclAllGather(&h, all.data(), 1, ncclUint64, comm, nullptr));
    for (int r = 0; r < nranks; ++r)
      RANK_CHECK(all[r] == h, "%s: rank %d's result hashes to %#llx, rank %d's to %#llx", what, r,
                 static_cast<unsigned long long>(all[r]), rank, static_cast<unsigned long long>(h));

    // Repeated (in place this time) on the same communicator: the same bits.
    memcpy(again.data(), send.data(), send.size());
    RANK_NCCL(ncclAllReduce(again.data(), again.data(), n, c.type, op, comm, nullptr));
    size_t diff = 0;
    while (diff < n * sz && again[diff] == recv[diff]) ++diff;
    RANK_CHECK(diff == n * sz, "%s rank=%d: repeated in place, byte %zu differs (element %zu)",
               what, rank, diff, diff / sz);

    // And the same bits as an earlier run on another communicator.
    if (want)
      RANK_CHECK((*want)[k] == h,
                 "%s rank=%d: result hashes to %#llx, an earlier communicator's to %#llx", what,
                 rank, static_cast<unsigned long long>(h),
                 static_cast<unsigned long long>((*want)[k]));
    if (hashes && rank == 0) (*hashes)[k] = h;
  }
  return "";
}

struct DetParam {
  Algo algo;
  int nranks;
};

class Determinism : public testing::TestWithParam<DetParam> {};

TEST_P(Determinism, SameBitsOnEveryRankAndRun) {
  const DetParam p = GetParam();
  AlgoEnv env(p.algo);
  std::vector<uint64_t> first(detCases().size(), 0);
  auto f = loomtest::runRanks(Mode::kThreads, p.nranks, [&](int rank, int n, ncclComm_t comm) {
    return runDeterminism(rank, n, comm, "first run (threads)", nullptr, &first);
  }, 240);
  ASSERT_TRUE(f.empty()) << loomtest::joinFailures(f);
  f = loomtest::runRanks(Mode::kThreads, p.nranks, [&](int rank, int n, ncclComm_t comm) {
    return runDeterminism(rank, n, comm, "second run (threads)", &first, nullptr);
  }, 240);
  EXPECT_TRUE(f.empty()) << loomtest::joinFailures(f);
  f = loomtest::runRanks(Mode::kProcesses, p.nranks, [&](int rank, int n, ncclComm_t comm) {
    return runDeterminism(rank, n, comm, "third run (processes)", &first, nullptr);
  }, 240);
  EXPECT_TRUE(f.empty()) << loomtest::joinFailures(f);
}

std::vector<DetParam> detParams() {
  std::vector<DetParam> v;
  for (Algo a : {Algo::kRing, Algo::kTree, Algo::kHalvingDoubling, Algo::kDirect})
    for (int n : {3, 8}) v.push_back({a, n});
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllReduce, Determinism, testing::ValuesIn(detParams()),
                         [](const testing::TestParamInfo<DetParam>& info) {
                           return std::string(algoName(info.param.algo)) + "_" +
                                  std::to_string(info.param.nranks);
                         });

}  // namespace
}  // namespace colltest
