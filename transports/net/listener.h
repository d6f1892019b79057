// What Loom's own socket-based backends (TCP, UCX's control streams) share about their
// listener: one StreamAcceptor per backend instance on the bootstrap interface, and its
// address carried inside the 128-byte NetHandle, checked when a peer's copy is read back.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <memory>

#include "base/socket.h"
#include "transports/net/net_backend.h"
#include "transports/socket/stream_acceptor.h"

namespace loom {

struct HandleAddr {
  uint32_t len;
  uint8_t bytes[sizeof(sockaddr_in6)];

  // Throws kInternalError (naming `rank`) if `a` does not fit.
  void set(const SocketAddr& a, int rank);
  // False when the bytes are not an IPv4 or IPv6 socket address.
  bool get(SocketAddr* a) const;
};

// The listener a backend makes at its first listen(): hellos of `kind` addressed to
// ctx.rank, on the bootstrap interface, any port.
std::unique_ptr<StreamAcceptor> makeNetAcceptor(const NetContext& ctx, uint16_t kind,
                                                const char* what);

// The one device of a backend that runs over the bootstrap interface, host memory only.
NetProperties bootstrapIfaceProperties(const NetContext& ctx);

}  // namespace loom
