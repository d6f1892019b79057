// InfiniBand / RoCE verbs as a NetBackend (NCCL_NET=IB; the default where an active RDMA
// port is found and NCCL_IB_DISABLE is not set). Its devices are the active ports that
// NCCL_IB_HCA selects. A connection is NCCL_IB_QPS_PER_CONNECTION reliable-connected
// queue pairs between the two ports plus an authenticated control stream from the sender
// to the listener's StreamAcceptor, which carries the set-up (QP numbers, GIDs, the
// sender's clear-to-send FIFO) and later the sender's goodbye, and whose end tells a side
// that the other's process is gone (see ib_comm.cc for the data path).
#pragma once

#include <memory>
#include <string>

#include "transports/net/ibv_api.h"
#include "transports/net/net_backend.h"

namespace loom {

// Throws kSystemError naming why when verbs are unavailable or no port is active, and
// kInvalidArgument for NCCL_IB_* values out of range. `api`: a verbs table to use
// instead of the process's (tests inject failures through it).
#ifdef LOOM_VERBS_HEADERS
std::unique_ptr<NetBackend> makeIbNetBackend(const NetContext& ctx, const IbvApi* api = nullptr);
#else
std::unique_ptr<NetBackend> makeIbNetBackend(const NetContext& ctx);
#endif

// Whether NCCL_NET unset means IB here: verbs built and loadable, NCCL_IB_DISABLE unset,
// and an active port NCCL_IB_HCA selects. `*why` says why not.
bool ibIsDefault(std::string* why);

}  // namespace loom
