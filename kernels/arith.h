// Per-element arithmetic shared by the CPU kernels and the CUDA kernels: storage <->
// compute conversions for fp16, bf16 and fp8 (round to nearest even), and the reduction
// functors. Everything here is header-only and compiles as host code and, under nvcc, as
// device code, so both executors produce the same bits.
//
// Numerics follow NCCL 2.28 on sm_90 (src/device/reduce_kernel.h, src/enqueue.cc; NCCL
// refuses fp8 reductions below sm_90) and CUDA 13's cuda_fp16/bf16/fp8 headers:
//  - fp16/bf16/fp8 are widened to fp32, combined, and rounded back (RNE) once per binary
//    op. NCCL uses native half ops (__hadd, __hmul, __hmin) and, for fp8, half arithmetic;
//    those are correctly rounded, and fp32 (p=24) has at least 2p+2 bits for each of these
//    formats (fp16 p=11, bf16 p=8; half p=11 for fp8), so rounding through fp32 gives the
//    same bits.
//  - fp8 stores are CUDA's __nv_fp8_e4m3/__nv_fp8_e5m2 constructors, which use
//    __NV_SATFINITE: anything beyond the largest finite value, infinities included, becomes
//    +-448 (e4m3) or +-57344 (e5m2); so an e5m2 sum never produces inf, and an e5m2 inf
//    input comes out as +-57344. NaN becomes 0x7f.
//  - NaN results of fp16/bf16 are the canonical 0x7fff (as cvt.rn.f16.f32, __float2half and
//    __float2bfloat16 make them). fp32/fp64 NaN payloads are whatever the hardware makes.
//  - max/min on floats ignore a NaN operand (IEEE maximumNumber/minimumNumber, as fmaxf/
//    fminf and __hmax/__hmin), give NaN only when both are NaN, and order -0 < +0.
//  - Integer sum/prod wrap (computed unsigned), PreMulSum multiplies in the integer type,
//    Avg of integers is the wrapped sum divided by nranks, truncated toward zero (NCCL's
//    FuncSumPostDiv). Avg of floats is PreMulSum by 1/nranks rounded to the type through
//    float (__float2half(float(1.0/n)) etc.; fp64: 1.0/n), as NCCL's hostToDevRedOp.
//  - PreMulSum rounds the scaled value to the type before adding it. NCCL's own build lets
//    nvcc contract that multiply and add into an FMA (--fmad=true by default), so its
//    fp32/fp64 results can differ from this in the last bit; Loom never fuses (the CPU
//    files disable contraction, the CUDA module builds with --fmad=false).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__
#define LOOM_INLINE __forceinline__
#else
#define LOOM_HD
#define LOOM_INLINE inline __attribute__((always_inline))
#endif

namespace loom {

// NCCL's ncclDataType_t numbering.
enum class DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFloat8e4m3 = 10,
  kFloat8e5m2 = 11,
};
constexpr int kNumDataTypes = 12;

// The device-level reduction a collective runs (NCCL's ncclDevRedOp_t, min and max split).
enum class RedKind : int { kSum = 0, kProd, kMax, kMin, kPreMulSum, kSumPostDiv };
constexpr int kNumRedKinds = 6;

// ---- bit casts ---------------------------------------------------------------------------

LOOM_HD LOOM_INLINE uint32_t floatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
LOOM_HD LOOM_INLINE float floatFromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
LOOM_HD LOOM_INLINE uint64_t doubleBits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
#endif
}
LOOM_HD LOOM_INLINE double doubleFromBits(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
#endif
}

// ---- narrow float formats ----------------------------------------------------------------
// Written as selects rather than branches so the compiler vectorises them, and without
// relying on subnormal float arithmetic (immune to FTZ/DAZ set by the application).

// Magnitude of |f| (bits ax, not NaN) rounded to nearest even in a format with kMant
// mantissa bits and exponent bias kBias, as that format's code; no overflow handling.
template <int kMant, int kBias>
LOOM_HD LOOM_INLINE uint32_t roundMagnitude(uint32_t ax) {
  constexpr int kShift = 23 - kMant;
  constexpr uint32_t kRebias = uint32_t(127 - kBias) << 23;
  constexpr uint32_t kMinNormal = uint32_t(128 - kBias) << 23;
  uint32_t normal = (ax - kRebias + ((1u << (kShift - 1)) - 1u) + ((ax >> kShift) & 1u)) >> kShift;
  // Below the smallest normal, add a power of two whose ulp is the format's smallest
  // subnormal: the fp32 adder then rounds (to nearest even) at exactly that position.
  constexpr uint32_t kMagic = uint32_t(127 + 24 - kBias - kMant) << 23;
  uint32_t sub = floatBits(floatFromBits(ax) + floatFromBits(kMagic)) - kMagic;
  return ax < kMinNormal ? sub : normal;
}

LOOM_HD LOOM_INLINE float halfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu;
  uint32_t normal = (em << 13) + (uint32_t(127 - 15) << 23);
  uint32_t sub = floatBits(float(em) * 0x1p-24f);  // exact: em < 2^10
  uint32_t special = 0x7f800000u | (em << 13);     // inf, NaN (payload kept)
  uint32_t mag = em < 0x400u ? sub : (em >= 0x7c00u ? special : normal);
  return floatFromBits(sign | mag);
}

LOOM_HD LOOM_INLINE uint16_t floatToHalf(float f) {
#if defined(__CUDA_ARCH__)
  unsigned short r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return f != f ? uint16_t(0x7fffu) : uint16_t(r);
#else
  uint32_t x = floatBits(f);
  uint32_t ax = x & 0x7fffffffu;
  uint32_t mag = roundMagnitude<10, 15>(ax);
  mag = ax >= 0x477ff000u ? 0x7c00u : mag;  // >= 65520 (65504 + half an ulp) -> inf
  uint32_t r = ((x >> 16) & 0x8000u) | mag;
  return uint16_t(ax > 0x7f800000u ? 0x7fffu : r);
#endif
}

LOOM_HD LOOM_INLINE float bf16ToFloat(uint16_t b) { return floatFromBits(uint32_t(b) << 16); }

LOOM_HD LOOM_INLINE uint16_t floatToBf16(float f) {
  uint32_t x = floatBits(f);
  uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return uint16_t((x & 0x7fffffffu) > 0x7f800000u ? 0x7fffu : r);
}

// OCP FP8 E4M3 (CUDA __nv_fp8_e4m3): bias 7, no infinities, 0x7f/0xff are NaN, max 448.
LOOM_HD LOOM_INLINE float fp8e4m3ToFloat(uint8_t b) {
  uint32_t sign = uint32_t(b & 0x80u) << 24;
  uint32_t em = b & 0x7fu;
  uint32_t normal = (em << 20) + (uint32_t(127 - 7) << 23);
  uint32_t sub = floatBits(float(em) * 0x1p-9f);
  uint32_t mag = em < 0x08u ? sub : (em == 0x7fu ? 0x7fc00000u : normal);
  return floatFromBits(sign | mag);
}

// OCP FP8 E5M2 (CUDA __nv_fp8_e5m2) is the upper byte of an fp16.
LOOM_HD LOOM_INLINE float fp8e5m2ToFloat(uint8_t b) { return halfToFloat(uint16_t(b << 8)); }

// fp32 -> fp8, round to nearest even, saturating to the largest finite value as CUDA's
// __NV_SATFINITE does (infinities included); NaN -> 0x7f.
template <int kMant, int kBias, uint32_t kMaxFiniteBits, uint32_t kMaxFiniteCode>
LOOM_HD LOOM_INLINE uint8_t floatToFp8(float f) {
  uint32_t x = floatBits(f);
  uint32_t ax = x & 0x7fffffffu;
  uint32_t mag = roundMagnitude<kMant, kBias>(ax);
  mag = ax >= kMaxFiniteBits ? kMaxFiniteCode : mag;
  uint32_t r = ((x >> 24) & 0x80u) | mag;
  return uint8_t(ax > 0x7f800000u ? 0x7fu : r);
}
LOOM_HD LOOM_INLINE uint8_t floatToFp8e4m3(float f) {
  return floatToFp8<3, 7, 0x43e00000u /*448*/, 0x7eu>(f);
}
LOOM_HD LOOM_INLINE uint8_t floatToFp8e5m2(float f) {
  return floatToFp8<2, 15, 0x47600000u /*57344*/, 0x7bu>(f);
}

// ---- storage traits ----------------------------------------------------------------------
// Storage: how an element sits in memory. Acc: what one binary op computes in.

template <DataType D>
struct Traits;

template <typename T>
struct IntTraits {
  using Storage = T;
  using Acc = T;
  static constexpr bool kIsFloat = false;
  LOOM_HD LOOM_INLINE static Acc load(Storage s) { return s; }
  LOOM_HD LOOM_INLINE static Storage store(Acc a) { return a; }
};
template <>
struct Traits<DataType::kInt8> : IntTraits<int8_t> {};
template <>
struct Traits<DataType::kUint8> : IntTraits<uint8_t> {};
template <>
struct Traits<DataType::kInt32> : IntTraits<int32_t> {};
template <>
struct Traits<DataType::kUint32> : IntTraits<uint32_t> {};
template <>
struct Traits<DataType::kInt64> : IntTraits<int64_t> {};
template <>
struct Traits<DataType::kUint64> : IntTraits<uint64_t> {};

template <typename T>
struct WideFloatTraits {
  using Storage = T;
  using Acc = T;
  static constexpr bool kIsFloat = true;
  LOOM_HD LOOM_INLINE static Acc load(Storage s) { return s; }
  LOOM_HD LOOM_INLINE static Storage store(Acc a) { return a; }
};
template <>
struct Traits<DataType::kFloat32> : WideFloatTraits<float> {};
template <>
struct Traits<DataType::kFloat64> : WideFloatTraits<double> {};

template <>
struct Traits<DataType::kFloat16> {
  using Storage = uint16_t;
  using Acc = float;
  static constexpr bool kIsFloat = true;
  LOOM_HD LOOM_INLINE static Acc load(Storage s) { return halfToFloat(s); }
  LOOM_HD LOOM_INLINE static Storage store(Acc a) { return floatToHalf(a); }
};
template <>
struct Traits<DataType::kBfloat16> {
  using Storage = uint16_t;
  using Acc = float;
  static constexpr bool kIsFloat = true;
  LOOM_HD LOOM_INLINE static Acc load(Storage s) { return bf16ToFloat(s); }
  LOOM_HD LOOM_INLINE static Storage store(Acc a) { return floatToBf16(a); }
};
template <>
struct Traits<DataType::kFloat8e4m3> {
  using Storage = uint8_t;
  using Acc = float;
  static constexpr bool kIsFloat = true;
  LOOM_HD LOOM_INLINE static Acc load(Storage s) { return fp8e4m3ToFloat(s); }
  LOOM_HD LOOM_INLINE static Storage store(Acc a) { return floatToFp8e4m3(a); }
};
template <>
struct Traits<DataType::kFloat8e5m2> {
  using Storage = uint8_t;
  using Acc = float;
  static constexpr bool kIsFloat = true;
  LOOM_HD LOOM_INLINE static Acc load(Storage s) { return fp8e5m2ToFloat(s); }
  LOOM_HD LOOM_INLINE static Storage store(Acc a) { return floatToFp8e5m2(a); }
};

// ---- binary ops on the compute type ------------------------------------------------------

template <typename T>
using WrapType = typename std::conditional<std::is_integral<T>::value, std::make_unsigned<T>,
                                           std::common_type<T>>::type::type;

struct OpSum {
  template <typename T>
  LOOM_HD LOOM_INLINE static T apply(T a, T b) {
    // Integers wrap: compute in the unsigned type so overflow is defined.
    return T(WrapType<T>(a) + WrapType<T>(b));
  }
};
struct OpProd {
  template <typename T>
  LOOM_HD LOOM_INLINE static T apply(T a, T b) {
    return T(WrapType<T>(a) * WrapType<T>(b));
  }
};

// -0 < +0 for max/min of equal values: for max AND the bits (clears the sign if either is
// +0), for min OR them; equal non-zero values have equal bits.
LOOM_HD LOOM_INLINE float zeroAwareSelect(float a, float b, bool isMax) {
  uint32_t x = floatBits(a), y = floatBits(b);
  return floatFromBits(isMax ? (x & y) : (x | y));
}
LOOM_HD LOOM_INLINE double zeroAwareSelect(double a, double b, bool isMax) {
  uint64_t x = doubleBits(a), y = doubleBits(b);
  return doubleFromBits(isMax ? (x & y) : (x | y));
}

template <bool kIsMax>
struct OpMinMax {
  template <typename T>
  LOOM_HD LOOM_INLINE static T apply(T a, T b) {
    if constexpr (std::is_integral<T>::value) {
      return kIsMax ? (a > b ? a : b) : (a < b ? a : b);
    } else {
      T r = kIsMax ? (a > b ? a : b) : (a < b ? a : b);
      r = a == b ? zeroAwareSelect(a, b, kIsMax) : r;
      r = b != b ? a : r;  // NaN operands are ignored ...
      r = a != a ? b : r;  // ... unless both are NaN
      return r;
    }
  }
};
using OpMax = OpMinMax<true>;
using OpMin = OpMinMax<false>;

// ---- element functors --------------------------------------------------------------------
// What the loops apply per element. Each is a small value type (carrying its scalar) so
// it can be passed to a CUDA kernel by value.

// dst = a OP b, both already in the reduction (pre-scaled where PreMulSum applies).
template <DataType D, typename Op>
struct ReduceElt {
  using T = Traits<D>;
  LOOM_HD LOOM_INLINE typename T::Storage operator()(typename T::Storage a,
                                                     typename T::Storage b) const {
    return T::store(Op::apply(T::load(a), T::load(b)));
  }
};

// x * scalar rounded to the storage type (PreMulSum's pre-op; also float Avg's post-op).
template <DataType D>
struct ScaleElt {
  using T = Traits<D>;
  typename T::Acc scalar;
  LOOM_HD LOOM_INLINE typename T::Storage operator()(typename T::Storage x) const {
    return T::store(OpProd::apply(T::load(x), scalar));
  }
};

// dst = a + pre(b): the scaled local contribution is rounded to the storage type before
// the sum, as NCCL applies the pre-op when it loads the local source.
template <DataType D>
struct PreSumElt {
  using T = Traits<D>;
  typename T::Acc scalar;
  LOOM_HD LOOM_INLINE typename T::Storage operator()(typename T::Storage a,
                                                     typename T::Storage b) const {
    typename T::Acc scaled = T::load(T::store(OpProd::apply(T::load(b), scalar)));
    return T::store(OpSum::apply(T::load(a), scaled));
  }
};

// Integer Avg's post-op: the wrapped sum divided by nranks, truncated toward zero.
template <DataType D>
struct DivElt {
  using S = typename Traits<D>::Storage;
  using Wide = typename std::conditional<std::is_signed<S>::value, int64_t, uint64_t>::type;
  Wide divisor;
  LOOM_HD LOOM_INLINE S operator()(S x) const { return S(Wide(x) / divisor); }
};

// The scalar of PreMulSum (or float SumPostDiv), given as bits of one element of D, in the
// compute type.
template <DataType D>
LOOM_HD LOOM_INLINE typename Traits<D>::Acc scalarFromBits(uint64_t bits) {
  using S = typename Traits<D>::Storage;
  S s;
#if defined(__CUDA_ARCH__)
  memcpy(&s, &bits, sizeof s);  // little-endian: the low bytes hold the element
#else
  std::memcpy(&s, &bits, sizeof s);
#endif
  return Traits<D>::load(s);
}

}  // namespace loom
