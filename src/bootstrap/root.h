// The rendezvous root: collects every rank's address and hands back the full table.
// Unauthenticated, garbage, oversized or idle connections are dropped without disturbing
// the job.
#pragma once

#include "bootstrap/unique_id.h"

namespace loom {

// Binds the root's listening socket now (so the id carries its real port) and serves one
// rendezvous on a detached thread. Updates id.root with the bound address.
void startRoot(JobId& id);
// Calls off the rendezvous of a root this process runs (false: none runs for `id`): the
// ranks waiting at it, and those arriving in the next 60 s, fail with kRemoteError saying
// that the process which made the id cancelled it.
bool cancelRoot(const JobId& id);

// Wire structs shared by root and ranks.
struct RootHello {  // rank -> root, after connecting
  uint32_t magic;
  uint16_t version;
  uint16_t kind;  // 1 = rank hello
  int32_t rank;
  int32_t nranks;
  uint8_t nonce[16];
  uint8_t listen[sizeof(sockaddr_storage)];
  uint32_t listenLen;
  uint8_t mac[32];  // HMAC(secret, "loom-root-hello" | all fields above)
};

struct RootReplyHeader {  // root -> rank, followed by nranks * sockaddr_storage
  uint32_t magic;
  uint16_t version;
  uint16_t status;  // 0 ok, 1 nranks mismatch, 2 duplicate rank, 3 a rank left, 4 cancelled
  int32_t nranks;
  uint8_t mac[32];  // HMAC(secret, "loom-root-reply" | rank nonce | table)
};

}  // namespace loom
