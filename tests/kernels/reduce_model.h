// Element-wise model of every (data type, op) for the reduce tests, on raw element bits,
// built on reference.h. Independent of kernels/: integers by explicit 64-bit masking,
// fp32/fp64 by native arithmetic, narrow floats through double.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "kernels/reference.h"

namespace loom::test {

enum class Family { kInt, kFp32, kFp64, kNarrow };

struct TypeModel {
  int dtype;
  const char* name;
  size_t size;
  Family family;
  bool isSigned;
  const NarrowFormat* fmt;

  uint64_t mask() const { return size == 8 ? ~0ull : (1ull << (8 * size)) - 1; }
  int64_t signExtend(uint64_t x) const {
    int shift = 64 - int(8 * size);
    return int64_t(x << shift) >> shift;
  }
  bool isNan(uint64_t x) const {
    switch (family) {
      case Family::kFp32:
        return std::isnan(floatOf(uint32_t(x)));
      case Family::kFp64: {
        double d;
        std::memcpy(&d, &x, 8);
        return std::isnan(d);
      }
      case Family::kNarrow:
        return std::isnan(refDecode(*fmt, uint32_t(x)));
      default:
        return false;
    }
  }
  double toDouble(uint64_t x) const {
    switch (family) {
      case Family::kFp32:
        return floatOf(uint32_t(x));
      case Family::kFp64: {
        double d;
        std::memcpy(&d, &x, 8);
        return d;
      }
      case Family::kNarrow:
        return refDecode(*fmt, uint32_t(x));
      default:
        return isSigned ? double(signExtend(x)) : double(x);
    }
  }
  // A float value as one element of this (float) type, rounded the way NCCL rounds its Avg
  // factor: through fp32, except for fp64.
  uint64_t fromDouble(double v) const {
    switch (family) {
      case Family::kFp32:
        return bitsOf(float(v));
      case Family::kFp64: {
        uint64_t u;
        std::memcpy(&u, &v, 8);
        return u;
      }
      default:
        return refEncode(*fmt, double(float(v)));
    }
  }
};

inline const TypeModel kTypes[12] = {
    {0, "int8", 1, Family::kInt, true, nullptr},
    {1, "uint8", 1, Family::kInt, false, nullptr},
    {2, "int32", 4, Family::kInt, true, nullptr},
    {3, "uint32", 4, Family::kInt, false, nullptr},
    {4, "int64", 8, Family::kInt, true, nullptr},
    {5, "uint64", 8, Family::kInt, false, nullptr},
    {6, "half", 2, Family::kNarrow, true, &kHalfFmt},
    {7, "float", 4, Family::kFp32, true, nullptr},
    {8, "double", 8, Family::kFp64, true, nullptr},
    {9, "bfloat16", 2, Family::kNarrow, true, &kBf16Fmt},
    {10, "f8e4m3", 1, Family::kNarrow, true, &kE4m3Fmt},
    {11, "f8e5m2", 1, Family::kNarrow, true, &kE5m2Fmt},
};

enum class ModelOp { kSum, kProd, kMax, kMin };

// a OP b for one element; op is sum, prod, max or min.
inline uint64_t modelBinary(const TypeModel& t, ModelOp op, uint64_t a, uint64_t b) {
  bool isMax = op == ModelOp::kMax;
  switch (t.family) {
    case Family::kInt:
      switch (op) {
        case ModelOp::kSum:
          return (a + b) & t.mask();
        case ModelOp::kProd:
          return (a * b) & t.mask();
        default: {
          bool aBigger = t.isSigned ? t.signExtend(a) > t.signExtend(b) : a > b;
          return (aBigger == isMax) ? a : b;
        }
      }
    case Family::kFp32: {
      float x = floatOf(uint32_t(a)), y = floatOf(uint32_t(b));
      float r = op == ModelOp::kSum ? x + y : op == ModelOp::kProd ? x * y : refMax(x, y, isMax);
      return bitsOf(r);
    }
    case Family::kFp64: {
      double x = t.toDouble(a), y = t.toDouble(b);
      double r = op == ModelOp::kSum ? x + y : op == ModelOp::kProd ? x * y : refMax(x, y, isMax);
      uint64_t u;
      std::memcpy(&u, &r, 8);
      return u;
    }
    case Family::kNarrow: {
      double x = t.toDouble(a), y = t.toDouble(b);
      double r = op == ModelOp::kSum ? x + y : op == ModelOp::kProd ? x * y : refMax(x, y, isMax);
      return refEncode(*t.fmt, r);
    }
  }
  return 0;
}

// x * scalar rounded to the type (PreMulSum's pre-op, float Avg's post-op).
inline uint64_t modelScale(const TypeModel& t, uint64_t x, uint64_t scalar) {
  return modelBinary(t, ModelOp::kProd, x, scalar & t.mask());
}

// Integer Avg's post-op: truncating division of the (wrapped) value.
inline uint64_t modelDiv(const TypeModel& t, uint64_t x, int n) {
  if (t.isSigned) return uint64_t(t.signExtend(x) / int64_t(n)) & t.mask();
  return (x / uint64_t(n)) & t.mask();
}

// Random elements that exercise each type: integers over their whole range (so sums and
// products wrap), floats mostly of comparable magnitude (so rounding ties occur), plus
// a share of arbitrary bit patterns (NaN, inf, subnormals, extremes).
inline uint64_t randomElement(const TypeModel& t, std::mt19937_64& rng) {
  uint64_t r = rng();
  if (t.family == Family::kInt) return r & t.mask();
  bool raw = (r >> 60) == 0;  // 1 in 16
  if (raw) return rng() & t.mask();
  double mag;
  if ((r >> 59) & 1) {  // a full-precision value
    mag = std::ldexp(double(rng() >> 11), -53 + int(rng() % 13) - 6) * ((r & 1) ? -1 : 1);
  } else {  // few significant bits: sums land on ties in narrow types
    mag = std::ldexp(double(int64_t(rng() % 2001) - 1000), int(rng() % 9) - 10);
  }
  switch (t.family) {
    case Family::kFp32:
      return bitsOf(float(mag));
    case Family::kFp64: {
      uint64_t u;
      std::memcpy(&u, &mag, 8);
      return u;
    }
    default:
      return refEncode(*t.fmt, mag);
  }
}

// Equal bits, or both NaN for fp32/fp64 (whose NaN payloads are the hardware's).
inline bool sameResult(const TypeModel& t, uint64_t got, uint64_t want) {
  if (got == want) return true;
  if (t.family == Family::kFp32 || t.family == Family::kFp64) return t.isNan(got) && t.isNan(want);
  return false;
}

}  // namespace loom::test
