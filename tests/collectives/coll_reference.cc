#include "collectives/coll_reference.h"

#include <algorithm>
#include <cmath>

namespace colltest {
namespace {

constexpr double kPow2[] = {-2.0, -1.0, -0.5, 0.5, 1.0, 2.0};
constexpr int kMaxRanks = 8;  // the input ranges below keep every partial result exact up to 8

bool isPow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace

ReduceInputs::ReduceInputs(ncclDataType_t t, Op op, uint64_t seed)
    : t_(t),
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
  if (typeSize(t) <= 2) {
    if (dist_ == Dist::kFloatInt)
      for (int64_t v = -static_cast<int64_t>(range_); v <= static_cast<int64_t>(range_); ++v)
        smallBits_.push_back(encodeFloatExact(t, static_cast<double>(v)));
  }
  if (dist_ == Dist::kFloatPow2)
    for (double v : kPow2) smallBits_.push_back(encodeFloatExact(t, v));
}

uint64_t ReduceInputs::intValue(int rank, size_t idx) const {
  uint64_t r = randomBits(seed_, rank, idx);
  switch (dist_) {
    case Dist::kIntOdd: return (r | 1) & mask_;
    case Dist::kIntBounded:
      if (signed_) return static_cast<uint64_t>(static_cast<int64_t>(below(r, 2 * range_ + 1)) -
                                                static_cast<int64_t>(range_));
      return below(r, range_ + 1);
    default: return r & mask_;
  }
}

double ReduceInputs::floatValue(int rank, size_t idx) const {
  uint64_t r = randomBits(seed_, rank, idx);
  switch (dist_) {
    case Dist::kFloatInt:
      return static_cast<double>(static_cast<int64_t>(below(r, 2 * range_ + 1)) -
                                 static_cast<int64_t>(range_));
    case Dist::kFloatPow2: return kPow2[below(r, 6)];
    default: return dec_(bits(rank, idx));
  }
}

uint64_t ReduceInputs::bits(int rank, size_t idx) const {
  if (!isFloat_) return intValue(rank, idx) & mask_;
  uint64_t r = randomBits(seed_, rank, idx);
  switch (dist_) {
    case Dist::kFloatPow2: return smallBits_[below(r, 6)];
    case Dist::kFloatInt: {
      uint64_t k = below(r, 2 * range_ + 1);
      if (!smallBits_.empty()) return smallBits_[k];
      double v = static_cast<double>(static_cast<int64_t>(k) - static_cast<int64_t>(range_));
      return encodeFloatExact(t_, v);
    }
    default: {
      // Any finite pattern: an all-ones exponent (Inf/NaN) loses its top exponent bit;
      // e4m3's one NaN pattern becomes its largest finite; -0 becomes +0 (max/min
      // of +-0 would be ambiguous).
      FloatFormat f = floatFormat(t_);
      uint64_t b = r & mask_;
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
  }
}

Expect ReduceInputs::expect(int nranks, size_t idx) const {
  Expect e;
  if (!isFloat_) {
    uint64_t acc = op_ == Op::kProd ? 1 : 0;
    int64_t sacc = 0;
    uint64_t first = intValue(0, idx) & mask_;
    uint64_t best = first;
    for (int r = 0; r < nranks; ++r) {
      uint64_t x = intValue(r, idx) & mask_;
      switch (op_) {
        case Op::kSum: acc += x; break;
        case Op::kProd: acc *= x; break;
        case Op::kPreMulSum: acc += x * 3; break;
        case Op::kAvg:
          if (signed_) sacc += signExtend(t_, x);
          else acc += x;  // the bounded inputs cannot wrap
          break;
        case Op::kMax:
          if (signed_ ? signExtend(t_, x) > signExtend(t_, best) : x > best) best = x;
          break;
        case Op::kMin:
          if (signed_ ? signExtend(t_, x) < signExtend(t_, best) : x < best) best = x;
          break;
        default: break;
      }
    }
    if (op_ == Op::kMax || op_ == Op::kMin) acc = best;
    // Integer Avg is NCCL's SumPostDiv: the sum, divided with truncation toward zero.
    if (op_ == Op::kAvg) acc = signed_ ? static_cast<uint64_t>(sacc / nranks) : acc / nranks;
    e.bits = acc & mask_;
    return e;
  }
  double acc = op_ == Op::kProd ? 1 : 0, absSum = 0;
  double best = floatValue(0, idx);
  for (int r = 0; r < nranks; ++r) {
    double x = floatValue(r, idx);
    switch (op_) {
      case Op::kSum:
      case Op::kAvg: acc += x; absSum += std::fabs(x); break;
      case Op::kProd: acc *= x; break;
      case Op::kPreMulSum: acc += scalar_ * x; absSum += std::fabs(scalar_ * x); break;
      case Op::kMax: best = std::max(best, x); break;
      case Op::kMin: best = std::min(best, x); break;
      default: break;
    }
  }
  e.value = acc;
  if (op_ == Op::kMax || op_ == Op::kMin) e.value = best;
  if (op_ == Op::kAvg) {
    e.value = acc / nranks;
    // Exact when 1/nranks is a power of two; otherwise 1/nranks, each product and each
    // of the nranks-1 additions round once (plus slack for second-order terms).
    if (!isPow2(nranks)) e.tol = (nranks + 3) * u_ * absSum / nranks;
  }
  if (op_ == Op::kPreMulSum && typeSize(t_) == 1) e.tol = (nranks + 2) * u_ * absSum;
  return e;
}

bool ReduceInputs::matches(uint64_t got, const Expect& e) const {
  if (!isFloat_) return ((got ^ e.bits) & mask_) == 0;
  double v = dec_(got & mask_);
  if (std::isnan(v)) return false;
  return e.tol == 0 ? v == e.value : std::fabs(v - e.value) <= e.tol;
}

}  // namespace colltest
