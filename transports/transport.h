// A communicator's connections: one instance of every registered transport (registry.h),
// and the directed connections between this rank and its peers, made on demand.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "transports/connection.h"
#include "transports/fifo.h"
#include "transports/peer_info.h"
#include "transports/proxy.h"
#include "transports/registry.h"

namespace loom {

// Sets up connections to and from peers. Every rank taking part calls connect() with
// matching lists at about the same time (it is collective between each pair).
class TransportManager {
 public:
  // Instantiates the registered transports (a TCP listener among them): before the
  // peer exchange, since localInfo() publishes what they need.
  TransportManager(Bootstrap& bootstrap, FifoShape shape, uint64_t commHash);
  ~TransportManager();
  TransportManager(const TransportManager&) = delete;
  TransportManager& operator=(const TransportManager&) = delete;

  // This rank's PeerInfo with every transport's section filled: what the caller
  // all-gathers.
  PeerInfo localInfo() const;
  // The all-gathered infos (slot r is rank r's). Throws when ranks registered different
  // transports.
  void setPeers(const std::vector<PeerInfo>& peers);

  // The name of the transport that joins this rank and `peer`: the first registered, in
  // priority order, whose canConnect() says yes.
  const std::string& transportFor(int peer) const;

  // A connection is named by (peer, index): several may join the same pair of ranks so
  // that concurrent channels never share a FIFO.
  using ConnKey = std::pair<int, int>;
  static constexpr int kMaxConnsPerPeer = 8;

  // Establishes the missing connections. Collective between each pair: the peer lists
  // the matching keys (our sends are its receives).
  void connect(const std::vector<ConnKey>& sends, const std::vector<ConnKey>& recvs);

  Connection* sendConn(int peer, int idx = 0) const { return send_[peer * kMaxConnsPerPeer + idx].get(); }
  Connection* recvConn(int peer, int idx = 0) const { return recv_[peer * kMaxConnsPerPeer + idx].get(); }
  // Connections whose progress() the executor drives (needsProgress(), not on the proxy).
  const std::vector<Connection*>& active() const { return active_; }
  // One pass of the proxy over its connections on this thread, unless the proxy thread is
  // in one (Proxy::pumpIfFree); false at once where no connection is on the proxy.
  bool pumpProxied() { return proxy_.used() && proxy_.pumpIfFree(); }
  // Every connection holding data outside shared memory (needsProgress()): an operation
  // completes once their FIFOs have drained, whoever drives them.
  const std::vector<Connection*>& buffered() const { return buffered_; }
  std::string summary() const;  // "0:shm, 2:socket ..." for the INIT line
  // Closes every connection so that peers waiting on this rank fail promptly.
  void closeAll();

 private:
  int transportIndex(int peer) const;
  ConnRequest request(ConnKey k, int transport) const;
  void add(std::unique_ptr<Connection>& slot, std::unique_ptr<Connection> conn);

  Bootstrap& bootstrap_;
  uint64_t commHash_;
  std::vector<TransportSpec> specs_;
  // Declared before the connections: connections go first, then what they came from.
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<PeerInfo> peers_;
  mutable std::vector<int> choice_;  // per peer: index into transports_, -1 until asked
  int localRank_ = 0, localRanks_ = 1;  // this rank's place among its host's ranks
  std::vector<std::unique_ptr<Connection>> send_;
  std::vector<std::unique_ptr<Connection>> recv_;
  std::vector<Connection*> active_;
  std::vector<Connection*> buffered_;
  Proxy proxy_;  // drives progressOnProxy() connections; stopped before they go
};

}  // namespace loom
