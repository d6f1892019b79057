// An NCCL net plugin as a NetBackend. Loom keeps what it promises of every connection on
// top of the plugin: each connection authenticates with the job's secret (the sender's
// first message is an HMAC of the listener's handle; the listener hands over only a
// connection whose tag checks, and keeps accepting otherwise); at most
// NCCL_NET_MAX_REQUESTS requests are outstanding per comm; a receive the plugin reports
// larger than its buffer, or any failed call, becomes an Error naming the plugin, the call
// and its ncclResult_t (a failed test(): kRemoteError, the peer is gone).
#pragma once

#include <memory>

#include "transports/net/net_backend.h"
#include "transports/net/plugin_api.h"

namespace loom {

// Initialises the plugin for one communicator (a v11 context; older versions once per
// process) and checks it has devices; throws naming the plugin otherwise.
std::unique_ptr<NetBackend> makePluginNetBackend(std::shared_ptr<PluginApi> api,
                                                 const NetContext& ctx);

}  // namespace loom
