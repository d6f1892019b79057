#include "collectives/coll_reference.h"

#include <algorithm>
#include <cmath>

namespace colltest {
namespace {

constexpr double kPow2[] = {-2.0, -1.0, -0.5, 0.5, 1.0, 2.0};
constexpr int kMaxRanks = 8;  // the input ranges below keep every partial result exact up to 8

bool isPow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

uint64_t floatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
uint64_t doubleBits(double d) {
  uint64_t u;
  memcpy(&u, &d, 8);
  return u;
}

}  // namespace

ReduceInputs::ReduceInputs(ncclDataType_t t, Op op, uint64_t seed)
    : t_(t),
      sz_(typeSize(t)),
      op_(op),
      seed_(seed),
      isFloat_(isFloat(t)),
      signed_(isSignedInt(t)),
      mask_(widthMask(t)),
      dec_(t) {
  if (!isFloat_) {
    switch (op) {
      case Op::kProd: dist_ = Dist::kIntOdd; break;
      case Op::kAvg:
        dist_ = Dist::kIntBounded;
        range_ = (signed_ ? mask_ >> 1 : mask_) / kMaxRanks;
        break;
      default: dist_ = Dist::kIntFull; break;
    }
    scalar_ = 3;
    scalarBits_ = 3;
    return;
  }
  u_ = unitRoundoff(t);
  const double limit = exactIntLimit(t);
  switch (op) {
    case Op::kProd: dist_ = Dist::kFloatPow2; break;
    case Op::kMax:
    case Op::kMin: dist_ = Dist::kFloatFinite; break;
    case Op::kPreMulSum:
      // 1.5 * x summed over 8 ranks stays an exact multiple of 1/2 while 3 * 8 * range
      // fits the integer range; fp8 cannot, and compares within a bound instead.
      dist_ = Dist::kFloatInt;
      range_ = static_cast<uint64_t>(std::max(1.0, std::min(limit / (3 * kMaxRanks), 0x1p30)));
      break;
    default:  // sum, avg
      dist_ = Dist::kFloatInt;
      range_ = static_cast<uint64_t>(std::min(limit / kMaxRanks, 0x1p40));
      break;
  }
  scalar_ = 1.5;
  scalarBits_ = encodeFloatExact(t, scalar_);
  if (dist_ == Dist::kFloatInt && sz_ <= 2)
    for (int64_t v = -static_cast<int64_t>(range_); v <= static_cast<int64_t>(range_); ++v)
      smallBits_.push_back(encodeFloatExact(t, static_cast<double>(v)));
  if (dist_ == Dist::kFloatPow2)
    for (double v : kPow2) smallBits_.push_back(encodeFloatExact(t, v));
}

template <class F>
void ReduceInputs::forEachInt(int rank, size_t first, size_t n, F f) const {
  switch (dist_) {
    case Dist::kIntOdd:
      for (size_t j = 0; j < n; ++j) f(j, (randomBits(seed_, rank, first + j) | 1) & mask_);
      return;
    case Dist::kIntBounded: {
      const int64_t r = static_cast<int64_t>(range_);
      if (signed_) {
        for (size_t j = 0; j < n; ++j)
          f(j, static_cast<uint64_t>(static_cast<int64_t>(below(randomBits(seed_, rank, first + j),
                                                                2 * range_ + 1)) - r) & mask_);
      } else {
        for (size_t j = 0; j < n; ++j) f(j, below(randomBits(seed_, rank, first + j), range_ + 1));
      }
      return;
    }
    default:
      for (size_t j = 0; j < n; ++j) f(j, randomBits(seed_, rank, first + j) & mask_);
      return;
  }
}

// Any finite pattern: an all-ones exponent (Inf/NaN) loses its top exponent bit; e4m3's
// one NaN pattern becomes its largest finite; -0 becomes +0 (max/min of +-0 would be
// ambiguous).
uint64_t ReduceInputs::finiteBits(uint64_t random) const {
  FloatFormat f = floatFormat(t_);
  uint64_t b = random & mask_;
  uint64_t expMask = ((1ull << f.exp) - 1) << f.man;
  uint64_t manMask = (1ull << f.man) - 1;
  if (f.finiteOnly) {
    if ((b & (expMask | manMask)) == (expMask | manMask)) b ^= 1;
  } else if ((b & expMask) == expMask) {
    b &= ~(1ull << (f.exp + f.man - 1));
  }
  if (b == 1ull << (f.exp + f.man)) b = 0;
  return b;
}

template <bool kValue, class F>
void ReduceInputs::forEachFloat(int rank, size_t first, size_t n, F f) const {
  switch (dist_) {
    case Dist::kFloatInt: {
      const uint64_t span = 2 * range_ + 1;
      const int64_t r = static_cast<int64_t>(range_);
      for (size_t j = 0; j < n; ++j) {
        uint64_t k = below(randomBits(seed_, rank, first + j), span);
        double v = static_cast<double>(static_cast<int64_t>(k) - r);
        uint64_t b = !smallBits_.empty()   ? smallBits_[k]
                     : t_ == ncclFloat32 ? floatBits(static_cast<float>(v))
                                         : doubleBits(v);
        f(j, b, v);
      }
      return;
    }
    case Dist::kFloatPow2:
      for (size_t j = 0; j < n; ++j) {
        uint64_t k = below(randomBits(seed_, rank, first + j), 6);
        f(j, smallBits_[k], kPow2[k]);
      }
      return;
    default:
      for (size_t j = 0; j < n; ++j) {
        uint64_t b = finiteBits(randomBits(seed_, rank, first + j));
        f(j, b, kValue ? dec_(b) : 0.0);
      }
      return;
  }
}

uint64_t ReduceInputs::bits(int rank, size_t idx) const {
  uint64_t out = 0;
  if (isFloat_) forEachFloat<false>(rank, idx, 1, [&](size_t, uint64_t b, double) { out = b; });
  else forEachInt(rank, idx, 1, [&](size_t, uint64_t b) { out = b; });
  return out;
}

void ReduceInputs::fill(int rank, size_t first, size_t n, uint8_t* dst) const {
  if (isFloat_)
    forEachFloat<false>(rank, first, n,
                        [&](size_t j, uint64_t b, double) { storeBits(dst + j * sz_, sz_, b); });
  else
    forEachInt(rank, first, n, [&](size_t j, uint64_t b) { storeBits(dst + j * sz_, sz_, b); });
}

void ReduceInputs::expectBlock(int nranks, size_t first, size_t n, Expect* out) const {
  for (size_t j = 0; j < n; ++j) out[j] = Expect{};
  if (!isFloat_) {
    // Two's-complement sums in uint64 are the int64 sums; only Avg and Max/Min care
    // about signedness.
    const int shift = 64 - 8 * static_cast<int>(sz_);
    auto sext = [shift](uint64_t x) { return static_cast<int64_t>(x << shift) >> shift; };
    switch (op_) {
      case Op::kProd:
        for (size_t j = 0; j < n; ++j) out[j].bits = 1;
        for (int r = 0; r < nranks; ++r)
          forEachInt(r, first, n, [&](size_t j, uint64_t x) { out[j].bits *= x; });
        break;
      case Op::kMax:
      case Op::kMin: {
        const bool max = op_ == Op::kMax;
        forEachInt(0, first, n, [&](size_t j, uint64_t x) { out[j].bits = x; });
        for (int r = 1; r < nranks; ++r)
          forEachInt(r, first, n, [&](size_t j, uint64_t x) {
            uint64_t& b = out[j].bits;
            bool greater = signed_ ? sext(x) > sext(b) : x > b;
            bool less = signed_ ? sext(x) < sext(b) : x < b;
            if (max ? greater : less) b = x;
          });
        break;
      }
      case Op::kAvg:
        // NCCL's SumPostDiv: the sum (these inputs cannot wrap), divided with truncation
        // toward zero.
        for (int r = 0; r < nranks; ++r)
          forEachInt(r, first, n, [&](size_t j, uint64_t x) {
            out[j].bits += signed_ ? static_cast<uint64_t>(sext(x)) : x;
          });
        for (size_t j = 0; j < n; ++j)
          out[j].bits = signed_ ? static_cast<uint64_t>(static_cast<int64_t>(out[j].bits) / nranks)
                                : out[j].bits / nranks;
        break;
      default: {  // sum; PreMulSum by 3
        const uint64_t scale = op_ == Op::kPreMulSum ? 3 : 1;
        for (int r = 0; r < nranks; ++r)
          forEachInt(r, first, n, [&](size_t j, uint64_t x) { out[j].bits += x * scale; });
        break;
      }
    }
    for (size_t j = 0; j < n; ++j) out[j].bits &= mask_;
    return;
  }
  // Floats: out[j].tol holds the sum of |terms| until the end.
  switch (op_) {
    case Op::kProd:
      for (size_t j = 0; j < n; ++j) out[j].value = 1;
      for (int r = 0; r < nranks; ++r)
        forEachFloat<true>(r, first, n, [&](size_t j, uint64_t, double x) { out[j].value *= x; });
      break;
    case Op::kMax:
    case Op::kMin: {
      const bool max = op_ == Op::kMax;
      forEachFloat<true>(0, first, n, [&](size_t j, uint64_t, double x) { out[j].value = x; });
      for (int r = 1; r < nranks; ++r)
        forEachFloat<true>(r, first, n, [&](size_t j, uint64_t, double x) {
          double& v = out[j].value;
          v = max ? std::max(v, x) : std::min(v, x);
        });
      break;
    }
    default: {  // sum, avg; PreMulSum by 1.5
      const double scale = op_ == Op::kPreMulSum ? scalar_ : 1.0;
      for (int r = 0; r < nranks; ++r)
        forEachFloat<true>(r, first, n, [&](size_t j, uint64_t, double x) {
          out[j].value += scale * x;
          out[j].tol += std::fabs(scale * x);
        });
      break;
    }
  }
  for (size_t j = 0; j < n; ++j) {
    Expect& e = out[j];
    const double absSum = e.tol;
    e.tol = 0;
    if (op_ == Op::kAvg) {
      e.value /= nranks;
      // Exact when 1/nranks is a power of two; otherwise 1/nranks, each product and each
      // of the nranks-1 additions round once (plus slack for second-order terms).
      if (!isPow2(nranks)) e.tol = (nranks + 3) * u_ * absSum / nranks;
    }
    if (op_ == Op::kPreMulSum && sz_ == 1) e.tol = (nranks + 2) * u_ * absSum;
  }
}

bool ReduceInputs::matches(uint64_t got, const Expect& e) const {
  if (!isFloat_) return ((got ^ e.bits) & mask_) == 0;
  double v = dec_(got & mask_);
  if (std::isnan(v)) return false;
  return e.tol == 0 ? v == e.value : std::fabs(v - e.value) <= e.tol;
}

}  // namespace colltest
