// Message authentication codes for the bootstrap wire. Each MAC binds a label, so a
// message of one kind can never be replayed as another.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/hmac.h"
#include "bootstrap/root.h"
#include "bootstrap/unique_id.h"

namespace loom {

Digest helloMac(const JobId& id, const RootHello& h);
Digest replyMac(const JobId& id, const RootHello& hello, const RootReplyHeader& r,
                const void* table, size_t tableBytes);

// Rank-to-rank connection hello: proves the connecting rank holds the secret.
struct PeerHello {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;  // 2 bootstrap peer, 3 socket stream, 4 net stream, 5 UCX control, 6 verbs control, 7 status query
  int32_t fromRank;
  int32_t toRank;
  uint64_t connId;  // transport: which connection/stream this socket carries
  uint8_t nonce[16];
  uint8_t mac[32];  // HMAC(secret, "loom-peer-hello" | fields above)
};

PeerHello makePeerHello(const JobId& id, uint16_t kind, int from, int to, uint64_t connId);
// Checks magic, version, kind, MAC and the destination rank. Returns false on mismatch.
bool verifyPeerHello(const JobId& id, const PeerHello& h, uint16_t kind, int me);

}  // namespace loom
