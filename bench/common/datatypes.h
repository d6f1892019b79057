// The data types and reduction operators nccl-tests knows, under nccl-tests' names, and
// host-side codecs that turn a double into each type's bits and back (half, bfloat16 and
// the fp8 formats included) so the tools can fill and check buffers without a GPU.
#pragma once

#include <nccl.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace loom::bench {

enum class TypeKind { kSigned, kUnsigned, kFloat };

struct TypeInfo {
  const char* name;  // nccl-tests' spelling ("int8", "half", "float", "f8e4m3", ...)
  ncclDataType_t type;
  size_t size;
  TypeKind kind;
  // Every integer of magnitude <= exactLimit is representable, so sums that stay within it
  // are exact whatever order the library reduces in.
  double exactLimit;
  // The largest k such that +-2^k is representable (products of 2s stay exact up to it).
  int maxPow2;
  double epsilon;  // unit roundoff; 0 for integer types
};

// nccl-tests' -o names, in its order; "mulsum" is ncclRedOpCreatePreMulSum.
struct OpInfo {
  const char* name;
  ncclRedOp_t op;  // ncclNumOps stands for mulsum
  bool preMulSum;
};

const std::vector<TypeInfo>& allTypes();  // every type, fp8 included
// The list "-d all" runs: nccl-tests drops fp8 below sm_90, and host memory has no sm.
std::vector<const TypeInfo*> sweepTypes();
const TypeInfo* findType(const std::string& name);  // nullptr when unknown
const TypeInfo& typeInfo(ncclDataType_t type);

const std::vector<OpInfo>& allOps();
const OpInfo* findOp(const std::string& name);  // nullptr when unknown
// The operator of the non-reducing collectives: printed as "none" (or the -o name for
// sendrecv, as nccl-tests does).
const OpInfo& noOp();

// ---- codecs: minifloats with round-to-nearest-even ----
struct MiniFloat {
  int expBits;
  int mantBits;
  bool ieee;  // exponent all-ones means inf/NaN; false for e4m3 (only S.1111.111 is NaN)
};
inline constexpr MiniFloat kHalfFormat{5, 10, true};
inline constexpr MiniFloat kBf16Format{8, 7, true};
inline constexpr MiniFloat kE4m3Format{4, 3, false};
inline constexpr MiniFloat kE5m2Format{5, 2, true};

uint32_t encodeMini(const MiniFloat& f, double v);
double decodeMini(const MiniFloat& f, uint32_t bits);

// One codec per type; the hot loops are templates over these.
template <typename S>
struct IntCodec {
  using Storage = S;
  static double load(const void* p, size_t i) {
    return static_cast<double>(static_cast<const S*>(p)[i]);
  }
  static void store(void* p, size_t i, double v) { static_cast<S*>(p)[i] = static_cast<S>(v); }
};
template <typename S>
struct FloatCodec {
  using Storage = S;
  static double load(const void* p, size_t i) {
    return static_cast<double>(static_cast<const S*>(p)[i]);
  }
  static void store(void* p, size_t i, double v) { static_cast<S*>(p)[i] = static_cast<S>(v); }
};
template <typename S, const MiniFloat& F>
struct MiniCodec {
  using Storage = S;
  static double load(const void* p, size_t i) { return decodeMini(F, static_cast<const S*>(p)[i]); }
  static void store(void* p, size_t i, double v) {
    static_cast<S*>(p)[i] = static_cast<S>(encodeMini(F, v));
  }
};

// Calls fn(Codec{}) with the codec of `type`.
template <typename Fn>
decltype(auto) withCodec(ncclDataType_t type, Fn&& fn) {
  switch (type) {
    case ncclInt8:
      return fn(IntCodec<int8_t>{});
    case ncclUint8:
      return fn(IntCodec<uint8_t>{});
    case ncclInt32:
      return fn(IntCodec<int32_t>{});
    case ncclUint32:
      return fn(IntCodec<uint32_t>{});
    case ncclInt64:
      return fn(IntCodec<int64_t>{});
    case ncclUint64:
      return fn(IntCodec<uint64_t>{});
    case ncclFloat16:
      return fn(MiniCodec<uint16_t, kHalfFormat>{});
    case ncclFloat32:
      return fn(FloatCodec<float>{});
    case ncclFloat64:
      return fn(FloatCodec<double>{});
    case ncclBfloat16:
      return fn(MiniCodec<uint16_t, kBf16Format>{});
    case ncclFloat8e4m3:
      return fn(MiniCodec<uint8_t, kE4m3Format>{});
    default:
      return fn(MiniCodec<uint8_t, kE5m2Format>{});
  }
}

// Element i of `base` (of `type`) as a double, and the reverse.
double loadValue(ncclDataType_t type, const void* base, size_t i);
void storeValue(ncclDataType_t type, void* base, size_t i, double v);

}  // namespace loom::bench
