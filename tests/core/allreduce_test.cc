// ncclAllReduce across ranks (threads and processes, 1..8 ranks, shm and TCP): large float
// sums in and out of place, every data type with every built-in op, empty and odd-sized
// counts, PreMulSum with a host scalar, and bitwise determinism.
#include <nccl.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/core_util.h"
#include "core/dtype_ref.h"

namespace loomtest {
namespace {

class AllReduceTest : public CoreTest {};

// Rank r contributes 2^r * (i % 1024): every partial sum is an integer below 2^24, so
// float addition is exact in any order, and a contribution lost or counted twice cannot
// be masked by another (sums of distinct powers of two are unique).
float floatInput(int rank, size_t i) { return static_cast<float>((1 << rank) * (i % 1024)); }

std::string floatSum(int rank, int nranks, ncclComm_t comm, size_t count, bool inPlace) {
  std::vector<float> send(count), recv(count, -1.0f);
  for (size_t i = 0; i < count; ++i) send[i] = floatInput(rank, i);
  float* out = inPlace ? send.data() : recv.data();
  RANK_NCCL(ncclAllReduce(send.data(), out, count, ncclFloat, ncclSum, comm, nullptr));
  const float factor = static_cast<float>((1 << nranks) - 1);
  for (size_t i = 0; i < count; ++i) {
    float want = factor * static_cast<float>(i % 1024);
    RANK_CHECK(out[i] == want, "%s: element %zu of %zu is %g, expected %g",
               inPlace ? "in-place" : "out-of-place", i, count, out[i], want);
  }
  if (!inPlace)
    for (size_t i = 0; i < count; ++i)
      RANK_CHECK(send[i] == floatInput(rank, i),
                 "out-of-place: sendbuff element %zu was modified", i);
  return "";
}

TEST_P(AllReduceTest, FloatSumOneMebiElements) {
  run([](int rank, int nranks, ncclComm_t comm) {
    RANK_TRY(floatSum(rank, nranks, comm, 1 << 20, false));
    return floatSum(rank, nranks, comm, 1 << 20, true);
  });
}

// ---- every type x op with values whose results are exact in every type

// Half-width of the input range: every partial sum of up to 8 ranks stays exactly
// representable (fp8 e5m2 holds the integers to 8, e4m3 to 16, bf16 to 256).
int inputRange(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return 4;
    case ncclUint8: return 8;
    case ncclFloat8e5m2: return 1;
    case ncclFloat8e4m3: return 2;
    case ncclFloat16: case ncclBfloat16: return 8;
    default: return 1000;
  }
}

double inputValue(ncclDataType_t t, ncclRedOp_t op, int rank, size_t i) {
  if (op == ncclProd) {
    if (isUnsigned(t)) return 1 + (rank + i) % 2;         // {1, 2}: wraps in uint8 at 8 ranks
    return (rank * 5 + i * 3) % 3 == 0 ? -1.0 : 1.0;      // {-1, 1}
  }
  int range = inputRange(t);
  int span = isUnsigned(t) ? range + 1 : 2 * range + 1;
  int v = static_cast<int>((rank * 7 + i * 13 + rank * i) % span);
  return isUnsigned(t) ? v : v - range;
}

// Integer results wrap to the type's width, as NCCL's do.
double wrapInt(ncclDataType_t t, uint64_t bits) {
  unsigned char buf[8];
  memcpy(buf, &bits, 8);
  return decode(t, buf);
}

bool isPow2(int n) { return (n & (n - 1)) == 0; }

// Expected result and the tolerance allowed (0 = bitwise exact).
void expected(ncclDataType_t t, ncclRedOp_t op, int nranks, size_t i, double* want,
              double* tol) {
  *tol = 0;
  if (!isFloat(t)) {
    uint64_t acc = op == ncclProd ? 1 : 0;
    int64_t mx = INT64_MIN, mn = INT64_MAX;
    for (int r = 0; r < nranks; ++r) {
      int64_t v = static_cast<int64_t>(inputValue(t, op, r, i));
      if (op == ncclProd) acc *= static_cast<uint64_t>(v);
      else acc += static_cast<uint64_t>(v);
      mx = std::max(mx, v);
      mn = std::min(mn, v);
    }
    switch (op) {
      case ncclMax: *want = static_cast<double>(mx); return;
      case ncclMin: *want = static_cast<double>(mn); return;
      case ncclAvg: {
        double sum = wrapInt(t, acc);  // the wrapped sum, then divided (toward zero)
        *want = static_cast<double>(static_cast<int64_t>(sum) / nranks);
        return;
      }
      default: *want = wrapInt(t, acc); return;
    }
  }
  double acc = op == ncclProd ? 1 : 0, mx = -INFINITY, mn = INFINITY, absSum = 0;
  for (int r = 0; r < nranks; ++r) {
    double v = inputValue(t, op, r, i);
    acc = op == ncclProd ? acc * v : acc + v;
    mx = std::max(mx, v);
    mn = std::min(mn, v);
    absSum += std::fabs(v);
  }
  switch (op) {
    case ncclMax: *want = mx; return;
    case ncclMin: *want = mn; return;
    case ncclAvg:
      // Floats: each input is multiplied by 1/nranks rounded to the type, then summed;
      // exact when nranks is a power of two, else within a few roundings.
      *want = acc / nranks;
      if (!isPow2(nranks)) *tol = (nranks + 3) * std::ldexp(absSum / nranks, -mantissaBits(t) - 1);
      return;
    default: *want = acc; return;
  }
}

std::string typeOpCase(int rank, int nranks, ncclComm_t comm, ncclDataType_t t, ncclRedOp_t op,
                       size_t count) {
  size_t sz = typeSize(t);
  std::vector<unsigned char> send(count * sz), recv(count * sz, 0xa5);
  for (size_t i = 0; i < count; ++i) encode(t, inputValue(t, op, rank, i), &send[i * sz]);
  RANK_NCCL(ncclAllReduce(send.data(), recv.data(), count, t, op, comm, nullptr));
  for (size_t i = 0; i < count; ++i) {
    double want, tol;
    expected(t, op, nranks, i, &want, &tol);
    double got = decode(t, &recv[i * sz]);
    if (tol == 0) {
      std::vector<unsigned char> wantBytes(sz);
      encode(t, want, wantBytes.data());
      RANK_CHECK(memcmp(wantBytes.data(), &recv[i * sz], sz) == 0,
                 "%s %s count %zu: element %zu is %.17g, expected exactly %.17g", typeName(t),
                 opName(op), count, i, got, want);
    } else {
      RANK_CHECK(std::fabs(got - want) <= tol,
                 "%s %s count %zu: element %zu is %.17g, expected %.17g +- %g", typeName(t),
                 opName(op), count, i, got, want, tol);
    }
  }
  return "";
}

TEST_P(AllReduceTest, EveryTypeAndOp) {
  run([](int rank, int nranks, ncclComm_t comm) {
    std::string first;
    for (size_t count : {size_t{1}, size_t{1031}})
      for (ncclDataType_t t : kAllTypes)
        for (ncclRedOp_t op : kAllOps) RANK_CONTINUE(first, typeOpCase(rank, nranks, comm, t, op, count));
    return first;
  });
}

TEST_P(AllReduceTest, CountZero) {
  run([](int rank, int nranks, ncclComm_t comm) {
    RANK_NCCL(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, comm, nullptr));
    float send = 1.0f, recv = 42.0f;
    RANK_NCCL(ncclAllReduce(&send, &recv, 0, ncclFloat, ncclSum, comm, nullptr));
    RANK_CHECK(recv == 42.0f, "a count-0 all-reduce wrote to recvbuff (%g)", recv);
    // The communicator still works afterwards.
    RANK_NCCL(ncclAllReduce(&send, &recv, 1, ncclFloat, ncclSum, comm, nullptr));
    RANK_CHECK(recv == static_cast<float>(nranks), "after count 0: %g, expected %d", recv, nranks);
    return std::string();
  });
}

// Bigger than one FIFO slot (256 KiB) and not a multiple of nranks (nor of 4 for bytes):
// chunk boundaries fall inside slots and the last chunk is short.
TEST_P(AllReduceTest, LargerThanSlotOddCount) {
  run([](int rank, int nranks, ncclComm_t comm) {
    const size_t count = 3 * (256 << 10) / 4 + 5;  // floats: 3 slots and 20 bytes
    RANK_TRY(floatSum(rank, nranks, comm, count, false));
    const size_t bytes = 3 * (256 << 10) + 3;  // uint8 max of rank-shifted values
    std::vector<uint8_t> send(bytes), recv(bytes);
    for (size_t i = 0; i < bytes; ++i) send[i] = static_cast<uint8_t>((i + rank * 37) % 251);
    RANK_NCCL(ncclAllReduce(send.data(), recv.data(), bytes, ncclUint8, ncclMax, comm, nullptr));
    for (size_t i = 0; i < bytes; ++i) {
      uint8_t want = 0;
      for (int r = 0; r < nranks; ++r) want = std::max(want, static_cast<uint8_t>((i + r * 37) % 251));
      RANK_CHECK(recv[i] == want, "uint8 max: byte %zu of %zu is %u, expected %u", i, bytes,
                 recv[i], want);
    }
    return std::string();
  });
}

// ncclRedOpCreatePreMulSum with a per-rank host scalar: result = sum_r scalar_r * x_r.
TEST_P(AllReduceTest, PreMulSumHostScalar) {
  run([](int rank, int nranks, ncclComm_t comm) {
    const size_t count = 4099;
    {
      float scalar = static_cast<float>(rank + 1);
      ncclRedOp_t op;
      RANK_NCCL(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm));
      scalar = -100.0f;  // immediate: the value was captured at creation
      std::vector<float> send(count), recv(count);
      for (size_t i = 0; i < count; ++i) send[i] = static_cast<float>(i % 17) - 8.0f;
      RANK_NCCL(ncclAllReduce(send.data(), recv.data(), count, ncclFloat, op, comm, nullptr));
      float factor = static_cast<float>(nranks * (nranks + 1) / 2);
      for (size_t i = 0; i < count; ++i)
        RANK_CHECK(recv[i] == factor * send[i], "float premulsum: element %zu is %g, expected %g",
                   i, recv[i], factor * send[i]);
      RANK_NCCL(ncclRedOpDestroy(op, comm));
      ncclResult_t r = ncclAllReduce(send.data(), recv.data(), count, ncclFloat, op, comm, nullptr);
      RANK_CHECK(r == ncclInvalidArgument, "a destroyed op was accepted (%d)", r);
    }
    {
      int32_t scalar = rank % 2 ? -2 : 3;
      ncclRedOp_t op;
      RANK_NCCL(ncclRedOpCreatePreMulSum(&op, &scalar, ncclInt32, ncclScalarHostImmediate, comm));
      std::vector<int32_t> send(count), recv(count);
      for (size_t i = 0; i < count; ++i) send[i] = static_cast<int32_t>(i) * (rank + 1);
      RANK_NCCL(ncclAllReduce(send.data(), recv.data(), count, ncclInt32, op, comm, nullptr));
      for (size_t i = 0; i < count; ++i) {
        int64_t want = 0;
        for (int r = 0; r < nranks; ++r) want += (r % 2 ? -2 : 3) * static_cast<int64_t>(i) * (r + 1);
        RANK_CHECK(recv[i] == want, "int32 premulsum: element %zu is %d, expected %lld", i,
                   recv[i], static_cast<long long>(want));
      }
      RANK_NCCL(ncclRedOpDestroy(op, comm));
    }
    return std::string();
  });
}

// Inexact float sums: the result bits must be the same on every rank and in every run,
// including on a second communicator over the same ranks.
TEST_P(AllReduceTest, DeterministicBits) {
  run([](int rank, int nranks, ncclComm_t comm) {
    const size_t count = (256 << 10) + 3;
    std::vector<float> send(count), recv(count);
    uint64_t s = 0x9e3779b97f4a7c15ull * (rank + 1);
    for (auto& x : send) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      x = static_cast<float>(static_cast<int64_t>(s >> 11) % 2000001 - 1000000) / 7777.0f;
    }
    ncclComm_t second = nullptr;
    RANK_NCCL(ncclCommSplit(comm, 0, rank, &second, nullptr));
    uint64_t first = 0;
    for (int iter = 0; iter < 3; ++iter) {
      ncclComm_t c = iter == 2 ? second : comm;
      std::fill(recv.begin(), recv.end(), 0.0f);
      RANK_NCCL(ncclAllReduce(send.data(), recv.data(), count, ncclFloat, ncclSum, c, nullptr));
      uint64_t h = fnv1a(recv.data(), count * sizeof(float));
      if (iter == 0) first = h;
      RANK_CHECK(h == first, "run %d gave different bits than run 0 (%#llx vs %#llx)", iter,
                 static_cast<unsigned long long>(h), static_cast<unsigned long long>(first));
      RANK_TRY(expectSameOnAllRanks(c, rank, nranks, h, "all-reduce result hash"));
    }
    // And the bits are a float sum, not consistent garbage: each element within the
    // rounding error of the exact sum (recomputed here from every rank's generator).
    std::vector<double> exact(count, 0.0);
    for (int r = 0; r < nranks; ++r) {
      uint64_t g = 0x9e3779b97f4a7c15ull * (r + 1);
      for (size_t i = 0; i < count; ++i) {
        g = g * 6364136223846793005ull + 1442695040888963407ull;
        exact[i] += static_cast<float>(static_cast<int64_t>(g >> 11) % 2000001 - 1000000) / 7777.0f;
      }
    }
    for (size_t i = 0; i < count; ++i)
      RANK_CHECK(std::fabs(recv[i] - exact[i]) <= 1e-5 * nranks * 130.0,
                 "element %zu is %.9g, exact sum %.9g", i, recv[i], exact[i]);
    RANK_NCCL(ncclCommDestroy(second));
    return std::string();
  });
}

// Each all-reduce algorithm forced through NCCL_ALGO (read at init), at sizes around its
// chunking boundaries, with an exact float sum in and out of place and a few type/op
// pairs whose odd element counts leave short chunks.
class AllReduceAlgoTest : public CoreTest {};

std::string algorithmCases(int rank, int nranks, ncclComm_t comm, bool inPlace) {
  std::string first;
  for (size_t count : {size_t{1}, size_t{1031}, size_t{65539}, size_t{300001}}) {
    RANK_CONTINUE(first, floatSum(rank, nranks, comm, count, false));
    if (inPlace) RANK_CONTINUE(first, floatSum(rank, nranks, comm, count, true));
  }
  for (ncclDataType_t t : {ncclInt8, ncclFloat16, ncclFloat64})
    for (ncclRedOp_t op : {ncclProd, ncclMax, ncclAvg})
      RANK_CONTINUE(first, typeOpCase(rank, nranks, comm, t, op, 4099));
  return first;
}

void runAlgorithm(const CoreParam& p, const char* algo, bool inPlace) {
  EnvGuard env("NCCL_ALGO", algo);
  auto f = runRanks(p.mode, p.nranks, [&](int rank, int nranks, ncclComm_t comm) {
    return algorithmCases(rank, nranks, comm, inPlace);
  });
  EXPECT_TRUE(f.empty()) << "NCCL_ALGO=" << algo << "\n" << joinFailures(f);
}

TEST_P(AllReduceAlgoTest, Ring) { runAlgorithm(GetParam(), "Ring", true); }
TEST_P(AllReduceAlgoTest, Tree) { runAlgorithm(GetParam(), "Tree", true); }
TEST_P(AllReduceAlgoTest, HalvingDoubling) { runAlgorithm(GetParam(), "HalvingDoubling", true); }
TEST_P(AllReduceAlgoTest, Direct) { runAlgorithm(GetParam(), "Direct", true); }

std::vector<CoreParam> algoMatrix() {
  return {{Mode::kThreads, 1, Transport::kShm},      {Mode::kThreads, 2, Transport::kSocket},
          {Mode::kThreads, 3, Transport::kShm},      {Mode::kProcesses, 3, Transport::kSocket},
          {Mode::kProcesses, 4, Transport::kShm},    {Mode::kThreads, 5, Transport::kSocket},
          {Mode::kThreads, 8, Transport::kShm},      {Mode::kProcesses, 8, Transport::kSocket}};
}
INSTANTIATE_TEST_SUITE_P(Core, AllReduceAlgoTest, testing::ValuesIn(algoMatrix()), coreParamName);

// Regression: direct all-reduce in place had ranks other than 0 receive rank 0's data
// into recvbuff, which is their sendbuff, before their own contribution was read.
TEST(CoreRegression, DirectInPlace) {
  EnvGuard algo("NCCL_ALGO", "Direct");
  EnvGuard limit("LOOM_TIMEOUT", "10");
  auto f = runRanks(Mode::kThreads, 2, [](int rank, int nranks, ncclComm_t comm) {
    float x[3] = {1.0f * (rank + 1), 10.0f * (rank + 1), 100.0f * (rank + 1)};
    RANK_NCCL(ncclAllReduce(x, x, 3, ncclFloat, ncclSum, comm, nullptr));
    RANK_CHECK(x[0] == 3 && x[1] == 30 && x[2] == 300, "in-place sum is {%g, %g, %g}, expected {3, 30, 300}",
               x[0], x[1], x[2]);
    return std::string();
  }, 60);
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

// Regression: ring all-reduce used to send a whole chunk before receiving, so a chunk of
// >= LOOM_FIFO_DEPTH FIFO steps filled every FIFO around the ring and each rank then
// waited for a free send slot before consuming its receive slot. 4 KiB slots make it
// small: 2 ranks, 16384 floats = two 32 KiB chunks of 8 slots. LOOM_TIMEOUT bounds a
// relapse, so the test fails instead of hanging.
TEST(CoreRegression, RingChunkSpanningWholeFifo) {
  EnvGuard algo("NCCL_ALGO", "Ring");
  EnvGuard slot("LOOM_SLOT_BYTES", "4096");
  EnvGuard depth("LOOM_FIFO_DEPTH", "8");
  EnvGuard limit("LOOM_TIMEOUT", "5");
  auto f = runRanks(Mode::kThreads, 2, [](int rank, int nranks, ncclComm_t comm) {
    std::vector<float> send(16384, static_cast<float>(rank + 1)), recv(16384);
    RANK_NCCL(ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, comm, nullptr));
    for (size_t i = 0; i < recv.size(); ++i)
      RANK_CHECK(recv[i] == 3.0f, "element %zu is %g", i, recv[i]);
    return std::string();
  }, 60);
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

INSTANTIATE_TEST_SUITE_P(Core, AllReduceTest, testing::ValuesIn(fullMatrix()), coreParamName);

}  // namespace
}  // namespace loomtest
