// The collectives matrix's own knowledge of NCCL's 12 data types, written from the formats'
// definitions and independent of kernels/ (and of tests/core): sizes, names, decoding any
// element to a double, and encoding a value the format holds exactly (no rounding: a
// value that is not representable is a bug in the test and throws).
#pragma once

#include <nccl.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace colltest {

constexpr ncclDataType_t kTypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                     ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                     ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};

inline const char* typeName(ncclDataType_t t) {
  static const char* const kNames[] = {"int8",    "uint8",   "int32",   "uint32",
                                       "int64",   "uint64",  "float16", "float32",
                                       "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
  return t >= 0 && t < ncclNumTypes ? kNames[t] : "?";
}

inline size_t typeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

inline bool isFloat(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 ||
         t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}
inline bool isSignedInt(ncclDataType_t t) {
  return t == ncclInt8 || t == ncclInt32 || t == ncclInt64;
}

// Floating formats: 1 sign bit, `exp` exponent bits, `man` stored mantissa bits.
struct FloatFormat {
  int exp;
  int man;
  bool finiteOnly;  // e4m3 ("fn"): no infinities; only S.1111.111 is NaN
};
inline FloatFormat floatFormat(ncclDataType_t t) {
  switch (t) {
    case ncclFloat16: return {5, 10, false};
    case ncclBfloat16: return {8, 7, false};
    case ncclFloat32: return {8, 23, false};
    case ncclFloat64: return {11, 52, false};
    case ncclFloat8e4m3: return {4, 3, true};
    case ncclFloat8e5m2: return {5, 2, false};
    default: throw std::invalid_argument("floatFormat: not a floating type");
  }
}

// Unit roundoff of a floating type: half an ulp of 1.
inline double unitRoundoff(ncclDataType_t t) { return std::ldexp(1.0, -floatFormat(t).man - 1); }
// Every integer of magnitude up to this is exactly representable.
inline double exactIntLimit(ncclDataType_t t) { return std::ldexp(1.0, floatFormat(t).man + 1); }

inline uint64_t widthMask(ncclDataType_t t) {
  size_t bytes = typeSize(t);
  return bytes == 8 ? ~0ull : (1ull << (8 * bytes)) - 1;
}

// Integer bits of width typeSize(t) as a signed value (sign-extended) or unsigned value.
inline int64_t signExtend(ncclDataType_t t, uint64_t bits) {
  int shift = 64 - 8 * static_cast<int>(typeSize(t));
  return static_cast<int64_t>(bits << shift) >> shift;
}

// Little-endian element access.
inline uint64_t loadBits(const void* p, size_t bytes) {
  switch (bytes) {  // fixed sizes, so that the copies compile to single moves
    case 1: { uint8_t v; memcpy(&v, p, 1); return v; }
    case 2: { uint16_t v; memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; memcpy(&v, p, 4); return v; }
    case 8: { uint64_t v; memcpy(&v, p, 8); return v; }
    default: { uint64_t v = 0; memcpy(&v, p, bytes); return v; }
  }
}
inline void storeBits(void* p, size_t bytes, uint64_t v) {
  switch (bytes) {
    case 1: { uint8_t x = static_cast<uint8_t>(v); memcpy(p, &x, 1); return; }
    case 2: { uint16_t x = static_cast<uint16_t>(v); memcpy(p, &x, 2); return; }
    case 4: { uint32_t x = static_cast<uint32_t>(v); memcpy(p, &x, 4); return; }
    default: memcpy(p, &v, bytes); return;
  }
}

// Decodes a floating element from its bits, straight from the format definition.
inline double decodeFloatSlow(ncclDataType_t t, uint64_t bits) {
  if (t == ncclFloat32) {
    float f;
    uint32_t u = static_cast<uint32_t>(bits);
    memcpy(&f, &u, 4);
    return f;
  }
  if (t == ncclFloat64) {
    double d;
    memcpy(&d, &bits, 8);
    return d;
  }
  FloatFormat f = floatFormat(t);
  int width = 1 + f.exp + f.man;
  bool neg = (bits >> (width - 1)) & 1;
  uint64_t e = (bits >> f.man) & ((1ull << f.exp) - 1);
  uint64_t m = bits & ((1ull << f.man) - 1);
  uint64_t eMax = (1ull << f.exp) - 1;
  int bias = (1 << (f.exp - 1)) - 1;
  double v;
  if (f.finiteOnly && e == eMax && m == (1ull << f.man) - 1) return NAN;
  if (!f.finiteOnly && e == eMax) {
    v = m ? NAN : INFINITY;
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - f.man);
  } else {
    v = std::ldexp(static_cast<double>(m | (1ull << f.man)), static_cast<int>(e) - bias - f.man);
  }
  return neg ? -v : v;
}

inline std::invalid_argument notExact(ncclDataType_t t, double v) {
  return std::invalid_argument(std::string(typeName(t)) + " cannot hold " + std::to_string(v) +
                               " exactly");
}

// The bits of `v` in floating type t. `v` must be finite and exactly representable.
inline uint64_t encodeFloatExact(ncclDataType_t t, double v) {
  if (t == ncclFloat32) {
    float f = static_cast<float>(v);
    if (static_cast<double>(f) != v) throw notExact(t, v);
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
  }
  if (t == ncclFloat64) {
    uint64_t u;
    memcpy(&u, &v, 8);
    return u;
  }
  FloatFormat f = floatFormat(t);
  uint64_t sign = std::signbit(v) ? 1ull << (f.exp + f.man) : 0;
  double a = std::fabs(v);
  if (a == 0) return sign;
  int bias = (1 << (f.exp - 1)) - 1;
  int e2;
  std::frexp(a, &e2);          // a = m * 2^e2, m in [0.5, 1)
  int biased = e2 - 1 + bias;  // exponent field of a normal number
  uint64_t field, man;
  if (biased >= 1) {
    double scaled = std::ldexp(a, f.man - (e2 - 1));  // in [2^man, 2^(man+1))
    man = static_cast<uint64_t>(scaled) - (1ull << f.man);
    field = static_cast<uint64_t>(biased);
    if (std::ldexp(static_cast<double>(man + (1ull << f.man)), e2 - 1 - f.man) != a)
      throw notExact(t, v);
  } else {
    double scaled = std::ldexp(a, f.man - (1 - bias));
    man = static_cast<uint64_t>(scaled);
    field = 0;
    if (static_cast<double>(man) != scaled)
      throw notExact(t, v);
  }
  uint64_t bits = sign | (field << f.man) | man;
  double back = decodeFloatSlow(t, bits);
  if (back != v) throw notExact(t, v);
  return bits;
}

// Fast decoding: table lookup for the 1- and 2-byte formats.
class FloatDecoder {
 public:
  explicit FloatDecoder(ncclDataType_t t) : t_(t), table_(tableFor(t)) {}
  double operator()(uint64_t bits) const {
    return table_ ? (*table_)[bits] : decodeFloatSlow(t_, bits);
  }

 private:
  // One table per 1- and 2-byte float format, made on first use and shared by every
  // decoder (the matrices make one per case and rank).
  static const std::vector<double>* tableFor(ncclDataType_t t) {
    if (!isFloat(t) || typeSize(t) > 2) return nullptr;
    auto make = [](ncclDataType_t f) {
      std::vector<double> v(size_t{1} << (8 * typeSize(f)));
      for (size_t c = 0; c < v.size(); ++c) v[c] = decodeFloatSlow(f, c);
      return v;
    };
    static const std::vector<double> kF16 = make(ncclFloat16), kBf16 = make(ncclBfloat16),
                                     kE4m3 = make(ncclFloat8e4m3), kE5m2 = make(ncclFloat8e5m2);
    switch (t) {
      case ncclFloat16: return &kF16;
      case ncclBfloat16: return &kBf16;
      case ncclFloat8e4m3: return &kE4m3;
      default: return &kE5m2;
    }
  }

  ncclDataType_t t_;
  const std::vector<double>* table_;
};

}  // namespace colltest
