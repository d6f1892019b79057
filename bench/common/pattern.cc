#include "bench/common/pattern.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace loom::bench {

namespace {

uint64_t mix(uint64_t seed, int rank, uint64_t index) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + (uint64_t(rank) + 1) * 0xD1B54A32D192ED03ull +
               index * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

// Uniform integer in [lo, hi] (as a double; hi - lo < 2^63).
double pick(uint64_t h, double lo, double hi) {
  uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<double>(h % span);
}

bool isSigned(const TypeInfo& t) { return t.kind != TypeKind::kUnsigned; }

}  // namespace

double preMulScalar(int rank) { return 1.0 + (rank & 1); }

bool reduceIsExact(const ReducePattern& p) {
  return !(p.op->op == ncclAvg && p.type->kind == TypeKind::kFloat);
}

double reduceInput(const ReducePattern& p, int rank, size_t index) {
  const TypeInfo& t = *p.type;
  const int n = std::max(1, p.nranks);
  uint64_t h = mix(p.seed, rank, index);
  double limit = t.exactLimit;
  switch (p.op->op) {
    case ncclProd: {
      // At most `twos` ranks contribute a 2 to any element, so |product| <= 2^maxPow2.
      int twos = std::min(n, t.maxPow2);
      bool inWindow = static_cast<int>((index + uint64_t(rank)) % uint64_t(n)) < twos;
      if (inWindow && (h & 1)) return 2;
      return (isSigned(t) && (h & 2)) ? -1 : 1;
    }
    case ncclMax:
    case ncclMin:
      return isSigned(t) ? pick(h, -limit, limit) : pick(h, 0, limit);
    case ncclAvg: {
      // Non-negative: integer avg then divides a truncated sum with no sign convention
      // involved, and float avg has no cancellation, so its rounding tolerance stays a few
      // ulps of the result itself.
      return pick(h, 0, std::floor(limit / n));
    }
    default: {  // sum, and mulsum whose premultipliers are at most 2
      double k = std::floor(limit / (p.op->preMulSum ? 2.0 * n : n));
      return isSigned(t) ? pick(h, -k, k) : pick(h, 0, k);
    }
  }
}

double reduceExpected(const ReducePattern& p, size_t index) {
  double scale;
  return reduceExpectedScaled(p, index, &scale);
}

double reduceExpectedScaled(const ReducePattern& p, size_t index, double* absSum) {
  const int n = std::max(1, p.nranks);
  double acc = reduceInput(p, 0, index) * (p.op->preMulSum ? preMulScalar(0) : 1.0);
  *absSum = std::fabs(acc);
  for (int r = 1; r < n; ++r) {
    double v = reduceInput(p, r, index);
    *absSum += std::fabs(v);
    switch (p.op->op) {
      case ncclProd:
        acc *= v;
        break;
      case ncclMax:
        acc = std::max(acc, v);
        break;
      case ncclMin:
        acc = std::min(acc, v);
        break;
      default:
        acc += p.op->preMulSum ? v * preMulScalar(r) : v;
        break;
    }
  }
  if (p.op->op == ncclAvg) {
    acc /= n;
    if (p.type->kind != TypeKind::kFloat) acc = std::trunc(acc);
  }
  return acc;
}

void fillReduceInput(const ReducePattern& p, void* dst, size_t count, int rank, size_t offset) {
  withCodec(p.type->type, [&](auto codec) {
    using C = decltype(codec);
    for (size_t i = 0; i < count; ++i) C::store(dst, i, reduceInput(p, rank, offset + i));
  });
}

void fillOnes(const TypeInfo& type, void* dst, size_t bytes) {
  if (bytes == 0) return;
  char* d = static_cast<char*>(dst);
  unsigned char one[8] = {};
  storeValue(type.type, one, 0, 1.0);
  size_t done = std::min(bytes, type.size);
  memcpy(d, one, done);
  // Doubling copies: as fast as memcpy over the whole buffer.
  while (done < bytes) {
    size_t n = std::min(done, bytes - done);
    memcpy(d + done, d, n);
    done += n;
  }
}

int64_t countWrongReduced(const ReducePattern& p, const void* got, size_t count, size_t offset) {
  const bool exact = reduceIsExact(p);
  // Float avg: the library may scale each input by 1/n before summing (NCCL does) or divide
  // the sum; either way each of its n+1 roundings is off by at most epsilon times a partial
  // result, and (inputs being non-negative) no partial result exceeds sum(x)/n = the result.
  const double n = std::max(1, p.nranks);
  const double ulps = p.type->epsilon * (n + 2) / n;
  return withCodec(p.type->type, [&](auto codec) {
    using C = decltype(codec);
    int64_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      double absSum;
      double want = reduceExpectedScaled(p, offset + i, &absSum);
      double have = C::load(got, i);
      bool ok = exact ? have == want : std::fabs(have - want) <= ulps * absSum;
      wrong += !ok;
    }
    return wrong;
  });
}

int64_t countWrongReduceInput(const ReducePattern& p, const void* got, size_t count, int rank,
                              size_t offset) {
  return withCodec(p.type->type, [&](auto codec) {
    using C = decltype(codec);
    int64_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += C::load(got, i) != reduceInput(p, rank, offset + i);
    return wrong;
  });
}

namespace {

// Writes the copy-pattern bytes [firstByte, firstByte + len) of `rank` to dst: byte b is
// byte (b % 8) of mix(seed, rank, b / 8).
void copyPatternBytes(uint64_t seed, int rank, uint64_t firstByte, size_t len, uint8_t* dst) {
  uint64_t b = firstByte;
  const uint64_t end = firstByte + len;
  while (b < end) {
    uint64_t word = mix(seed, rank, b / 8);
    uint8_t bytes[8];
    std::memcpy(bytes, &word, 8);  // little-endian hosts: byte k is bits 8k..8k+7
    size_t from = b % 8;
    size_t take = std::min<uint64_t>(8 - from, end - b);
    std::memcpy(dst, bytes + from, take);
    dst += take;
    b += take;
  }
}

}  // namespace

void fillCopyInput(uint64_t seed, size_t eltSize, void* dst, size_t count, int rank,
                   size_t offset) {
  copyPatternBytes(seed, rank, uint64_t(offset) * eltSize, count * eltSize,
                   static_cast<uint8_t*>(dst));
}

int64_t countWrongCopy(uint64_t seed, size_t eltSize, const void* got, size_t count, int rank,
                       size_t offset) {
  // Compare in chunks with memcmp; only a chunk that differs is walked element by element.
  constexpr size_t kChunkElts = 8192;
  uint8_t want[kChunkElts * 8];
  const uint8_t* have = static_cast<const uint8_t*>(got);
  int64_t wrong = 0;
  for (size_t start = 0; start < count; start += kChunkElts) {
    size_t n = std::min(kChunkElts, count - start);
    copyPatternBytes(seed, rank, uint64_t(offset + start) * eltSize, n * eltSize, want);
    const uint8_t* h = have + start * eltSize;
    if (std::memcmp(h, want, n * eltSize) == 0) continue;
    for (size_t i = 0; i < n; ++i)
      wrong += std::memcmp(h + i * eltSize, want + i * eltSize, eltSize) != 0;
  }
  return wrong;
}

int64_t countWrongZero(size_t eltSize, const void* got, size_t count) {
  const uint8_t* p = static_cast<const uint8_t*>(got);
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    bool zero = true;
    for (size_t k = 0; k < eltSize; ++k) zero &= p[i * eltSize + k] == 0;
    wrong += !zero;
  }
  return wrong;
}

}  // namespace loom::bench
