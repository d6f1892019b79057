// SHA-256 and HMAC-SHA-256 (FIPS 180-4, RFC 2104), used to authenticate every connection
// a job opens with the secret carried in its unique id. Self-contained: no libcrypto.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace loom {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t len);
  Digest finish();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t bufLen_ = 0;
  uint64_t total_ = 0;
};

Digest sha256(const void* data, size_t len);
Digest hmacSha256(const void* key, size_t keyLen, const void* msg, size_t msgLen);
// Constant-time comparison.
bool digestEqual(const Digest& a, const Digest& b);
// Fills `buf` from the kernel's CSPRNG (getrandom); throws kSystemError on failure.
void randomBytes(void* buf, size_t len);
std::string hex(const void* data, size_t len);

}  // namespace loom
