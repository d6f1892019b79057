// The TCP transport's connection. Each side keeps its FIFO in local memory; progress()
// moves published slots over several TCP streams per connection (slot payloads are
// striped across the streams), so the executor's protocol is identical to shared memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/socket.h"
#include "transports/connection.h"

namespace loom {

class SocketConnection : public Connection {
 public:
  // `where` names the peer's listener in errors.
  SocketConnection(int peer, const PeerInfo& info, FifoShape shape, bool sender,
                   std::vector<Socket> streams, const std::string& where);
  ~SocketConnection() override;

  bool needsProgress() const override { return true; }
  bool progress() override;
  // A peer that closed its streams at a step boundary may simply be done; it is an error
  // only once we wait for more (the executor asks after a while without progress).
  void checkPeer() const override;
  void close() override;

  static int streamCount();  // LOOM_SOCKET_NSTREAMS

 private:
  struct Cursor {
    uint64_t step = 0;  // steps fully moved on this stream
    size_t done = 0;  // bytes of header + part moved for `step`
  };
  struct PartHeader {
    uint64_t step;
    uint64_t slotBytes;
  };
  bool progressSend(size_t j);
  bool progressRecv(size_t j);
  size_t partBegin(uint64_t bytes, size_t j) const { return bytes * j / streams_.size(); }

  bool sender_;
  std::vector<Socket> streams_;
  std::vector<Cursor> cursors_;
  std::vector<PartHeader> hdr_;  // receive side: header being read per stream
  void* mem_ = nullptr;
  std::vector<uint8_t> eof_;  // per stream: the peer closed it at a step boundary
};

}  // namespace loom
