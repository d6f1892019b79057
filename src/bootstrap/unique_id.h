// What Loom puts in the 128 opaque bytes of an ncclUniqueId: the root's address and the
// job's secret. Every connection the job opens proves knowledge of the secret.
#pragma once

#include <cstdint>
#include <string>

#include "base/socket.h"

namespace loom {

constexpr size_t kUniqueIdBytes = 128;
constexpr uint32_t kUniqueIdMagic = 0x4c4f4f4d;  // "LOOM"
constexpr uint16_t kWireVersion = 1;
constexpr size_t kSecretBytes = 32;

struct JobId {
  SocketAddr root;
  uint8_t secret[kSecretBytes] = {};
  uint64_t jobTag = 0;  // random; names this job's shared-memory objects in logs

  void encode(void* out128) const;
  // Throws kInvalidArgument when the bytes are not a Loom unique id.
  static JobId decode(const void* in128);
};

// Creates a new job: root address from NCCL_COMM_ID or the bootstrap interface (ephemeral
// port), fresh random secret. `startRoot` says whether this process must run the root.
JobId newJobId(bool* rootAddressFixed);

// The interface bootstrap sockets bind to (NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY).
NetInterface bootstrapInterface();

// NCCL_COMM_ID, if set, as an address; its secret comes from LOOM_JOB_SECRET (or, when
// unset, is derived from the address: such a job is only as private as its address).
bool commIdFromEnv(JobId* out);

}  // namespace loom
