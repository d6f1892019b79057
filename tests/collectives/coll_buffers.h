// Buffers with guard bytes on both sides, and the element checks the matrix makes on them.
// A failed check returns a message naming the buffer, the first wrong element (index,
// got, expected) and how many elements were wrong; "" when all is well.
#pragma once

#include <nccl.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "collectives/coll_reference.h"
#include "collectives/coll_types.h"

namespace colltest {

constexpr uint8_t kPoison = 0xa5;  // what a buffer holds before a collective writes it

class GuardedBuffer {
 public:
  // `lead` guard bytes before the data (a multiple of the element size, so that buffers
  // start at varied but element-aligned addresses), kTail after.
  GuardedBuffer(size_t bytes, size_t lead)
      : bytes_(bytes), lead_(lead), mem_(new uint8_t[lead + bytes + kTail]) {
    for (size_t i = 0; i < lead_; ++i) mem_[i] = guardByte(i);
    for (size_t i = 0; i < kTail; ++i) mem_[lead_ + bytes_ + i] = guardByte(lead_ + bytes_ + i);
    memset(data(), kPoison, bytes_);
  }
  uint8_t* data() { return mem_.get() + lead_; }
  const uint8_t* data() const { return mem_.get() + lead_; }
  size_t bytes() const { return bytes_; }
  // A hash of every byte, guards included.
  uint64_t hash() const;

  std::string checkGuards(const char* name) const {
    for (size_t i = 0; i < lead_; ++i)
      if (mem_[i] != guardByte(i))
        return fmt("%s: guard byte %zu before the buffer was overwritten (0x%02x)", name,
                   lead_ - i, mem_[i]);
    for (size_t i = 0; i < kTail; ++i) {
      size_t at = lead_ + bytes_ + i;
      if (mem_[at] != guardByte(at))
        return fmt("%s: guard byte %zu after the end (%zu bytes) was overwritten (0x%02x)", name,
                   i, bytes_, mem_[at]);
    }
    return "";
  }

  template <class... A>
  static std::string fmt(const char* f, A... a) {
    char buf[512];
    snprintf(buf, sizeof(buf), f, a...);
    return buf;
  }

 private:
  static constexpr size_t kTail = 64;
  static uint8_t guardByte(size_t i) { return static_cast<uint8_t>(0x3c + 29 * i); }
  size_t bytes_;
  size_t lead_;
  std::unique_ptr<uint8_t[]> mem_;
};

inline uint64_t elementAt(const uint8_t* p, size_t j, size_t sz) {
  return loadBits(p + j * sz, sz);
}

// "5 (0x05)", "-1.5 (0xbe00)": a value as the type reads it, and its bits.
inline std::string showElement(ncclDataType_t t, uint64_t bits) {
  char buf[96];
  int hex = static_cast<int>(2 * typeSize(t));
  if (isFloat(t))
    snprintf(buf, sizeof(buf), "%.9g (0x%0*" PRIx64 ")", decodeFloatSlow(t, bits), hex, bits);
  else if (isSignedInt(t))
    snprintf(buf, sizeof(buf), "%" PRId64 " (0x%0*" PRIx64 ")", signExtend(t, bits), hex, bits);
  else
    snprintf(buf, sizeof(buf), "%" PRIu64 " (0x%0*" PRIx64 ")", bits, hex, bits);
  return buf;
}

// Element j of n at p (element base + j of `what`) must have the bits want(j).
template <class Want>
std::string checkBits(const char* what, ncclDataType_t t, const uint8_t* p, size_t n, Want want,
                      size_t base = 0) {
  size_t sz = typeSize(t), bad = 0, first = 0;
  uint64_t gotFirst = 0, wantFirst = 0;
  for (size_t j = 0; j < n; ++j) {
    uint64_t g = elementAt(p, j, sz), w = want(j);
    if (g != w) {
      if (bad++ == 0) first = j, gotFirst = g, wantFirst = w;
    }
  }
  if (bad == 0) return "";
  return GuardedBuffer::fmt("%s[%zu] is %s, expected %s (%zu of %zu elements wrong)", what,
                            base + first, showElement(t, gotFirst).c_str(),
                            showElement(t, wantFirst).c_str(), bad, n);
}

// A buffer of nranks blocks of n elements: element j of block r must be want(r, j).
template <class Want>
std::string checkBlocks(const char* what, ncclDataType_t t, const uint8_t* p, size_t n,
                        int nranks, Want want) {
  for (int r = 0; r < nranks; ++r) {
    std::string e = checkBits(what, t, p + r * n * typeSize(t), n,
                              [&](size_t j) { return want(r, j); }, r * n);
    if (!e.empty()) return e + " [block of rank " + std::to_string(r) + "]";
  }
  return "";
}

// Element j of n at p (element base + j of `what`) must match the reference's element
// first + j.
inline std::string checkReduced(const char* what, ncclDataType_t t, const uint8_t* p, size_t n,
                                const ReduceInputs& in, int nranks, size_t first,
                                size_t base = 0) {
  constexpr size_t kBlock = 512;
  Expect want[kBlock];
  size_t sz = typeSize(t), bad = 0, firstBad = 0;
  uint64_t gotFirst = 0;
  Expect wantFirst;
  for (size_t b = 0; b < n; b += kBlock) {
    size_t len = std::min(kBlock, n - b);
    in.expectBlock(nranks, first + b, len, want);
    for (size_t j = 0; j < len; ++j) {
      uint64_t g = elementAt(p, b + j, sz);
      if (!in.matches(g, want[j]) && bad++ == 0) {
        firstBad = b + j;
        gotFirst = g;
        wantFirst = want[j];
      }
    }
  }
  if (bad == 0) return "";
  std::string w;
  if (!isFloat(t)) {
    w = showElement(t, wantFirst.bits);
  } else {
    char buf[96];
    if (wantFirst.tol == 0) snprintf(buf, sizeof(buf), "%.17g exactly", wantFirst.value);
    else snprintf(buf, sizeof(buf), "%.17g +- %.3g", wantFirst.value, wantFirst.tol);
    w = buf;
  }
  return GuardedBuffer::fmt("%s[%zu] is %s, expected %s (%zu of %zu elements wrong)", what,
                            base + firstBad, showElement(t, gotFirst).c_str(), w.c_str(), bad, n);
}

// Four independent lanes, each step a bijection of the lane given the word (xor, rotate,
// odd multiply): two inputs that differ in one word always differ in that lane. Not for
// adversaries, but several bytes per cycle, which the matrices' megabytes need.
inline uint64_t hashBytes(const uint8_t* p, size_t bytes) {
  constexpr uint64_t kMul = 0x9e3779b97f4a7c15ull;
  uint64_t lane[4] = {bytes, kMul, ~bytes, ~kMul};
  auto step = [](uint64_t h, uint64_t w) {
    h ^= w;
    return ((h << 29) | (h >> 35)) * kMul;
  };
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    for (int k = 0; k < 4; ++k) lane[k] = step(lane[k], loadBits(p + i + 8 * k, 8));
  for (; i + 8 <= bytes; i += 8) lane[0] = step(lane[0], loadBits(p + i, 8));
  if (i < bytes) lane[1] = step(lane[1], loadBits(p + i, bytes - i));
  return fmix64(fmix64(fmix64(fmix64(lane[0]) ^ lane[1]) ^ lane[2]) ^ lane[3]);
}

inline uint64_t GuardedBuffer::hash() const { return hashBytes(mem_.get(), lead_ + bytes_ + kTail); }

// The bytes at p must still equal `orig` (inputs, and buffers a rank must not write).
inline std::string checkUnchanged(const char* what, ncclDataType_t t, const uint8_t* p,
                                  const uint8_t* orig, size_t bytes) {
  if (bytes == 0 || memcmp(p, orig, bytes) == 0) return "";
  size_t sz = typeSize(t);
  return checkBits(what, t, p, bytes / sz, [&](size_t j) { return elementAt(orig, j, sz); }) +
         " [must be left untouched]";
}

inline std::string checkPoison(const char* what, ncclDataType_t t, const uint8_t* p, size_t bytes) {
  size_t sz = typeSize(t);
  uint64_t poison = 0;
  memset(&poison, kPoison, sz);
  for (size_t i = 0; i < bytes; ++i)
    if (p[i] != kPoison)
      return checkBits(what, t, p, bytes / sz, [&](size_t) { return poison; }) +
             " [must not be written]";
  return "";
}

}  // namespace colltest
