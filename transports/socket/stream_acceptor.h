// The receiving half of Loom's authenticated TCP streams, shared by the socket transport
// and the TCP network backend: a listener guarded by a HelloAcceptor thread (strangers,
// bad MACs and replayed hellos are dropped there), and the streams that proved the job's
// secret kept by (rank, connection, stream) until their owner asks. Streams may arrive
// before that, and even after their sender has exited.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "base/socket.h"
#include "bootstrap/hello_acceptor.h"
#include "bootstrap/unique_id.h"

namespace loom {

class StreamAcceptor {
 public:
  // Listens on `addr` (port 0: any) for hellos of `kind` addressed to rank `me`.
  StreamAcceptor(const JobId& job, int me, int nranks, SocketAddr addr, uint16_t kind,
                 const char* what);
  ~StreamAcceptor();
  StreamAcceptor(const StreamAcceptor&) = delete;
  StreamAcceptor& operator=(const StreamAcceptor&) = delete;

  const SocketAddr& addr() const { return addr_; }
  // The `n` streams of connection `connId` from rank `from` (-1: whichever rank opened
  // stream 0), in stream order, once every one of them is here (waiting up to waitMs for
  // arrivals); nullopt until then.
  std::optional<std::vector<Socket>> tryTake(int from, uint64_t connId, uint32_t n, int waitMs);
  // Whether a stream may still be on its way to tryTake(): lets an owner that has learnt
  // that a peer died tell "it never connected" from "its streams are not through yet".
  bool busy() const { return acceptor_->busy(); }

  // A stream's hello names (connection, stream) in one 64-bit field.
  static uint64_t streamId(uint64_t connId, uint32_t stream) { return (connId << 8) | stream; }
  static constexpr uint32_t kMaxStreams = 64;

 private:
  void takeStreams(int waitMs);

  int me_;
  SocketAddr addr_;
  Socket listener_;
  std::unique_ptr<HelloAcceptor> acceptor_;
  std::map<std::tuple<int, uint64_t, uint32_t>, Socket> early_;
};

}  // namespace loom
