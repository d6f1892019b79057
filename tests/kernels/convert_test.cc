// Conversions of kernels/arith.h against the independent model in reference.h: every
// bit pattern of every narrow format, every rounding midpoint, and hand-checked cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/arith.h"
#include "kernels/reference.h"

namespace loom {
namespace {

using test::bitsOf;
using test::floatOf;
using test::NarrowFormat;
using test::refDecode;
using test::refEncode;

struct Codec {
  const char* name;
  NarrowFormat fmt;
  float (*decode)(uint32_t);
  uint32_t (*encode)(float);
};

const Codec kCodecs[] = {
    {"fp16", test::kHalfFmt, [](uint32_t c) { return halfToFloat(uint16_t(c)); },
     [](float f) { return uint32_t(floatToHalf(f)); }},
    {"bf16", test::kBf16Fmt, [](uint32_t c) { return bf16ToFloat(uint16_t(c)); },
     [](float f) { return uint32_t(floatToBf16(f)); }},
    {"e4m3", test::kE4m3Fmt, [](uint32_t c) { return fp8e4m3ToFloat(uint8_t(c)); },
     [](float f) { return uint32_t(floatToFp8e4m3(f)); }},
    {"e5m2", test::kE5m2Fmt, [](uint32_t c) { return fp8e5m2ToFloat(uint8_t(c)); },
     [](float f) { return uint32_t(floatToFp8e5m2(f)); }},
};

class ConvertTest : public ::testing::TestWithParam<int> {
 protected:
  const Codec& codec() const { return kCodecs[GetParam()]; }
};

// Every bit pattern decodes to the value its fields say, and encodes back to itself -- except
// NaNs (canonical code) and, for the saturating fp8 formats, e5m2's infinities (largest
// finite value, as __NV_SATFINITE makes them).
TEST_P(ConvertTest, EveryPatternDecodesAndRoundTrips) {
  const Codec& c = codec();
  uint32_t count = 1u << c.fmt.bits;
  uint32_t signBit = 1u << (c.fmt.bits - 1);
  for (uint32_t code = 0; code < count; ++code) {
    double want = refDecode(c.fmt, code);
    float got = c.decode(code);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << c.name << " code 0x" << std::hex << code;
      ASSERT_EQ(c.encode(got), c.fmt.nanCode) << c.name << " code 0x" << std::hex << code;
      continue;
    }
    ASSERT_EQ(double(got), want) << c.name << " code 0x" << std::hex << code;
    ASSERT_EQ(std::signbit(got), std::signbit(want)) << c.name << " code 0x" << std::hex << code;
    uint32_t back = c.encode(got);
    if (std::isinf(want) && c.fmt.satfinite) {
      ASSERT_EQ(back, (code & signBit) | test::refMaxFinite(c.fmt)) << c.name;
    } else {
      ASSERT_EQ(back, code) << c.name << " code 0x" << std::hex << code;
    }
  }
}

// Each midpoint between neighbouring codes (exact in fp32 for all these formats), and the
// floats either side of it, rounds as round-to-nearest-even says.
TEST_P(ConvertTest, MidpointsRoundToNearestEven) {
  const Codec& c = codec();
  uint32_t half = 1u << (c.fmt.bits - 1);
  for (uint32_t sign : {0u, half}) {
    for (uint32_t code = 0; code + 1 < half; ++code) {
      double lo = refDecode(c.fmt, code), hi = refDecode(c.fmt, code + 1);
      if (std::isnan(lo) || std::isnan(hi) || std::isinf(hi)) continue;
      float mid = float((lo + hi) / 2);
      ASSERT_EQ(double(mid), (lo + hi) / 2) << "midpoint not exact in fp32";
      for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        float s = sign ? -f : f;
        uint32_t want = refEncode(c.fmt, s);
        ASSERT_EQ(c.encode(s), want) << c.name << " value " << s;
      }
      uint32_t wantMid = (code & 1u) ? code + 1 : code;  // tie goes to the even code
      ASSERT_EQ(c.encode(mid), wantMid) << c.name << " midpoint " << mid;
    }
  }
}

// A sweep over fp32 bit patterns: normals, subnormals, huge values, infinities, NaNs.
TEST_P(ConvertTest, Fp32SweepMatchesReference) {
  const Codec& c = codec();
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4093) {
    float f = floatOf(uint32_t(u));
    ASSERT_EQ(c.encode(f), refEncode(c.fmt, f)) << c.name << " bits 0x" << std::hex << u;
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (int i = 0; i < 200000; ++i) {
    float f = std::ldexp(dist(rng), int(rng() % 60) - 40);
    ASSERT_EQ(c.encode(f), refEncode(c.fmt, f)) << c.name << " value " << f;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, ConvertTest, ::testing::Range(0, 4),
                         [](const auto& info) { return std::string(kCodecs[info.param].name); });

// Values checked by hand against the format definitions and CUDA's documented behaviour.
TEST(ConvertCases, Fp16) {
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65519.99f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);  // the tie above the largest finite goes to inf
  EXPECT_EQ(floatToHalf(-1e30f), 0xfc00);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(floatToHalf(std::ldexp(1.5f, -24)), 0x0002);  // tie -> even (two)
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);  // up to normal
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);                   // tie -> even
  EXPECT_EQ(floatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::quiet_NaN()), 0x7fff);
  EXPECT_EQ(floatToHalf(-std::numeric_limits<float>::quiet_NaN()), 0x7fff);
  EXPECT_EQ(halfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(halfToFloat(0xfbff), -65504.0f);
  EXPECT_TRUE(std::isinf(halfToFloat(0x7c00)));
}

TEST(ConvertCases, Bf16) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(floatOf(0x3f808000)), 0x3f80);  // tie -> even
  EXPECT_EQ(floatToBf16(floatOf(0x3f818000)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(floatToBf16(floatOf(0x3f808001)), 0x3f81);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_EQ(floatToBf16(floatOf(0x00000001)), 0x0000);                // fp32 subnormals round too
  EXPECT_EQ(floatToBf16(floatOf(0x00008000)), 0x0000);
  EXPECT_EQ(floatToBf16(floatOf(0x00018000)), 0x0002);
  EXPECT_EQ(floatToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(floatToBf16(floatOf(0xffc00001)), 0x7fff);
}

TEST(ConvertCases, Fp8E4m3SaturatesAndHasNoInf) {
  EXPECT_EQ(floatToFp8e4m3(1.0f), 0x38);
  EXPECT_EQ(floatToFp8e4m3(448.0f), 0x7e);
  EXPECT_EQ(floatToFp8e4m3(464.0f), 0x7e);  // tie between 448 and (NaN code) -> 448
  EXPECT_EQ(floatToFp8e4m3(500.0f), 0x7e);
  EXPECT_EQ(floatToFp8e4m3(1e30f), 0x7e);
  EXPECT_EQ(floatToFp8e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(floatToFp8e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(floatToFp8e4m3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(floatToFp8e4m3(std::ldexp(1.0f, -10)), 0x00);   // tie -> even (zero)
  EXPECT_EQ(floatToFp8e4m3(-std::ldexp(3.0f, -10)), 0x82);  // tie -> even (two), sign kept
  EXPECT_TRUE(std::isnan(fp8e4m3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(fp8e4m3ToFloat(0xff)));
  EXPECT_EQ(fp8e4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3ToFloat(0x78), 256.0f);  // exponent 15 is a normal binade in e4m3
}

TEST(ConvertCases, Fp8E5m2SaturatesInsteadOfOverflowing) {
  EXPECT_EQ(floatToFp8e5m2(1.0f), 0x3c);
  EXPECT_EQ(floatToFp8e5m2(57344.0f), 0x7b);
  EXPECT_EQ(floatToFp8e5m2(61440.0f), 0x7b);
  EXPECT_EQ(floatToFp8e5m2(1e9f), 0x7b);
  EXPECT_EQ(floatToFp8e5m2(std::numeric_limits<float>::infinity()), 0x7b);
  EXPECT_EQ(floatToFp8e5m2(-std::numeric_limits<float>::infinity()), 0xfb);
  EXPECT_EQ(floatToFp8e5m2(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(floatToFp8e5m2(std::ldexp(1.0f, -16)), 0x01);
  EXPECT_EQ(floatToFp8e5m2(std::ldexp(1.0f, -17)), 0x00);
  EXPECT_TRUE(std::isinf(fp8e5m2ToFloat(0x7c)));
  EXPECT_TRUE(std::isnan(fp8e5m2ToFloat(0x7d)));
}

}  // namespace
}  // namespace loom
