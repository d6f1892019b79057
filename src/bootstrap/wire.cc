#include "bootstrap/wire.h"

#include <cstring>

namespace loom {
namespace {

Digest mac(const JobId& id, const char* label, const void* a, size_t alen, const void* b = nullptr,
           size_t blen = 0, const void* c = nullptr, size_t clen = 0) {
  // HMAC over label | a | b | c, computed as HMAC(secret, sha256(label|a|b|c)).
  Sha256 s;
  s.update(label, strlen(label));
  s.update(a, alen);
  if (b) s.update(b, blen);
  if (c) s.update(c, clen);
  Digest inner = s.finish();
  return hmacSha256(id.secret, kSecretBytes, inner.data(), inner.size());
}

}  // namespace

Digest helloMac(const JobId& id, const RootHello& h) {
  return mac(id, "loom-root-hello", &h, offsetof(RootHello, mac));
}

Digest replyMac(const JobId& id, const RootHello& hello, const RootReplyHeader& r,
                const void* table, size_t tableBytes) {
  return mac(id, "loom-root-reply", hello.nonce, sizeof(hello.nonce), &r,
             offsetof(RootReplyHeader, mac), table, tableBytes);
}

PeerHello makePeerHello(const JobId& id, uint16_t kind, int from, int to, uint64_t connId) {
  PeerHello h{};
  h.magic = kUniqueIdMagic;
  h.version = kWireVersion;
  h.kind = kind;
  h.fromRank = from;
  h.toRank = to;
  h.connId = connId;
  randomBytes(h.nonce, sizeof(h.nonce));
  Digest d = mac(id, "loom-peer-hello", &h, offsetof(PeerHello, mac));
  memcpy(h.mac, d.data(), 32);
  return h;
}

bool verifyPeerHello(const JobId& id, const PeerHello& h, uint16_t kind, int me) {
  if (h.magic != kUniqueIdMagic || h.version != kWireVersion || h.kind != kind) return false;
  if (h.toRank != me) return false;
  Digest d = mac(id, "loom-peer-hello", &h, offsetof(PeerHello, mac));
  Digest got;
  memcpy(got.data(), h.mac, 32);
  return digestEqual(d, got);
}

}  // namespace loom
