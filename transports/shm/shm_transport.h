// Shared-memory transport between ranks of one host: the receiver creates a segment
// holding the FIFO control block and slots, the sender maps it, and the name is unlinked
// as soon as both have it mapped. Serves ranks of one host and pid namespace (pids give
// liveness and single-copy reads) unless LOOM_SHM_DISABLE.
#pragma once

#include <memory>
#include <string>

#include "base/shm.h"
#include "transports/registry.h"

namespace loom {

class ShmConnection : public Connection {
 public:
  // Receiver side: creates the segment. name() is what the sender needs.
  static std::unique_ptr<ShmConnection> createRecv(int peer, const PeerInfo& info, FifoShape shape,
                                                   const std::string& where);
  // Sender side: maps the receiver's segment.
  static std::unique_ptr<ShmConnection> openSend(int peer, const PeerInfo& info, FifoShape shape,
                                                 const std::string& name, const std::string& where);
  ~ShmConnection() override;

  const std::string& name() const { return seg_.name(); }
  void unlinkName() { seg_.unlink(); }
  void checkPeer() const override;
  void close() override;
  bool supportsRemoteRead() const override;
  void readRemote(void* dst, uint64_t remote, size_t bytes) const override;

  static size_t segmentBytes(FifoShape shape);

 private:
  ShmConnection(int peer, const PeerInfo& info, ShmSegment seg, FifoShape shape, bool sender,
                const std::string& where);
  ShmSegment seg_;
  int pidfd_ = -1;
  bool cma_ = false;  // post addresses for the peer to read (LOOM_SHM_CMA)
  bool sender_;  // the peer process, when it is another process: readable once it exits
};

std::unique_ptr<Transport> makeShmTransport(const TransportContext& ctx);

}  // namespace loom
