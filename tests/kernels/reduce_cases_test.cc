// Hand-checked edge cases of the reductions (values worked out from the format definitions
// and NCCL's/CUDA's documented behaviour), each run through the vector body and the tail
// of every instruction set this CPU has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/reduce.h"
#include "kernels/reference.h"

namespace loom {
namespace {

using test::bitsOf;

constexpr size_t kN = 37;  // one or more full vectors plus a tail on every instruction set

enum class Fn { kReduce, kReduce2, kPre, kPost };

template <typename S>
void expectAll(const Reducer& red, Fn fn, S a, S b, S want, const char* what) {
  for (int i = 0; i < kNumCpuIsas; ++i) {
    if (!cpuIsaSupported(CpuIsa(i))) continue;
    Reducer r = red.withIsa(CpuIsa(i));
    std::vector<S> va(kN, a), vb(kN, b), out(kN, S(0x5a));
    switch (fn) {
      case Fn::kReduce:
        r.reduce(out.data(), va.data(), vb.data(), kN);
        break;
      case Fn::kReduce2:
        r.reduce2(out.data(), va.data(), vb.data(), kN);
        break;
      case Fn::kPre:
        r.pre(out.data(), va.data(), kN);
        break;
      case Fn::kPost:
        r.post(out.data(), va.data(), kN);
        break;
    }
    for (size_t k = 0; k < kN; ++k) {
      ASSERT_EQ(out[k], want) << what << " isa=" << cpuIsaName(CpuIsa(i)) << " element " << k;
    }
  }
}

template <typename S>
void expectOp(int dtype, int op, S a, S b, S want, const char* what) {
  expectAll(Reducer::make(dtype, op, 2), Fn::kReduce, a, b, want, what);
}

constexpr int kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4;
constexpr int kI8 = 0, kU8 = 1, kI32 = 2, kU32 = 3, kI64 = 4, kU64 = 5, kF16 = 6, kF32 = 7,
              kF64 = 8, kBf16 = 9, kE4m3 = 10, kE5m2 = 11;

TEST(ReduceCases, Fp16RoundingOverflowNaNAndZeros) {
  expectOp<uint16_t>(kF16, kSum, 0x3c00, 0x1000, 0x3c00, "1 + 2^-11 ties to even (down)");
  expectOp<uint16_t>(kF16, kSum, 0x3c01, 0x1000, 0x3c02, "tie to even (up)");
  expectOp<uint16_t>(kF16, kSum, 0x7bff, 0x4b00, 0x7bff, "65504 + 14 stays finite");
  expectOp<uint16_t>(kF16, kSum, 0x7bff, 0x4c00, 0x7c00, "65504 + 16 ties up to inf");
  expectOp<uint16_t>(kF16, kSum, 0xfbff, 0xfbff, 0xfc00, "-65504 * 2 -> -inf");
  expectOp<uint16_t>(kF16, kSum, 0x0001, 0x0001, 0x0002, "subnormal sum");
  expectOp<uint16_t>(kF16, kSum, 0x03ff, 0x0001, 0x0400, "subnormal carries into normal");
  expectOp<uint16_t>(kF16, kProd, 0x0001, 0x3800, 0x0000, "2^-25 ties to zero");
  expectOp<uint16_t>(kF16, kProd, 0x0003, 0x3800, 0x0002, "1.5 * 2^-24 ties to 2 * 2^-24");
  expectOp<uint16_t>(kF16, kProd, 0x8001, 0x3800, 0x8000, "negative underflow keeps sign");
  expectOp<uint16_t>(kF16, kSum, 0x7e00, 0x3c00, 0x7fff, "NaN + 1 is canonical NaN");
  expectOp<uint16_t>(kF16, kSum, 0x7c00, 0xfc00, 0x7fff, "inf - inf is canonical NaN");
  expectOp<uint16_t>(kF16, kMax, 0x7e00, 0x3c00, 0x3c00, "max ignores NaN (left)");
  expectOp<uint16_t>(kF16, kMax, 0xbc00, 0xfe01, 0xbc00, "max ignores NaN (right)");
  expectOp<uint16_t>(kF16, kMin, 0x7e00, 0x7d00, 0x7fff, "min of NaNs is NaN");
  expectOp<uint16_t>(kF16, kMax, 0x8000, 0x0000, 0x0000, "max(-0, +0) = +0");
  expectOp<uint16_t>(kF16, kMin, 0x0000, 0x8000, 0x8000, "min(+0, -0) = -0");
}

TEST(ReduceCases, Bf16) {
  expectOp<uint16_t>(kBf16, kSum, 0x7f7f, 0x7f7f, 0x7f80, "overflow to inf");
  expectOp<uint16_t>(kBf16, kSum, 0x3f80, 0x3b80, 0x3f80, "1 + 2^-8 ties to even (down)");
  expectOp<uint16_t>(kBf16, kSum, 0x3f81, 0x3b80, 0x3f82, "tie to even (up)");
  expectOp<uint16_t>(kBf16, kSum, 0xffc1, 0x3f80, 0x7fff, "NaN is canonical");
  expectOp<uint16_t>(kBf16, kMin, 0xffc1, 0x3f80, 0x3f80, "min ignores NaN");
}

TEST(ReduceCases, Fp8SaturatesLikeCudaSatfinite) {
  expectOp<uint8_t>(kE4m3, kSum, 0x7e, 0x7e, 0x7e, "448 + 448 saturates");
  expectOp<uint8_t>(kE4m3, kProd, 0xfe, 0x7e, 0xfe, "-448 * 448 saturates");
  expectOp<uint8_t>(kE4m3, kSum, 0x38, 0x18, 0x38, "1 + 1/16 ties to even (down)");
  expectOp<uint8_t>(kE4m3, kSum, 0x39, 0x18, 0x3a, "1.125 + 1/16 ties to even (up)");
  expectOp<uint8_t>(kE4m3, kSum, 0xff, 0x38, 0x7f, "NaN in, NaN 0x7f out");
  expectOp<uint8_t>(kE4m3, kMax, 0x7f, 0xb8, 0xb8, "max ignores NaN");
  expectOp<uint8_t>(kE5m2, kSum, 0x7b, 0x7b, 0x7b, "57344 * 2 saturates, no inf");
  expectOp<uint8_t>(kE5m2, kSum, 0x7c, 0x3c, 0x7b, "inf + 1 saturates");
  expectOp<uint8_t>(kE5m2, kSum, 0x7c, 0xfc, 0x7f, "inf - inf is NaN");
  expectOp<uint8_t>(kE5m2, kMin, 0x7c, 0xfc, 0xfb, "min(inf, -inf) is stored saturated");
}

TEST(ReduceCases, Fp32AndFp64) {
  uint32_t nan = 0x7fc00000, one = bitsOf(1.0f), negZero = 0x80000000;
  expectOp<uint32_t>(kF32, kMax, nan, one, one, "max ignores NaN");
  expectOp<uint32_t>(kF32, kMin, one, nan, one, "min ignores NaN");
  expectOp<uint32_t>(kF32, kMax, negZero, 0, 0, "max(-0, +0)");
  expectOp<uint32_t>(kF32, kMin, 0, negZero, negZero, "min(+0, -0)");
  expectOp<uint32_t>(kF32, kSum, 0x7f7fffff, 0x7f7fffff, 0x7f800000, "overflow to inf");
  expectOp<uint32_t>(kF32, kSum, 1, 1, 2, "subnormals are not flushed");
  expectOp<uint64_t>(kF64, kMax, 0x8000000000000000ull, 0, 0, "max(-0, +0)");
  expectOp<uint64_t>(kF64, kSum, 1, 0x8000000000000000ull, 1, "subnormal + -0");
}

TEST(ReduceCases, IntegersWrapAndCompareInTheirType) {
  expectOp<int8_t>(kI8, kSum, 127, 1, -128, "int8 wraps");
  expectOp<uint8_t>(kU8, kSum, 255, 1, 0, "uint8 wraps");
  expectOp<int8_t>(kI8, kProd, 16, 16, 0, "int8 product wraps");
  expectOp<uint8_t>(kU8, kProd, 16, 17, 16, "uint8 product wraps");
  expectOp<int32_t>(kI32, kSum, INT32_MAX, 1, INT32_MIN, "int32 wraps");
  expectOp<uint32_t>(kU32, kSum, UINT32_MAX, 2, 1, "uint32 wraps");
  expectOp<int64_t>(kI64, kSum, INT64_MAX, 1, INT64_MIN, "int64 wraps");
  expectOp<int64_t>(kI64, kProd, INT64_MIN, -1, INT64_MIN, "int64 product wraps");
  expectOp<uint64_t>(kU64, kSum, UINT64_MAX, 1, 0, "uint64 wraps");
  expectOp<int8_t>(kI8, kMax, -128, 127, 127, "int8 max");
  expectOp<int8_t>(kI8, kMin, -128, 127, -128, "int8 min");
  expectOp<uint8_t>(kU8, kMax, 0, 255, 255, "uint8 max is unsigned");
  expectOp<uint32_t>(kU32, kMax, 0x80000000u, 1, 0x80000000u, "uint32 max is unsigned");
  expectOp<int32_t>(kI32, kMin, INT32_MIN, INT32_MAX, INT32_MIN, "int32 min");
  expectOp<int64_t>(kI64, kMax, INT64_MIN, INT64_MAX, INT64_MAX, "int64 max");
  expectOp<uint64_t>(kU64, kMax, 1ull << 63, 1, 1ull << 63, "uint64 max is unsigned");
  expectOp<uint64_t>(kU64, kMin, 0, UINT64_MAX, 0, "uint64 min");
}

TEST(ReduceCases, IntegerAvgDividesTheWrappedSumTowardZero) {
  Reducer r = Reducer::make(kI32, kAvg, 4);
  EXPECT_EQ(r.kind, RedKind::kSumPostDiv);
  EXPECT_FALSE(r.hasPre());
  EXPECT_TRUE(r.hasPost());
  EXPECT_EQ(r.scalarBits, 4u);
  expectAll<int32_t>(r, Fn::kReduce, -7, 0, -7, "sum part");
  expectAll<int32_t>(r, Fn::kPost, -7, 0, -1, "-7 / 4 truncates to -1");
  expectAll<int32_t>(r, Fn::kPost, 7, 0, 1, "7 / 4");
  Reducer r8 = Reducer::make(kI8, kAvg, 2);
  expectAll<int8_t>(r8, Fn::kReduce, 100, 100, -56, "int8 sum wraps first");
  expectAll<int8_t>(r8, Fn::kPost, -56, 0, -28, "then divides");
  expectAll<int8_t>(Reducer::make(kI8, kAvg, 200), Fn::kPost, -128, 0, 0, "nranks > 127");
  expectAll<uint8_t>(Reducer::make(kU8, kAvg, 2), Fn::kPost, 254, 0, 127, "uint8");
  expectAll<int64_t>(Reducer::make(kI64, kAvg, 2), Fn::kPost, INT64_MIN, 0, INT64_MIN / 2,
                     "int64 min");
  expectAll<uint64_t>(Reducer::make(kU64, kAvg, 3), Fn::kPost, UINT64_MAX, 0, 0x5555555555555555ull,
                      "uint64 max");
}

TEST(ReduceCases, FloatAvgIsPreMulSumByRoundedReciprocal) {
  Reducer f = Reducer::make(kF32, kAvg, 3);
  EXPECT_EQ(f.kind, RedKind::kPreMulSum);
  EXPECT_TRUE(f.hasPre());
  EXPECT_FALSE(f.hasPost());
  EXPECT_EQ(f.scalarBits, 0x3eaaaaabu);  // float(1/3)
  expectAll<uint32_t>(f, Fn::kPre, bitsOf(3.0f), 0, bitsOf(1.0f), "3 * float(1/3)");
  double third = 1.0 / 3;
  uint64_t thirdBits;
  std::memcpy(&thirdBits, &third, 8);
  EXPECT_EQ(Reducer::make(kF64, kAvg, 3).scalarBits, thirdBits);
  EXPECT_EQ(Reducer::make(kF16, kAvg, 3).scalarBits, 0x3555u);
  EXPECT_EQ(Reducer::make(kBf16, kAvg, 3).scalarBits, 0x3eabu);
  EXPECT_EQ(Reducer::make(kE4m3, kAvg, 3).scalarBits, 0x2bu);  // 0.34375
  EXPECT_EQ(Reducer::make(kE5m2, kAvg, 3).scalarBits, 0x35u);  // 0.3125
  EXPECT_EQ(Reducer::make(kF16, kAvg, 1).scalarBits, 0x3c00u);
}

TEST(ReduceCases, PreMulSumRoundsTheProductBeforeTheSum) {
  uint16_t half = 0x3800;  // 0.5
  Reducer h = Reducer::preMulSum(kF16, &half);
  // Unfused: 2^-24 + round(2^-25) = 2^-24. A fused multiply-add would tie up to 2 * 2^-24.
  expectAll<uint16_t>(h, Fn::kReduce, 0x0001, 0x0001, 0x0001, "fp16");
  expectAll<uint16_t>(h, Fn::kReduce2, 0x0001, 0x0001, 0x0002, "reduce2 does not scale");
  float s = 1.0f + std::ldexp(1.0f, -12);
  Reducer f = Reducer::preMulSum(kF32, &s);
  // (1+2^-12)^2 = 1 + 2^-11 + 2^-24 rounds (tie, even) to 1 + 2^-11; minus 1 leaves 2^-11.
  // Fused, the result would be 2^-11 + 2^-24.
  expectAll<uint32_t>(f, Fn::kReduce, bitsOf(-1.0f), bitsOf(s), bitsOf(std::ldexp(1.0f, -11)),
                      "fp32 not contracted into an fma");
  int32_t three = 3;
  expectAll<int32_t>(Reducer::preMulSum(kI32, &three), Fn::kReduce, 1, 5, 16, "int32");
  uint8_t u200 = 200;
  expectAll<uint8_t>(Reducer::preMulSum(kU8, &u200), Fn::kPre, 2, 0, 144, "uint8 wraps");
  int8_t minus1 = -1;
  expectAll<int8_t>(Reducer::preMulSum(kI8, &minus1), Fn::kPre, -128, 0, -128, "int8 wraps");
  int64_t minus2 = -2;
  expectAll<int64_t>(Reducer::preMulSum(kI64, &minus2), Fn::kPre, INT64_MAX, 0, 2, "int64");
  uint8_t e4Half = 0x30;  // 0.5 in e4m3
  expectAll<uint8_t>(Reducer::preMulSum(kE4m3, &e4Half), Fn::kPre, 0x7e, 0, 0x76, "448/2");
}

// Every bit pattern of each narrow type through the vector loops' conversions (x * 1 and
// max(x, x) must give x back; NaN -> canonical NaN; e5m2 inf -> largest finite).
TEST(ReduceCases, VectorLoopsRoundTripEveryPattern) {
  struct Narrow {
    int dtype;
    const test::NarrowFormat* fmt;
  };
  for (Narrow t : {Narrow{kF16, &test::kHalfFmt}, Narrow{kBf16, &test::kBf16Fmt},
                   Narrow{kE4m3, &test::kE4m3Fmt}, Narrow{kE5m2, &test::kE5m2Fmt}}) {
    size_t count = size_t(1) << t.fmt->bits, size = size_t(t.fmt->bits / 8);
    std::vector<uint8_t> in(count * size), out(count * size);
    for (size_t c = 0; c < count; ++c) std::memcpy(&in[c * size], &c, size);
    uint64_t one = test::refEncode(*t.fmt, 1.0);
    for (int i = 0; i < kNumCpuIsas; ++i) {
      if (!cpuIsaSupported(CpuIsa(i))) continue;
      Reducer scale = Reducer::preMulSum(t.dtype, &one).withIsa(CpuIsa(i));
      Reducer max = Reducer::make(t.dtype, kMax, 2).withIsa(CpuIsa(i));
      for (int pass = 0; pass < 2; ++pass) {
        if (pass == 0) scale.pre(out.data(), in.data(), count);
        if (pass == 1) max.reduce2(out.data(), in.data(), in.data(), count);
        for (size_t c = 0; c < count; ++c) {
          double v = test::refDecode(*t.fmt, uint32_t(c));
          uint64_t want = test::refEncode(*t.fmt, v), got = 0;
          std::memcpy(&got, &out[c * size], size);
          ASSERT_EQ(got, want) << dtypeName(t.dtype) << " isa=" << cpuIsaName(CpuIsa(i))
                               << " pass=" << pass << " code 0x" << std::hex << c;
        }
      }
    }
  }
}

// The code a call throws (KernelError, numbered as ncclResult_t), 0 when it throws nothing.
template <typename Fn>
int thrownCode(Fn fn) {
  try {
    fn();
  } catch (const KernelError& e) {
    return int(e.code());
  }
  return 0;
}

TEST(ReduceCases, BadArgumentsAreRejected) {
  const int kBad = int(KernelErrc::kInvalidArgument);
  EXPECT_EQ(thrownCode([] { Reducer::make(12, kSum, 2); }), kBad);
  EXPECT_EQ(thrownCode([] { Reducer::make(-1, kSum, 2); }), kBad);
  EXPECT_EQ(thrownCode([] { Reducer::make(kF32, 5, 2); }), kBad);
  EXPECT_EQ(thrownCode([] { Reducer::make(kF32, kAvg, 0); }), kBad);
  EXPECT_EQ(thrownCode([] { Reducer::preMulSum(kF32, nullptr); }), kBad);
  EXPECT_EQ(thrownCode([] { Reducer::sumPostDiv(kF32, 0); }), kBad);
  EXPECT_EQ(thrownCode([] { dtypeSize(12); }), kBad);
  EXPECT_EQ(thrownCode([] { Reducer::make(kF32, kSum, 2); }), 0);
  for (int i = 0; i < kNumCpuIsas; ++i) {
    Reducer r = Reducer::make(kF32, kSum, 2);
    EXPECT_EQ(thrownCode([&] { r.withIsa(CpuIsa(i)); }),
              cpuIsaSupported(CpuIsa(i)) ? 0 : int(KernelErrc::kInvalidUsage))
        << cpuIsaName(CpuIsa(i));
  }
}

TEST(ReduceCases, TypeNamesAndSizes) {
  const char* names[] = {"int8", "uint8", "int32",  "uint32",   "int64",  "uint64",
                         "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
  size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  for (int d = 0; d < kNumDataTypes; ++d) {
    EXPECT_STREQ(dtypeName(d), names[d]);
    EXPECT_EQ(dtypeSize(d), sizes[d]);
  }
  EXPECT_STREQ(dtypeName(99), "unknown");
  EXPECT_TRUE(cpuIsaSupported(CpuIsa::kGeneric));
  EXPECT_TRUE(cpuIsaSupported(activeCpuIsa()));
}

}  // namespace
}  // namespace loom
