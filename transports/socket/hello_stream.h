// The sending half of an authenticated stream opened without blocking: a TCP connect to
// a StreamAcceptor, then the PeerHello that proves the job's secret. Network backends
// call advance() from their non-blocking connect() until it says the hello is out.
#pragma once

#include <string>

#include "base/socket.h"
#include "bootstrap/wire.h"

namespace loom {

class HelloStream {
 public:
  // Starts connecting to `addr`; `who` names the connection in errors.
  HelloStream(const SocketAddr& addr, const PeerHello& hello, std::string who);
  // One step; true once the hello is fully sent. Throws kRemoteError when the connect
  // fails (the listener was up before its address was published: refused means gone).
  bool advance();
  Socket take() { return std::move(sock_); }

 private:
  Socket sock_;
  PeerHello hello_;
  std::string who_;
  bool connected_ = false;
  size_t sent_ = 0;
};

}  // namespace loom
