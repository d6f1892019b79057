// TCP transport: serves any pair of ranks (the fallback after shm). Each rank listens on
// its bootstrap interface and publishes that address in its peer-info section; a sender
// opens LOOM_SOCKET_NSTREAMS authenticated streams to its receiver's listener, and a
// HelloAcceptor thread hands the receiver the streams that prove the job's secret.
#pragma once

#include <memory>

#include "transports/registry.h"
#include "transports/socket/socket_connection.h"
#include "transports/socket/stream_acceptor.h"

namespace loom {

std::unique_ptr<Transport> makeSocketTransport(const TransportContext& ctx);

}  // namespace loom
