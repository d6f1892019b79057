// FNV-1a, for digests whose only use is equality between ranks of one build (transport
// lists, job-wide settings): not for anything an attacker chooses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;

inline uint64_t fnv1aBytes(const void* data, size_t n, uint64_t h = kFnvOffset) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// A string and its terminator, so that "ab" then "c" differs from "a" then "bc".
inline uint64_t fnv1a(const std::string& s, uint64_t h = kFnvOffset) {
  return fnv1aBytes(s.c_str(), s.size() + 1, h);
}

}  // namespace loom
