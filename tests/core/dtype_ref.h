// Test-side knowledge of NCCL's data types, written independently of kernels/: element
// sizes, decoding every storage format to double, and encoding values that the format
// represents exactly (by table lookup over all codes, so no rounding logic is shared with
// the code under test).
#pragma once

#include <nccl.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

namespace loomtest {

constexpr ncclDataType_t kAllTypes[] = {ncclInt8,    ncclUint8,   ncclInt32,    ncclUint32,
                                        ncclInt64,   ncclUint64,  ncclFloat16,  ncclFloat32,
                                        ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
constexpr ncclRedOp_t kAllOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

inline const char* typeName(ncclDataType_t t) {
  static const char* kNames[] = {"int8",    "uint8",   "int32",   "uint32",  "int64",     "uint64",
                                 "float16", "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
  return t >= 0 && t < ncclNumTypes ? kNames[t] : "?";
}
inline const char* opName(ncclRedOp_t op) {
  static const char* kNames[] = {"sum", "prod", "max", "min", "avg"};
  return op >= 0 && op < ncclNumOps ? kNames[op] : "?";
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
inline bool isUnsigned(ncclDataType_t t) {
  return t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
}
// Explicit mantissa bits (floats): sets the unit roundoff 2^-(bits+1).
inline int mantissaBits(ncclDataType_t t) {
  switch (t) {
    case ncclFloat16: return 10;
    case ncclBfloat16: return 7;
    case ncclFloat8e4m3: return 3;
    case ncclFloat8e5m2: return 2;
    case ncclFloat32: return 23;
    default: return 52;
  }
}

// IEEE-like small float: 1 sign bit, `e` exponent bits, `m` mantissa bits.
inline double decodeSmallFloat(uint32_t bits, int e, int m, bool e4m3) {
  int sign = (bits >> (e + m)) & 1;
  uint32_t exp = (bits >> m) & ((1u << e) - 1);
  uint32_t man = bits & ((1u << m) - 1);
  int bias = (1 << (e - 1)) - 1;
  double v;
  if (e4m3 && exp == 15 && man == 7) return NAN;
  if (!e4m3 && exp == (1u << e) - 1) {
    v = man ? NAN : INFINITY;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(man), 1 - bias - m);
  } else {
    v = std::ldexp(static_cast<double>(man | (1u << m)), static_cast<int>(exp) - bias - m);
  }
  return sign ? -v : v;
}

// The element at p as a double (integers exactly up to 2^53).
inline double decode(ncclDataType_t t, const void* p) {
  switch (t) {
    case ncclInt8: { int8_t v; memcpy(&v, p, 1); return v; }
    case ncclUint8: { uint8_t v; memcpy(&v, p, 1); return v; }
    case ncclInt32: { int32_t v; memcpy(&v, p, 4); return v; }
    case ncclUint32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case ncclInt64: { int64_t v; memcpy(&v, p, 8); return static_cast<double>(v); }
    case ncclUint64: { uint64_t v; memcpy(&v, p, 8); return static_cast<double>(v); }
    case ncclFloat32: { float v; memcpy(&v, p, 4); return v; }
    case ncclFloat64: { double v; memcpy(&v, p, 8); return v; }
    case ncclFloat16: { uint16_t b; memcpy(&b, p, 2); return decodeSmallFloat(b, 5, 10, false); }
    case ncclBfloat16: {
      uint16_t b;
      memcpy(&b, p, 2);
      uint32_t u = static_cast<uint32_t>(b) << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case ncclFloat8e4m3: { uint8_t b; memcpy(&b, p, 1); return decodeSmallFloat(b, 4, 3, true); }
    case ncclFloat8e5m2: { uint8_t b; memcpy(&b, p, 1); return decodeSmallFloat(b, 5, 2, false); }
    default: throw std::invalid_argument("decode: bad type");
  }
}

// Writes v, which the type must represent exactly (throws otherwise). Integers wrap.
inline void encode(ncclDataType_t t, double v, void* p) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclInt32: case ncclUint32: case ncclInt64:
    case ncclUint64: {
      uint64_t u = static_cast<uint64_t>(static_cast<int64_t>(v));
      memcpy(p, &u, typeSize(t));  // little-endian: low bytes
      return;
    }
    case ncclFloat32: { float f = static_cast<float>(v); memcpy(p, &f, 4); return; }
    case ncclFloat64: memcpy(p, &v, 8); return;
    default: break;
  }
  // Small formats: all codes decoded once; positive zero wins over negative zero.
  static std::map<int, std::map<double, uint32_t>> tables;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto& table = tables[t];
  size_t bytes = typeSize(t);
  if (table.empty()) {
    uint32_t codes = 1u << (8 * bytes);
    for (uint32_t c = codes; c-- > 0;) {
      uint8_t buf[8] = {static_cast<uint8_t>(c), static_cast<uint8_t>(c >> 8)};  // decode reads no more than the type
      double d = decode(t, buf);
      if (!std::isnan(d)) table[d] = c;  // descending: code 0 (+0) is written last
    }
  }
  auto it = table.find(v);
  if (it == table.end())
    throw std::invalid_argument(std::string("encode: ") + typeName(t) + " cannot hold " +
                                std::to_string(v) + " exactly");
  uint8_t buf[2] = {static_cast<uint8_t>(it->second), static_cast<uint8_t>(it->second >> 8)};
  memcpy(p, buf, bytes);
}

}  // namespace loomtest
