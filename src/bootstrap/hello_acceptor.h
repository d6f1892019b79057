// Accepts connections on a listener and collects each one's PeerHello without ever
// blocking on a single connection: a silent or slow stranger waits in a queue until its
// deadline instead of holding up the peers that are really arriving.
#pragma once

#include <utility>
#include <vector>

#include "base/socket.h"
#include "bootstrap/wire.h"

namespace loom {

class HelloAcceptor {
 public:
  explicit HelloAcceptor(const Socket* listener, double helloTimeoutSec = 5)
      : listener_(listener), timeoutNs_(static_cast<uint64_t>(helloTimeoutSec * 1e9)) {}

  // Waits up to waitMs for activity, accepts what is queued, reads what has arrived, and
  // returns the connections whose hello is complete (not yet verified).
  std::vector<std::pair<PeerHello, Socket>> poll(int waitMs, const char* who);

 private:
  struct Pending {
    Socket sock;
    PeerHello hello;
    size_t got;
    uint64_t deadlineNs;
  };
  const Socket* listener_;
  uint64_t timeoutNs_;
  std::vector<Pending> pending_;
};

}  // namespace loom
