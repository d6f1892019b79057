// What every rank publishes about itself at init (all-gathered, raw bytes): who it is and
// where it runs, plus one opaque section per registered transport, filled by that
// transport's localInfo() and read only by the same transport on the other ranks. Nothing
// here is specific to one transport, so a new one never changes this struct.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

namespace loom {

// At most this many transports per process (the registry refuses more).
constexpr int kMaxTransports = 8;
// Bytes a transport may publish per rank (a sockaddr_storage fits).
constexpr size_t kPeerSectionBytes = 128;
// Bytes a receiver's setup may hand its sender: a network backend's 128-byte handle (as
// NCCL's) and what the net transport adds (the connection's rail).
constexpr size_t kMaxConnBlobBytes = 160;

// Opaque bytes a transport hands to itself on another rank: a peer-info section or a
// connection blob. Both cross a process boundary, so readers check sizes, never trust them.
using Blob = std::vector<uint8_t>;

template <class T>
Blob toBlob(const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  Blob b(sizeof(T));
  memcpy(b.data(), &v, sizeof(T));
  return b;
}

// False unless `bytes` is exactly one T.
template <class T>
bool fromBlob(std::span<const uint8_t> bytes, T* out) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (bytes.size() != sizeof(T)) return false;
  memcpy(out, bytes.data(), sizeof(T));
  return true;
}

struct PeerSection {
  uint32_t len;  // as published: a reader clamps it (view())
  uint8_t bytes[kPeerSectionBytes];

  std::span<const uint8_t> view() const {
    return {bytes, len < kPeerSectionBytes ? len : kPeerSectionBytes};
  }
};

struct PeerInfo {
  int32_t rank;
  int32_t pid;
  uint64_t hostHash;
  uint64_t commHash;  // distinguishes communicators in shm names and stream hellos
  uint64_t pidNs;     // pid namespace: pid is meaningful only where these match
  // Names of the registered transports, in order: sections are indexed by that order, so
  // every rank must have the same list.
  uint64_t transportSet;
  // Digest of the knobs every rank must set alike (filled by the engine:
  // engine/knob_agreement.h).
  uint64_t jobKnobs;
  char hostname[64];
  PeerSection sections[kMaxTransports];
};

}  // namespace loom
