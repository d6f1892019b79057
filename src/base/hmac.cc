// SHA-256 per FIPS 180-4 section 6.2, HMAC per RFC 2104. Written for clarity over speed:
// it hashes handshake messages of a few hundred bytes, never bulk data.
#include "base/hmac.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace loom {
namespace {

// First 32 bits of the fractional parts of the cube roots of the first 64 primes.
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

// First 32 bits of the fractional parts of the square roots of the first 8 primes.
constexpr uint32_t kInit[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

inline uint32_t loadBe32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

inline void storeBe32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

constexpr size_t kBlock = 64;

}  // namespace

Sha256::Sha256() { memcpy(h_, kInit, sizeof(h_)); }

void Sha256::block(const uint8_t* p) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t) w[t] = loadBe32(p + 4 * t);
  for (int t = 16; t < 64; ++t) {
    uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3];
  uint32_t e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int t = 0; t < 64; ++t) {
    uint32_t bigS1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = h + bigS1 + ch + kRound[t] + w[t];
    uint32_t bigS0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = bigS0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a;
  h_[1] += b;
  h_[2] += c;
  h_[3] += d;
  h_[4] += e;
  h_[5] += f;
  h_[6] += g;
  h_[7] += h;
}

void Sha256::update(const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_ += len;
  if (bufLen_ > 0) {
    size_t take = len < kBlock - bufLen_ ? len : kBlock - bufLen_;
    memcpy(buf_ + bufLen_, p, take);
    bufLen_ += take;
    p += take;
    len -= take;
    if (bufLen_ < kBlock) return;
    block(buf_);
    bufLen_ = 0;
  }
  for (; len >= kBlock; p += kBlock, len -= kBlock) block(p);
  if (len > 0) {
    memcpy(buf_, p, len);
    bufLen_ = len;
  }
}

Digest Sha256::finish() {
  // Padding (FIPS 180-4 5.1.1): a 1 bit, zeros up to 56 mod 64, then the bit length.
  uint64_t bits = total_ * 8;
  uint8_t pad[kBlock * 2] = {0x80};
  size_t padLen = (bufLen_ < 56 ? 56 : 120) - bufLen_;
  for (int i = 0; i < 8; ++i) pad[padLen + i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  update(pad, padLen + 8);
  Digest out;
  for (int i = 0; i < 8; ++i) storeBe32(out.data() + 4 * i, h_[i]);
  // Leave the object in its initial state so a reused hasher does not leak old state.
  memcpy(h_, kInit, sizeof(h_));
  bufLen_ = 0;
  total_ = 0;
  return out;
}

Digest sha256(const void* data, size_t len) {
  Sha256 s;
  s.update(data, len);
  return s.finish();
}

Digest hmacSha256(const void* key, size_t keyLen, const void* msg, size_t msgLen) {
  // RFC 2104: keys longer than the block are hashed first, shorter ones zero-padded.
  uint8_t k[kBlock] = {0};
  if (keyLen > kBlock) {
    Digest kd = sha256(key, keyLen);
    memcpy(k, kd.data(), kd.size());
  } else if (keyLen > 0) {
    memcpy(k, key, keyLen);
  }
  uint8_t ipad[kBlock], opad[kBlock];
  for (size_t i = 0; i < kBlock; ++i) {
    ipad[i] = k[i] ^ 0x36;
    opad[i] = k[i] ^ 0x5c;
  }
  Sha256 inner;
  inner.update(ipad, kBlock);
  inner.update(msg, msgLen);
  Digest ih = inner.finish();
  Sha256 outer;
  outer.update(opad, kBlock);
  outer.update(ih.data(), ih.size());
  return outer.finish();
}

bool digestEqual(const Digest& a, const Digest& b) {
  // Accumulate every difference so the time taken does not depend on where they differ.
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = static_cast<uint8_t>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

void randomBytes(void* buf, size_t len) {
  uint8_t* p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    ssize_t n = getrandom(p, len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throwErrno("getrandom(%zu bytes)", len);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
}

std::string hex(const void* data, size_t len) {
  static const char kDigits[] = "0123456789abcdef";
  const uint8_t* p = static_cast<const uint8_t*>(data);
  std::string out(len * 2, '\0');
  for (size_t i = 0; i < len; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 0xf];
  }
  return out;
}

}  // namespace loom
