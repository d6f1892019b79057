// UCX as a NetBackend (NCCL_NET=UCX): UCP tagged messages between the ranks' workers,
// over whichever UCX transports UCX_TLS / UCX_NET_DEVICES allow (tcp, posix shared
// memory, cma, verbs where there are NICs).
//
// Each communicator's backend has one UCP context and worker. A comm is one UCP endpoint
// (error mode "peer") plus an authenticated control stream from the sender to the
// listener's StreamAcceptor: the listener sends its worker address over it (UCP
// addresses exceed a 128-byte handle, so the handle holds the acceptor's address), and
// the sender's goodbye on close says how many messages it sent. The stream is also how a
// receiver learns that its sender died, which UCP alone does not tell a receive: a
// receive the sender will never match fails with kRemoteError instead of waiting.
// Messages carry the receiver's connection number as their tag, so the comms of one
// worker never match each other's messages, and receives match in the order posted.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transports/net/net_backend.h"
#include "transports/net/ucx_api.h"

namespace loom {

// UCX configuration that overrides the process's UCX_* variables for one backend
// instance: {"TLS", "tcp"}, {"NET_DEVICES", "lo"} (names without the UCX_ prefix).
using UcxConfig = std::vector<std::pair<std::string, std::string>>;

// Throws kSystemError naming why when UCX is unavailable or its context cannot start.
// `rma`: RMA put into the receiver's buffers (NCCL_NET=UCX_RMA, ucx_rma.cc) instead of
// tagged messages.
std::unique_ptr<NetBackend> makeUcxNetBackend(const NetContext& ctx, const UcxConfig& config = {},
                                              bool rma = false);

}  // namespace loom
