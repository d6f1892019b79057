// Knobs that must be alike on every rank of a communicator (KnobScope::kJob in
// base/config.h): NCCL_ALGO, NCCL_PROTO, the FIFO shape, the executor and its protocol, ...
// A rank launched with another value would run other plans than its peers and wait on them
// until LOOM_TIMEOUT, or misread their FIFOs. Each rank publishes a digest of its values in
// its PeerInfo; the init compares the all-gathered digests and, where one differs, fails on
// every rank alike, naming the knob, two ranks and their values.
#pragma once

#include <cstdint>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "transports/peer_info.h"

namespace loom {

// This rank's job-wide knob values, hashed (their names with them).
uint64_t jobKnobDigest();

// Throws kInvalidUsage where a rank's jobKnobs digest differs from rank 0's. Collective in
// that case: every rank sees the same digests, and all of them then all-gather their values
// to say which knob differs.
void checkJobKnobs(Bootstrap& bs, const std::vector<PeerInfo>& peers);

}  // namespace loom
