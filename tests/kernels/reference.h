// An independent model of NCCL's reduction numerics for the kernels tests: narrow float
// formats are decoded to double from their bit fields, combined in double, and encoded
// back with a textbook round-to-nearest-even (frexp / ldexp / nearbyint). Nothing here
// calls the code under test.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace loom::test {

struct NarrowFormat {
  int bits;  // 16 or 8
  int mant;  // mantissa bits
  int bias;
  bool e4m3;         // no infinities; all-ones exponent and mantissa is NaN
  bool satfinite;    // out-of-range (and inf) -> largest finite, as CUDA's __NV_SATFINITE
  uint32_t nanCode;  // what a NaN result is encoded as
};

constexpr NarrowFormat kHalfFmt{16, 10, 15, false, false, 0x7fff};
constexpr NarrowFormat kBf16Fmt{16, 7, 127, false, false, 0x7fff};
constexpr NarrowFormat kE4m3Fmt{8, 3, 7, true, true, 0x7f};
constexpr NarrowFormat kE5m2Fmt{8, 2, 15, false, true, 0x7f};

inline int expBits(const NarrowFormat& f) { return f.bits - 1 - f.mant; }

inline double refDecode(const NarrowFormat& f, uint32_t code) {
  uint32_t sign = (code >> (f.bits - 1)) & 1u;
  uint32_t expMax = (1u << expBits(f)) - 1u;
  uint32_t e = (code >> f.mant) & expMax;
  uint32_t m = code & ((1u << f.mant) - 1u);
  double v;
  if (f.e4m3 && e == expMax && m == (1u << f.mant) - 1u) {
    v = NAN;
  } else if (!f.e4m3 && e == expMax) {
    v = m ? NAN : INFINITY;
  } else if (e == 0) {
    v = std::ldexp(double(m), 1 - f.bias - f.mant);
  } else {
    v = std::ldexp(double(m + (1u << f.mant)), int(e) - f.bias - f.mant);
  }
  return sign ? -v : v;
}

// The largest finite code (positive).
inline uint32_t refMaxFinite(const NarrowFormat& f) {
  uint32_t expMax = (1u << expBits(f)) - 1u;
  if (f.e4m3) return (expMax << f.mant) | ((1u << f.mant) - 2u);
  return ((expMax - 1u) << f.mant) | ((1u << f.mant) - 1u);
}

inline uint32_t refEncode(const NarrowFormat& f, double v) {
  if (std::isnan(v)) return f.nanCode;
  uint32_t sign = std::signbit(v) ? (1u << (f.bits - 1)) : 0u;
  double a = std::fabs(v);
  uint32_t inf = ((1u << expBits(f)) - 1u) << f.mant;
  uint32_t overflow = f.satfinite ? refMaxFinite(f) : inf;
  if (std::isinf(a)) return sign | overflow;
  if (a == 0) return sign;
  int e2;
  std::frexp(a, &e2);  // a = m * 2^e2, m in [0.5, 1)
  int exponent = e2 - 1;
  int emin = 1 - f.bias;
  if (exponent < emin) exponent = emin;
  double q = std::nearbyint(std::ldexp(a, f.mant - exponent));  // default mode: ties to even
  double full = std::ldexp(1.0, f.mant + 1);
  if (q >= full) {
    q /= 2;
    exponent += 1;
  }
  uint64_t code;
  uint64_t iq = uint64_t(q);
  if (iq < (1u << f.mant)) {
    code = iq;  // subnormal (or zero)
  } else {
    code = (uint64_t(exponent + f.bias) << f.mant) | (iq - (1u << f.mant));
  }
  if (code > refMaxFinite(f)) return sign | overflow;
  return sign | uint32_t(code);
}

// IEEE maximumNumber / minimumNumber with -0 < +0 (what NCCL's fmaxf/__hmax give).
template <typename F>
F refMax(F a, F b, bool isMax) {
  if (std::isnan(a) && std::isnan(b)) return a;
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  if (a == 0 && b == 0) {
    bool pick = isMax ? !std::signbit(a) : std::signbit(a);
    return pick ? a : b;
  }
  return isMax ? (a > b ? a : b) : (a < b ? a : b);
}

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace loom::test
