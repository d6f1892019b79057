// TCP as a NetBackend: the first backend behind the generic net transport. A comm is
// LOOM_SOCKET_NSTREAMS TCP streams; each message is striped across them (a part per
// stream, each behind a small header), so large messages use several cores' worth of
// kernel work and small ones cost one send. Connections authenticate like the socket
// transport's (PeerHello with the job's secret, checked by a StreamAcceptor thread) and
// carry keepalive / TCP_USER_TIMEOUT, so a dead or silent peer fails a request instead
// of hanging it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/socket.h"
#include "transports/net/net_backend.h"

namespace loom {

std::unique_ptr<NetBackend> makeTcpNetBackend(const NetContext& ctx);

// The receiving end of a TCP comm over streams that are already connected and
// authenticated: what accept() returns, and what the stream-format fuzzer feeds.
std::unique_ptr<NetRecvComm> makeTcpRecvComm(std::vector<Socket> streams, std::string who);

}  // namespace loom
