// Transports create the two ends of a directed connection's FIFO (fifo.h). Data always
// moves through FIFO slots; a transport whose slots are not shared between the two ranks
// (TCP) moves the bytes in progress(), called by the executor (or a proxy) while it waits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "transports/fifo.h"

namespace loom {

// What every rank publishes about itself at init (all-gathered).
struct PeerInfo {
  int32_t rank;
  int32_t pid;
  uint64_t hostHash;
  uint64_t commHash;  // distinguishes communicators in shm names and stream hellos
  uint64_t pidNs;     // pid namespace: pid is meaningful only where these match
  sockaddr_storage netAddr;  // the socket transport's listener
  uint32_t netAddrLen;
  char hostname[64];
};

enum class TransportKind { kShm, kSocket };
const char* transportName(TransportKind k);

// One directed connection as seen from one side.
class Connection {
 public:
  virtual ~Connection() = default;
  FifoEnd& fifo() { return fifo_; }
  int peer() const { return peer_; }
  TransportKind kind() const { return kind_; }
  // Moves bytes for transports whose FIFO is local (sockets). Returns true if it did
  // anything. Throws kRemoteError when the peer is gone.
  virtual bool progress() { return false; }
  // Cheap liveness probe used while a wait makes no progress (dead process, closed socket,
  // a peer that failed and closed its end). Throws kRemoteError.
  virtual void checkPeer() const {}
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
  Connection(int peer, TransportKind kind, const PeerInfo& info);
  FifoEnd fifo_;
  int peer_;
  TransportKind kind_;
  PeerInfo info_;
  std::string desc_;
};

struct FifoShape {
  size_t slotBytes;
  int depth;
};

// Sets up connections to and from peers. Every rank taking part calls connect() with
// matching lists at about the same time (it is collective between each pair).
class TransportManager {
 public:
  TransportManager(Bootstrap& bootstrap, const std::vector<PeerInfo>& peers, FifoShape shape);
  ~TransportManager();

  static PeerInfo localInfo(int rank, uint64_t commHash, const SocketAddr& netAddr);
  // The listener the socket transport uses; created before the all-gather of PeerInfo.
  static SocketAddr makeNetListener(Bootstrap& bootstrap, Socket* out);
  void adoptNetListener(Socket listener);

  TransportKind kindFor(int peer) const;
  // A connection is named by (peer, index): several may join the same pair of ranks so
  // that concurrent channels never share a FIFO.
  using ConnKey = std::pair<int, int>;
  static constexpr int kMaxConnsPerPeer = 8;

  // Establishes the missing connections. Collective between each pair: the peer lists
  // the matching keys (our sends are its receives).
  void connect(const std::vector<ConnKey>& sends, const std::vector<ConnKey>& recvs);

  Connection* sendConn(int peer, int idx = 0) const { return send_[peer * kMaxConnsPerPeer + idx].get(); }
  Connection* recvConn(int peer, int idx = 0) const { return recv_[peer * kMaxConnsPerPeer + idx].get(); }
  // Connections whose progress() must be driven (sockets).
  const std::vector<Connection*>& active() const { return active_; }
  std::string summary() const;  // "0->1 shm, 1->0 shm ..." for the INIT line
  // Closes every connection so that peers waiting on this rank fail promptly.
  void closeAll();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::unique_ptr<Connection>> send_;
  std::vector<std::unique_ptr<Connection>> recv_;
  std::vector<Connection*> active_;
};

}  // namespace loom
