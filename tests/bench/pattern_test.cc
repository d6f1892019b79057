// Host codecs for the 16- and 8-bit float types, and the promise the check relies on:
// every input and every expected reduction result is exactly representable.
#include "bench/common/pattern.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace loom::bench {
namespace {

TEST(BenchCodecs, HalfKnownEncodings) {
  EXPECT_EQ(encodeMini(kHalfFormat, 1.0), 0x3c00u);
  EXPECT_EQ(encodeMini(kHalfFormat, -2.0), 0xc000u);
  EXPECT_EQ(encodeMini(kHalfFormat, 65504.0), 0x7bffu);
  EXPECT_EQ(encodeMini(kHalfFormat, 1e6), 0x7c00u);      // inf
  EXPECT_EQ(encodeMini(kHalfFormat, 0x1p-24), 0x0001u);  // smallest subnormal
  EXPECT_EQ(encodeMini(kHalfFormat, 2049.0), 0x6800u);   // tie rounds to even: 2048
  EXPECT_EQ(encodeMini(kHalfFormat, 2051.0), 0x6802u);   // tie rounds to even: 2052
  EXPECT_EQ(decodeMini(kHalfFormat, 0x3555), 0.333251953125);
  EXPECT_TRUE(std::isnan(decodeMini(kHalfFormat, 0x7e00)));
  EXPECT_TRUE(std::isinf(decodeMini(kHalfFormat, 0xfc00)));
}

TEST(BenchCodecs, Bfloat16KnownEncodings) {
  EXPECT_EQ(encodeMini(kBf16Format, 1.0), 0x3f80u);
  EXPECT_EQ(encodeMini(kBf16Format, -3.0), 0xc040u);
  EXPECT_EQ(encodeMini(kBf16Format, 256.0), 0x4380u);
  EXPECT_EQ(encodeMini(kBf16Format, 257.0), 0x4380u);  // tie to even
  EXPECT_EQ(decodeMini(kBf16Format, 0x4049), 3.140625);
}

TEST(BenchCodecs, Fp8KnownEncodings) {
  EXPECT_EQ(encodeMini(kE4m3Format, 1.0), 0x38u);
  EXPECT_EQ(encodeMini(kE4m3Format, 448.0), 0x7eu);  // largest finite
  EXPECT_EQ(encodeMini(kE4m3Format, -448.0), 0xfeu);
  EXPECT_EQ(encodeMini(kE4m3Format, 0x1p-9), 0x01u);  // smallest subnormal
  EXPECT_TRUE(std::isnan(decodeMini(kE4m3Format, 0x7f)));
  EXPECT_EQ(decodeMini(kE4m3Format, 0x78), 256.0);  // e4m3 has no inf: S.1111.000 is finite
  EXPECT_EQ(encodeMini(kE5m2Format, 1.0), 0x3cu);
  EXPECT_EQ(encodeMini(kE5m2Format, 57344.0), 0x7bu);
  EXPECT_TRUE(std::isinf(decodeMini(kE5m2Format, 0x7c)));
}

TEST(BenchCodecs, EveryBitPatternRoundTrips) {
  for (const MiniFloat* f : {&kHalfFormat, &kBf16Format, &kE4m3Format, &kE5m2Format}) {
    uint32_t patterns = 1u << (1 + f->expBits + f->mantBits);
    for (uint32_t bits = 0; bits < patterns; ++bits) {
      double v = decodeMini(*f, bits);
      if (std::isnan(v)) continue;
      ASSERT_EQ(encodeMini(*f, v), bits)
          << "format e" << f->expBits << "m" << f->mantBits << " bits " << bits;
    }
  }
}

TEST(BenchPattern, InputsAndExpectedResultsAreExactlyRepresentable) {
  for (const TypeInfo& t : allTypes()) {
    for (const OpInfo& op : allOps()) {
      for (int n : {1, 2, 3, 4, 7, 8, 16}) {
        ReducePattern p{&t, &op, n, 777};
        for (size_t i = 0; i < 300; ++i) {
          for (int r = 0; r < n; ++r) {
            double v = reduceInput(p, r, i);
            unsigned char buf[8];
            storeValue(t.type, buf, 0, v);
            ASSERT_EQ(loadValue(t.type, buf, 0), v) << t.name << " " << op.name << " n=" << n;
          }
          if (!reduceIsExact(p)) continue;
          double want = reduceExpected(p, i);
          unsigned char buf[8];
          storeValue(t.type, buf, 0, want);
          ASSERT_EQ(loadValue(t.type, buf, 0), want) << t.name << " " << op.name << " n=" << n;
        }
      }
    }
  }
}

TEST(BenchPattern, InputsVaryAcrossRanksAndElements) {
  const TypeInfo* f = findType("float");
  ReducePattern p{f, findOp("sum"), 4, 1};
  int distinct = 0;
  for (size_t i = 1; i < 100; ++i) distinct += reduceInput(p, 0, i) != reduceInput(p, 0, i - 1);
  EXPECT_GT(distinct, 90);
  int differ = 0;
  for (size_t i = 0; i < 100; ++i) differ += reduceInput(p, 0, i) != reduceInput(p, 1, i);
  EXPECT_GT(differ, 90);
  // Another seed, another data set: stale results from an earlier check cannot pass.
  ReducePattern q{f, findOp("sum"), 4, 2};
  int reseeded = 0;
  for (size_t i = 0; i < 100; ++i) reseeded += reduceExpected(p, i) != reduceExpected(q, i);
  EXPECT_GT(reseeded, 90);
}

TEST(BenchPattern, ProdAndAvgSemantics) {
  const TypeInfo* i8 = findType("int8");
  ReducePattern prod{i8, findOp("prod"), 8, 5};
  for (size_t i = 0; i < 1000; ++i) {
    double want = 1;
    for (int r = 0; r < 8; ++r) want *= reduceInput(prod, r, i);
    EXPECT_EQ(reduceExpected(prod, i), want);
    EXPECT_LE(std::fabs(want), 64);
  }
  ReducePattern avg{findType("int32"), findOp("avg"), 3, 5};
  for (size_t i = 0; i < 1000; ++i) {
    double sum = 0;
    for (int r = 0; r < 3; ++r) sum += reduceInput(avg, r, i);
    EXPECT_EQ(reduceExpected(avg, i), std::trunc(sum / 3));
  }
}

TEST(BenchPattern, ToleranceOnlyForFloatAverage) {
  ReducePattern p{findType("float"), findOp("avg"), 3, 9};
  EXPECT_FALSE(reduceIsExact(p));
  std::vector<float> got(64);
  for (size_t i = 0; i < got.size(); ++i) got[i] = static_cast<float>(reduceExpected(p, i));
  EXPECT_EQ(countWrongReduced(p, got.data(), got.size(), 0), 0);
  // Far beyond a few roundings: 1% off, and a result missing rank 2's contribution.
  got[5] = static_cast<float>(reduceExpected(p, 5) * 1.01 + 1);
  size_t missing = 0;
  while (std::fabs(reduceInput(p, 2, missing)) < 1000) ++missing;
  ASSERT_LT(missing, got.size());
  got[missing] = static_cast<float>((reduceInput(p, 0, missing) + reduceInput(p, 1, missing)) / 3);
  EXPECT_EQ(countWrongReduced(p, got.data(), got.size(), 0), missing == 5 ? 1 : 2);
  got[5] = std::nextafter(static_cast<float>(reduceExpected(p, 5)), 1e30f);  // one ulp is fine
  got[missing] = static_cast<float>(reduceExpected(p, missing));
  EXPECT_EQ(countWrongReduced(p, got.data(), got.size(), 0), 0);
  ReducePattern s{findType("float"), findOp("sum"), 3, 9};
  EXPECT_TRUE(reduceIsExact(s));
  for (size_t i = 0; i < got.size(); ++i) got[i] = static_cast<float>(reduceExpected(s, i));
  got[7] = std::nextafter(got[7], 1e30f);  // one ulp off an exact sum is wrong
  EXPECT_EQ(countWrongReduced(s, got.data(), got.size(), 0), 1);
}

TEST(BenchPattern, CopyPatternIsBitExactAtAnyOffset) {
  std::vector<unsigned char> whole(1000), part(300);
  fillCopyInput(3, 2, whole.data(), 500, 4, 0);
  fillCopyInput(3, 2, part.data(), 150, 4, 77);  // elements 77..226 of rank 4
  EXPECT_EQ(memcmp(part.data(), whole.data() + 154, 300), 0);
  EXPECT_EQ(countWrongCopy(3, 2, part.data(), 150, 4, 77), 0);
  EXPECT_EQ(countWrongCopy(3, 2, part.data(), 150, 5, 77), 150);  // another rank's data
  part[299] ^= 1;
  part[0] ^= 0x80;
  EXPECT_EQ(countWrongCopy(3, 2, part.data(), 150, 4, 77), 2);
  std::vector<unsigned char> zeros(40, 0);
  EXPECT_EQ(countWrongZero(8, zeros.data(), 5), 0);
  zeros[17] = 1;
  EXPECT_EQ(countWrongZero(8, zeros.data(), 5), 1);
}

TEST(BenchPattern, FillOnesWritesOneOfEachTypeUpToAPartialLastElement) {
  for (const TypeInfo& t : allTypes()) {
    const size_t bytes = 5 * t.size + t.size / 2;  // the last element cut in half (1-byte: 5)
    std::vector<unsigned char> buf(bytes + 8, 0xee);
    fillOnes(t, buf.data(), bytes);
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(loadValue(t.type, buf.data(), i), 1.0) << t.name;
    unsigned char one[8] = {};
    storeValue(t.type, one, 0, 1.0);
    EXPECT_EQ(memcmp(buf.data() + 5 * t.size, one, t.size / 2), 0) << t.name;
    EXPECT_EQ(buf[bytes], 0xee) << t.name << ": wrote past the end";
  }
}

}  // namespace
}  // namespace loom::bench
