#include "base/hmac.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace loom {
namespace {

std::string sha(const std::string& s) {
  Digest d = sha256(s.data(), s.size());
  return hex(d.data(), d.size());
}

std::vector<uint8_t> fill(size_t n, uint8_t v) { return std::vector<uint8_t>(n, v); }

std::vector<uint8_t> unhex(const std::string& h) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<uint8_t>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

std::string hmac(const std::vector<uint8_t>& key, const std::string& msg) {
  Digest d = hmacSha256(key.data(), key.size(), msg.data(), msg.size());
  return hex(d.data(), d.size());
}

std::string hmac(const std::vector<uint8_t>& key, const std::vector<uint8_t>& msg) {
  Digest d = hmacSha256(key.data(), key.size(), msg.data(), msg.size());
  return hex(d.data(), d.size());
}

TEST(Sha256, FipsShortVectors) {
  EXPECT_EQ(sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, MillionAsInOddPieces) {
  // Pieces of 1..97 bytes cross the 64-byte block boundary at every offset.
  std::string piece(97, 'a');
  Sha256 s;
  size_t left = 1000000, step = 1;
  while (left > 0) {
    size_t n = std::min(left, step);
    s.update(piece.data(), n);
    left -= n;
    step = step % 97 + 1;
  }
  Digest d = s.finish();
  EXPECT_EQ(hex(d.data(), d.size()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, PaddingBoundaries) {
  // 55, 56 and 64 bytes are where the length field does or does not fit the last block;
  // a one-shot hash must equal a byte-at-a-time one, and the hasher resets after finish.
  for (size_t len : {55u, 56u, 63u, 64u, 65u, 119u, 120u}) {
    std::string m(len, 'x');
    Digest whole = sha256(m.data(), m.size());
    Sha256 s;
    for (char c : m) s.update(&c, 1);
    EXPECT_EQ(s.finish(), whole) << len;
    s.update(m.data(), m.size());
    EXPECT_EQ(s.finish(), whole) << "reused hasher, " << len;
  }
  // Known value for 56 bytes of 'a' (length field forces a second block).
  EXPECT_EQ(sha(std::string(56, 'a')),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
}

// RFC 4231 section 4.
TEST(HmacSha256, Rfc4231Case1) {
  EXPECT_EQ(hmac(fill(20, 0x0b), std::string("Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST(HmacSha256, Rfc4231Case2) {
  std::string key = "Jefe";
  EXPECT_EQ(hmac(std::vector<uint8_t>(key.begin(), key.end()),
                 std::string("what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(HmacSha256, Rfc4231Case3) {
  EXPECT_EQ(hmac(fill(20, 0xaa), fill(50, 0xdd)),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
}

TEST(HmacSha256, Rfc4231Case4) {
  EXPECT_EQ(hmac(unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), fill(50, 0xcd)),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
}

TEST(HmacSha256, Rfc4231Case6LongKey) {
  EXPECT_EQ(hmac(fill(131, 0xaa),
                 std::string("Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HmacSha256, Rfc4231Case7LongKeyAndData) {
  EXPECT_EQ(hmac(fill(131, 0xaa),
                 std::string("This is a test using a larger than block-size key and a larger "
                             "than block-size data. The key needs to be hashed before being "
                             "used by the HMAC algorithm.")),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(HmacSha256, KeyMatters) {
  std::string m = "message";
  Digest a = hmacSha256("k1", 2, m.data(), m.size());
  Digest b = hmacSha256("k2", 2, m.data(), m.size());
  EXPECT_FALSE(digestEqual(a, b));
}

TEST(DigestEqual, ComparesEveryByte) {
  Digest a = sha256("x", 1);
  Digest b = a;
  EXPECT_TRUE(digestEqual(a, b));
  for (size_t i : {0u, 17u, 31u}) {
    Digest c = a;
    c[i] ^= 0x01;
    EXPECT_FALSE(digestEqual(a, c)) << "byte " << i;
  }
}

TEST(RandomBytes, DiffersBetweenCalls) {
  uint8_t a[32] = {0}, b[32] = {0};
  randomBytes(a, sizeof(a));
  randomBytes(b, sizeof(b));
  EXPECT_NE(hex(a, sizeof(a)), hex(b, sizeof(b)));
  EXPECT_NE(hex(a, sizeof(a)), std::string(64, '0'));
  // Larger than one getrandom() call may return in one go for some kernels.
  std::vector<uint8_t> big(1 << 20, 0);
  randomBytes(big.data(), big.size());
  size_t zeros = 0;
  for (uint8_t v : big) zeros += v == 0;
  EXPECT_LT(zeros, big.size() / 128);  // expected 1/256 of the bytes; all-zero tail would fail
}

TEST(Hex, Formats) {
  const uint8_t bytes[] = {0x00, 0x0f, 0xa0, 0xff};
  EXPECT_EQ(hex(bytes, sizeof(bytes)), "000fa0ff");
  EXPECT_EQ(hex(bytes, 0), "");
}

}  // namespace
}  // namespace loom
