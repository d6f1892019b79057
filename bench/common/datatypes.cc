#include "bench/common/datatypes.h"

#include <limits>

namespace loom::bench {

const std::vector<TypeInfo>& allTypes() {
  static const std::vector<TypeInfo> kTypes = {
      {"int8", ncclInt8, 1, TypeKind::kSigned, 127, 6, 0},
      {"uint8", ncclUint8, 1, TypeKind::kUnsigned, 255, 7, 0},
      {"int32", ncclInt32, 4, TypeKind::kSigned, 2147483647.0, 30, 0},
      {"uint32", ncclUint32, 4, TypeKind::kUnsigned, 4294967295.0, 31, 0},
      // 64-bit integers are checked through doubles: stay within 2^53.
      {"int64", ncclInt64, 8, TypeKind::kSigned, 9007199254740992.0, 52, 0},
      {"uint64", ncclUint64, 8, TypeKind::kUnsigned, 9007199254740992.0, 52, 0},
      {"half", ncclFloat16, 2, TypeKind::kFloat, 2048, 15, 0x1p-11},
      {"float", ncclFloat32, 4, TypeKind::kFloat, 16777216.0, 127, 0x1p-24},
      {"double", ncclFloat64, 8, TypeKind::kFloat, 9007199254740992.0, 1023, 0x1p-53},
      {"bfloat16", ncclBfloat16, 2, TypeKind::kFloat, 256, 127, 0x1p-8},
      {"f8e4m3", ncclFloat8e4m3, 1, TypeKind::kFloat, 16, 8, 0x1p-4},
      {"f8e5m2", ncclFloat8e5m2, 1, TypeKind::kFloat, 8, 15, 0x1p-3},
  };
  return kTypes;
}

std::vector<const TypeInfo*> sweepTypes() {
  std::vector<const TypeInfo*> out;
  for (const TypeInfo& t : allTypes())
    if (t.type != ncclFloat8e4m3 && t.type != ncclFloat8e5m2) out.push_back(&t);
  return out;
}

const TypeInfo* findType(const std::string& name) {
  for (const TypeInfo& t : allTypes())
    if (name == t.name) return &t;
  return nullptr;
}

const TypeInfo& typeInfo(ncclDataType_t type) {
  for (const TypeInfo& t : allTypes())
    if (t.type == type) return t;
  return allTypes()[7];
}

const std::vector<OpInfo>& allOps() {
  static const std::vector<OpInfo> kOps = {
      {"sum", ncclSum, false}, {"prod", ncclProd, false}, {"max", ncclMax, false},
      {"min", ncclMin, false}, {"avg", ncclAvg, false},   {"mulsum", ncclNumOps, true},
  };
  return kOps;
}

const OpInfo* findOp(const std::string& name) {
  for (const OpInfo& o : allOps())
    if (name == o.name) return &o;
  return nullptr;
}

const OpInfo& noOp() {
  static const OpInfo kNone{"none", ncclSum, false};
  return kNone;
}

uint32_t encodeMini(const MiniFloat& f, double v) {
  const int bias = (1 << (f.expBits - 1)) - 1;
  const int maxExpField = (1 << f.expBits) - 1;
  const uint32_t signBit = 1u << (f.expBits + f.mantBits);
  const uint32_t mantOne = 1u << f.mantBits;
  if (std::isnan(v))
    return f.ieee ? (uint32_t(maxExpField) << f.mantBits) | (mantOne >> 1)
                  : (uint32_t(maxExpField) << f.mantBits) | (mantOne - 1);
  uint32_t sign = std::signbit(v) ? signBit : 0;
  double a = std::fabs(v);
  // Largest finite: IEEE-like formats reserve the top exponent; e4m3 only its top mantissa.
  const int maxNormalField = f.ieee ? maxExpField - 1 : maxExpField;
  const uint32_t maxMant = f.ieee ? mantOne - 1 : mantOne - 2;
  const double maxFinite = std::ldexp(1.0 + double(maxMant) / mantOne, maxNormalField - bias);
  if (std::isinf(a) || a > maxFinite) {
    // Values are rounded first; only those beyond the rounding midpoint overflow.
    double half = std::ldexp(0.5, maxNormalField - bias - f.mantBits);
    if (!std::isinf(a) && a < maxFinite + half)
      return sign | (uint32_t(maxNormalField) << f.mantBits) | maxMant;
    return f.ieee ? sign | (uint32_t(maxExpField) << f.mantBits)
                  : sign | (uint32_t(maxExpField) << f.mantBits) | (mantOne - 1);
  }
  if (a == 0) return sign;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exponent = e - 1;
  if (exponent < 1 - bias) {
    // Subnormal: quantum 2^(1-bias-mantBits). A carry into bit mantBits lands in the
    // exponent field, giving the smallest normal number, which is right.
    double q = std::nearbyint(std::ldexp(a, -(1 - bias - f.mantBits)));
    return sign | static_cast<uint32_t>(q);
  }
  double q = std::nearbyint(std::ldexp(a, -(exponent - f.mantBits)));  // in [2^m, 2^(m+1)]
  if (q >= 2.0 * mantOne) {
    q /= 2;
    ++exponent;
  }
  if (exponent + bias > maxNormalField)
    return f.ieee ? sign | (uint32_t(maxExpField) << f.mantBits)
                  : sign | (uint32_t(maxNormalField) << f.mantBits) | maxMant;
  uint32_t mant = static_cast<uint32_t>(q) - mantOne;
  if (!f.ieee && exponent + bias == maxExpField && mant > maxMant) mant = maxMant;
  return sign | (uint32_t(exponent + bias) << f.mantBits) | mant;
}

double decodeMini(const MiniFloat& f, uint32_t bits) {
  const int bias = (1 << (f.expBits - 1)) - 1;
  const int maxExpField = (1 << f.expBits) - 1;
  const uint32_t mantOne = 1u << f.mantBits;
  bool negative = (bits >> (f.expBits + f.mantBits)) & 1u;
  int expField = static_cast<int>((bits >> f.mantBits) & uint32_t(maxExpField));
  uint32_t mant = bits & (mantOne - 1);
  double v;
  if (expField == 0) {
    v = std::ldexp(double(mant), 1 - bias - f.mantBits);
  } else if (f.ieee && expField == maxExpField) {
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (!f.ieee && expField == maxExpField && mant == mantOne - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(1.0 + double(mant) / mantOne, expField - bias);
  }
  return negative ? -v : v;
}

double loadValue(ncclDataType_t type, const void* base, size_t i) {
  return withCodec(type, [&](auto codec) { return decltype(codec)::load(base, i); });
}

void storeValue(ncclDataType_t type, void* base, size_t i, double v) {
  withCodec(type, [&](auto codec) { decltype(codec)::store(base, i, v); });
}

}  // namespace loom::bench
