// The open set of transports. A transport is a small interface (Gloo's style): it publishes
// a section of the peer info, says whether it can join two ranks, and makes the two ends
// of a directed connection, the receiver's first (setup → an opaque blob of at most
// kMaxConnBlobBytes), then the sender's from that blob (connect), then the receiver's
// completion once the sender is attached (finish). TransportManager walks the registry in
// priority order and takes the first transport whose canConnect() says yes; it knows no
// transport by name, so adding one is one registration.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "transports/connection.h"
#include "transports/peer_info.h"

namespace loom {

// What a transport instance knows of its communicator. A communicator makes one instance
// of every registered transport and keeps it as long as its connections.
struct TransportContext {
  Bootstrap& bootstrap;
  FifoShape shape;
  uint64_t commHash;
};

// One directed connection being set up, as both ends' hooks see it.
struct ConnRequest {
  int peer;
  int index;  // which of the pair's connections (several may join two ranks)
  const PeerInfo& me;
  const PeerInfo& peerInfo;
  std::span<const uint8_t> peerSection;  // what this transport published on the peer
  std::string where;  // the peer's out-of-band address, for descriptions
  int localRank = 0;   // this rank's index among the ranks of its host (rails spread by it)
  int localRanks = 1;  // ranks on this rank's host
};

// The receiver's end between setup() and the sender's acknowledgement.
class PendingRecv {
 public:
  virtual ~PendingRecv() = default;
  // The sender has attached (its connect() returned): complete this end.
  virtual std::unique_ptr<Connection> finish() = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // This rank's section of its PeerInfo (at most kPeerSectionBytes), all-gathered before
  // any connection is made.
  virtual Blob localInfo() { return {}; }
  // Called once the peer infos are all-gathered (`slot`: this transport's section in each):
  // throws where the ranks' sections say they cannot work together, alike on every rank.
  virtual void checkPeers(const std::vector<PeerInfo>& /*peers*/, int /*slot*/) const {}
  // Whether this transport can join `me` and `peer`. The receiver's answer decides a pair
  // (the sender follows what the receiver chose).
  virtual bool canConnect(const PeerInfo& me, const PeerInfo& peer) const = 0;
  // Receiver side: creates this end; `*blob` is all its sender will learn about it.
  virtual std::unique_ptr<PendingRecv> setup(const ConnRequest& req, Blob* blob) = 0;
  // Sender side: attaches to the receiver's end that `blob` describes. The blob arrived
  // from another process: check it.
  virtual std::unique_ptr<Connection> connect(const ConnRequest& req,
                                              std::span<const uint8_t> blob) = 0;
};

struct TransportSpec {
  std::string name;
  int priority;  // lower is tried first; the built-ins are shm 100, net 150, socket 200
  std::function<std::unique_ptr<Transport>(const TransportContext&)> make;
};

// The transports this process offers, in priority order (registration order on ties).
std::vector<TransportSpec> registeredTransports();
// Identifies a list of transports by their names in order (PeerInfo::transportSet).
uint64_t transportSetHash(const std::vector<TransportSpec>& specs);

// Offers a transport beside the built-in ones while this object lives (tests, plugins):
// communicators created meanwhile use it; existing ones keep what they have.
class TransportRegistration {
 public:
  explicit TransportRegistration(TransportSpec spec);
  ~TransportRegistration();
  TransportRegistration(const TransportRegistration&) = delete;
  TransportRegistration& operator=(const TransportRegistration&) = delete;

 private:
  std::string name_;
};

}  // namespace loom
