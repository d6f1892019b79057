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

// A backend of one device, the bootstrap interface (host memory only), whose peers
// connect to one StreamAcceptor, made at the first listen().
class BootstrapIfaceBackend : public NetBackend {
 public:
  int devices() override { return 1; }
  NetProperties properties(int dev) override;

 protected:
  // `name` in errors ("TCP"); hellos of `kind` addressed to ctx.rank; `what` names the
  // listener in logs.
  BootstrapIfaceBackend(const NetContext& ctx, const char* name, uint16_t kind, const char* what)
      : ctx_(ctx), name_(name), kind_(kind), what_(what) {}
  void checkDev(int dev) const;  // throws kInvalidArgument unless dev is 0
  StreamAcceptor& acceptor();
  uint64_t nextConnId() { return nextConnId_++; }

  NetContext ctx_;

 private:
  const char* name_;
  uint16_t kind_;
  const char* what_;
  std::unique_ptr<StreamAcceptor> acceptor_;
  uint64_t nextConnId_ = 1;
};

}  // namespace loom
