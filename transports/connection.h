// One directed connection as the executor sees it: a FIFO (fifo.h) plus the few things a
// transport does beside sharing slots. Data always moves through FIFO slots; a transport
// whose slots are not shared between the two ranks (TCP) moves the bytes in progress(),
// called by the executor (or a proxy) while it waits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transports/fifo.h"
#include "transports/peer_info.h"

namespace loom {

struct FifoShape {
  size_t slotBytes;
  int depth;
};

class Connection {
 public:
  virtual ~Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  FifoEnd& fifo() { return fifo_; }
  int peer() const { return peer_; }
  // The transport that made it, as the INIT line names it ("shm", "socket", "net/Socket").
  const std::string& transport() const { return transport_; }
  // Whether progress() must be driven for data to move (the FIFO is not shared memory).
  virtual bool needsProgress() const { return false; }
  // Whether the communicator's proxy thread (proxy.h) drives progress() instead of the
  // executor: then progress(), checkPeer() and close() may run on different threads and
  // the connection synchronises them.
  virtual bool progressOnProxy() const { return false; }
  // Moves bytes for transports whose FIFO is local (sockets). Returns true if it did
  // anything. Throws kRemoteError when the peer is gone.
  virtual bool progress() { return false; }
  // Cheap liveness probe used while a wait makes no progress (dead process, closed socket,
  // a peer that failed and closed its end). Throws kRemoteError.
  virtual void checkPeer() const {}
  // Returns once a connection whose setup finishes in the background (a network connect
  // completed on the proxy thread) is made; throws its error if it failed or timed out.
  virtual void awaitConnected() const {}
  // This rank failed or is going away: make the peer's waits on this connection fail
  // promptly instead of hanging (failure propagates along every connection).
  virtual void close() {}
  // Human-readable, for errors: "rank 3 (host pid 123, 10.0.0.2:4000) via shm".
  const std::string& describe() const { return desc_; }
  // Whether the sender may post a pointer to its own memory instead of copying (the
  // receiver then reads it with one copy, e.g. Linux CMA).
  virtual bool supportsRemoteRead() const { return false; }
  // Receiver side of the single-copy path: copy `bytes` at the sender's address `remote`.
  virtual void readRemote(void* dst, uint64_t remote, size_t bytes) const;

 protected:
  // `where` is the address that identifies the peer in errors (a socket address).
  Connection(int peer, std::string transport, const PeerInfo& info, const std::string& where);
  FifoEnd fifo_;
  int peer_;
  int peerPid_;
  std::string transport_;
  std::string desc_;
};

}  // namespace loom
