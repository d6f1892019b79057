// Inputs and independently computed expected results for the collectives matrix.
//
// Every input element is a pure function of (seed, rank, index), so any rank can compute
// what any other rank sent. Reduction inputs are chosen so that every partial result of
// every reduction order is exactly representable in the type (integers wrap, which is
// associative), except where the operation itself rounds (float Avg on a rank count that
// is not a power of two, PreMulSum on fp8); those compare within a bound derived from
// the type's unit roundoff.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <vector>

#include "collectives/coll_types.h"

namespace colltest {

enum class Op { kSum, kProd, kMax, kMin, kAvg, kPreMulSum, kNone };
inline const char* opName(Op op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg", "premulsum", "-"};
  return kNames[static_cast<int>(op)];
}
inline ncclRedOp_t builtinOp(Op op) {
  switch (op) {
    case Op::kSum: return ncclSum;
    case Op::kProd: return ncclProd;
    case Op::kMax: return ncclMax;
    case Op::kMin: return ncclMin;
    default: return ncclAvg;
  }
}

// murmur3's 64-bit finalizer: a bijective, well-mixed hash.
inline uint64_t fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}
// The random bits behind element idx of `rank`'s input: one multiply round is plenty for
// test data, and this is the matrix's innermost loop.
inline uint64_t randomBits(uint64_t seed, int rank, size_t idx) {
  uint64_t x = seed ^ (static_cast<uint64_t>(rank + 1) * 0xd1b54a32d192ed03ull) ^
               (idx * 0x9e3779b97f4a7c15ull);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}
// Uniform in [0, span).
inline uint64_t below(uint64_t r, uint64_t span) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r) * span) >> 64);
}

// Arbitrary bit patterns (NaNs included) for the collectives that only move data.
class RawInputs {
 public:
  RawInputs(ncclDataType_t t, uint64_t seed) : sz_(typeSize(t)), mask_(widthMask(t)), seed_(seed) {}
  uint64_t bits(int rank, size_t idx) const { return randomBits(seed_, rank, idx) & mask_; }
  // Elements [first, first + n) of `rank`'s input, stored at dst.
  void fill(int rank, size_t first, size_t n, uint8_t* dst) const {
    for (size_t j = 0; j < n; ++j) storeBits(dst + j * sz_, sz_, bits(rank, first + j));
  }

 private:
  size_t sz_;
  uint64_t mask_;
  uint64_t seed_;
};

// What one output element must be: bits for integers; a value and an allowed absolute
// error for floats (tol 0: exactly).
struct Expect {
  uint64_t bits = 0;
  double value = 0;
  double tol = 0;
};

// The inputs of one (type, op) reduction and its reference.
class ReduceInputs {
 public:
  ReduceInputs(ncclDataType_t t, Op op, uint64_t seed);

  uint64_t bits(int rank, size_t idx) const;
  // Elements [first, first + n) of `rank`'s input, stored at dst.
  void fill(int rank, size_t first, size_t n, uint8_t* dst) const;
  // The reduction over ranks 0..nranks-1 of elements [first, first + n).
  void expectBlock(int nranks, size_t first, size_t n, Expect* out) const;
  Expect expect(int nranks, size_t idx) const {
    Expect e;
    expectBlock(nranks, idx, 1, &e);
    return e;
  }
  // PreMulSum's scalar, as one element of the type.
  uint64_t scalarBits() const { return scalarBits_; }
  double scalarValue() const { return scalar_; }
  // Whether `got` (bits of one output element) matches `e`.
  bool matches(uint64_t got, const Expect& e) const;
  double decode(uint64_t bits) const { return isFloat_ ? dec_(bits) : 0; }

 private:
  enum class Dist {
    kIntFull,     // any bit pattern
    kIntOdd,      // odd values: products never collapse to 0 modulo 2^width
    kIntBounded,  // |v| <= range: the sum of 8 never wraps (integer Avg)
    kFloatInt,    // integers in [-range, range]
    kFloatPow2,   // one of +-1/2, +-1, +-2: every product of 8 is a power of two
    kFloatFinite, // any finite value except -0
  };
  // f(j, bits) for rank's integer elements first + j, j in [0, n).
  template <class F>
  void forEachInt(int rank, size_t first, size_t n, F f) const;
  // f(j, bits, value) for rank's floating elements first + j, j in [0, n) (value 0 unless
  // kValue: decoding costs more than making the bits).
  template <bool kValue, class F>
  void forEachFloat(int rank, size_t first, size_t n, F f) const;
  uint64_t finiteBits(uint64_t random) const;

  ncclDataType_t t_;
  size_t sz_;
  Op op_;
  uint64_t seed_;
  bool isFloat_;
  bool signed_;
  uint64_t mask_;
  Dist dist_;
  uint64_t range_ = 0;
  std::vector<uint64_t> smallBits_;  // kFloatInt/kFloatPow2 on 1-2 byte floats: value -> bits
  double scalar_ = 0;
  uint64_t scalarBits_ = 0;
  double u_ = 0;  // unit roundoff (floats)
  FloatDecoder dec_;
};

}  // namespace colltest
