// The test's own arithmetic, checked without any communicator: the codecs against known
// encodings, the reference against results computed another way, and the buffer checks
// against deliberate corruption (so that a matrix case cannot pass vacuously).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "collectives/coll_buffers.h"
#include "collectives/coll_reference.h"

namespace colltest {
namespace {

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


// Writes the expected results of a reduction as the type's bits (exact cases only).
std::vector<uint8_t> expectedBytes(const ReduceInputs& in, ncclDataType_t t, int nranks, size_t n) {
  size_t sz = typeSize(t);
  std::vector<uint8_t> out(n * sz);
  for (size_t j = 0; j < n; ++j) {
    Expect e = in.expect(nranks, j);
    storeBits(&out[j * sz], sz, isFloat(t) ? encodeFloatExact(t, e.value) : e.bits);
  }
  return out;
}

TEST(Checks, CatchCorruption) {
  const size_t n = 1000;
  for (ncclDataType_t t : kTypes) {
    const size_t sz = typeSize(t);
    SCOPED_TRACE(typeName(t));
    ReduceInputs in(t, Op::kSum, 99);
    std::vector<uint8_t> got = expectedBytes(in, t, 4, n);
    EXPECT_EQ(checkReduced("out", t, got.data(), n, in, 4, 0), "");
    // One element off by one unit in the last place.
    got[417 * sz] ^= 1;
    std::string e = checkReduced("out", t, got.data(), n, in, 4, 0);
    EXPECT_NE(e.find("out[417]"), std::string::npos) << e;
    EXPECT_NE(e.find("1 of 1000"), std::string::npos) << e;
    got[417 * sz] ^= 1;
    // The reference of another rank count, or of other elements, does not match.
    EXPECT_NE(checkReduced("out", t, got.data(), n, in, 3, 0), "");
    EXPECT_NE(checkReduced("out", t, got.data(), n, in, 4, 1), "");

    RawInputs raw(t, 7);
    std::vector<uint8_t> blocks(3 * n * sz);
    for (int r = 0; r < 3; ++r) raw.fill(r, 0, n, &blocks[r * n * sz]);
    auto want = [&](int r, size_t j) { return raw.bits(r, j); };
    EXPECT_EQ(checkBlocks("recv", t, blocks.data(), n, 3, want), "");
    std::swap(blocks[0], blocks[n * sz]);  // rank 0's and rank 1's first elements swapped
    e = checkBlocks("recv", t, blocks.data(), n, 3, want);
    EXPECT_NE(e.find("recv[0]"), std::string::npos) << e;
  }
  GuardedBuffer b(64, 64 + 8);
  EXPECT_EQ(b.checkGuards("buf"), "");
  EXPECT_EQ(checkPoison("buf", ncclInt32, b.data(), b.bytes()), "");
  b.data()[-1] ^= 0xff;
  EXPECT_NE(b.checkGuards("buf").find("before"), std::string::npos);
  b.data()[-1] ^= 0xff;
  b.data()[64] ^= 0xff;
  EXPECT_NE(b.checkGuards("buf").find("after"), std::string::npos);
  b.data()[64] ^= 0xff;
  b.data()[13] = 0;
  EXPECT_NE(checkPoison("buf", ncclInt32, b.data(), b.bytes()).find("buf[3]"), std::string::npos);
}

// Float Avg over a rank count that is not a power of two rounds; the bound must admit
// NCCL's way of computing it: each input times 1/nranks rounded to the type, then summed
// in rank order, each step rounded to the type.
TEST(Checks, AvgToleranceAdmitsRoundingOnly) {
  for (ncclDataType_t t : {ncclFloat16, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2}) {
    SCOPED_TRACE(typeName(t));
    ReduceInputs in(t, Op::kAvg, 3);
    const int nranks = 7;
    // Round to nearest even by table: the nearest of all finite codes.
    std::vector<double> codes;
    for (uint64_t c = 0; c < (1ull << (8 * typeSize(t))); ++c) {
      double v = decodeFloatSlow(t, c);
      if (std::isfinite(v)) codes.push_back(v);
    }
    auto round = [&](double v) {
      double best = codes[0];
      for (double c : codes)
        if (std::fabs(c - v) < std::fabs(best - v)) best = c;
      return best;
    };
    const double scale = round(1.0 / nranks);
    for (size_t i = 0; i < 50; ++i) {
      double acc = 0;
      for (int r = 0; r < nranks; ++r)
        acc = round(acc + round(decodeFloatSlow(t, in.bits(r, i)) * scale));
      Expect e = in.expect(nranks, i);
      EXPECT_LE(std::fabs(acc - e.value), e.tol) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace colltest
