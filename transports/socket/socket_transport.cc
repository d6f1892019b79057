#include "transports/socket/socket_transport.h"

#include <netinet/in.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "base/time.h"
#include "bootstrap/wire.h"

namespace loom {
namespace {

constexpr uint16_t kKindStream = 3;

// What a receiver tells its sender: which connection the streams belong to, and how many.
struct SocketBlob {
  uint64_t connId;
  uint32_t nstreams;
  uint32_t reserved;
};

// A listener address as published in a peer-info section (its sockaddr bytes).
Blob addrBlob(const SocketAddr& a) {
  const auto* p = reinterpret_cast<const uint8_t*>(&a.storage);
  return Blob(p, p + a.len);
}

SocketAddr parseAddr(const ConnRequest& req) {
  SocketAddr a;
  std::span<const uint8_t> b = req.peerSection;
  bool ok = b.size() >= sizeof(sa_family_t) && b.size() <= sizeof(a.storage);
  if (ok) {
    memcpy(&a.storage, b.data(), b.size());
    a.len = static_cast<socklen_t>(b.size());
    ok = (a.family() == AF_INET && a.len == sizeof(sockaddr_in)) ||
         (a.family() == AF_INET6 && a.len == sizeof(sockaddr_in6));
  }
  if (!ok)
    LOOM_THROW(kRemoteError, "rank %d: rank %d published a malformed TCP listener address (%zu bytes)",
               req.me.rank, req.peer, b.size());
  return a;
}

class SocketTransport;

// The receiver's end: its streams arrive on the listener once the sender has opened them.
class SocketPending : public PendingRecv {
 public:
  SocketPending(SocketTransport& t, const ConnRequest& req, SocketBlob blob, std::string where)
      : t_(t), peer_(req.peer), info_(req.peerInfo), blob_(blob), where_(std::move(where)) {}
  std::unique_ptr<Connection> finish() override;

 private:
  SocketTransport& t_;
  int peer_;
  const PeerInfo& info_;
  SocketBlob blob_;
  std::string where_;
};

class SocketTransport : public Transport {
 public:
  explicit SocketTransport(const TransportContext& ctx)
      : bs_(ctx.bootstrap),
        shape_(ctx.shape),
        streams_(bs_.job(), bs_.rank(), bs_.nranks(), listenAddr(bs_), kKindStream,
                 "transport listener") {}

  Blob localInfo() override { return addrBlob(streams_.addr()); }

  bool canConnect(const PeerInfo&, const PeerInfo&) const override { return true; }

  std::unique_ptr<PendingRecv> setup(const ConnRequest& req, Blob* blob) override {
    SocketBlob b{};
    b.connId = nextConnId_++;
    b.nstreams = static_cast<uint32_t>(SocketConnection::streamCount());
    *blob = toBlob(b);
    return std::make_unique<SocketPending>(*this, req, b, parseAddr(req).str());
  }

  std::unique_ptr<Connection> connect(const ConnRequest& req,
                                      std::span<const uint8_t> blob) override {
    int me = bs_.rank(), p = req.peer;
    SocketBlob b;
    if (!fromBlob(blob, &b))
      LOOM_THROW(kRemoteError, "rank %d: rank %d sent a %zu-byte TCP connection setup, expected %zu",
                 me, p, blob.size(), sizeof(b));
    if (b.nstreams < 1 || b.nstreams > StreamAcceptor::kMaxStreams)
      LOOM_THROW(kRemoteError, "rank %d: rank %d asked for %u TCP streams", me, p, b.nstreams);
    SocketAddr a = parseAddr(req);
    std::vector<Socket> streams;
    std::string what = strprintf("rank %d transport connect to rank %d", me, p);
    for (uint32_t s = 0; s < b.nstreams; ++s) {
      // The listener was up before its address was published: refused means gone.
      Socket sock = Socket::connect(a, Deadline::in(60), what.c_str(), false);
      PeerHello h = makePeerHello(bs_.job(), kKindStream, me, p, StreamAcceptor::streamId(b.connId, s));
      sock.sendAll(&h, sizeof(h), Deadline::in(60), what.c_str());
      streams.push_back(std::move(sock));
    }
    LOOM_INFO(kLogInit | kLogNet, "rank %d sends to rank %d (connection %d) over %u TCP streams",
              me, p, req.index, b.nstreams);
    return std::make_unique<SocketConnection>(p, req.peerInfo, shape_, true, std::move(streams),
                                              a.str());
  }

  // Waits until the `n` streams of connection `connId` from `from` are here.
  std::vector<Socket> acceptStreams(int from, uint64_t connId, uint32_t n) {
    Deadline deadline = Deadline::in(60);
    for (;;) {
      try {
        bs_.checkPeer(from, "transport setup");  // aborted, or the peer died
      } catch (const Error&) {
        // A peer may open its streams, finish its init and exit before we get here: its
        // streams are then still queued, or their hellos being read. Take those first.
        for (;;) {
          bool busy = streams_.busy();
          if (auto got = streams_.tryTake(from, connId, n, 100)) return std::move(*got);
          if (!busy) throw;
        }
      }
      if (auto got = streams_.tryTake(from, connId, n, 100)) return std::move(*got);
      if (deadline.expired())
        LOOM_THROW(kRemoteError,
                   "rank %d: timed out waiting for rank %d to open its TCP streams to %s",
                   bs_.rank(), from, streams_.addr().str().c_str());
    }
  }

  FifoShape shape() const { return shape_; }

 private:
  static SocketAddr listenAddr(const Bootstrap& bs) {
    SocketAddr a = bs.iface().addr;
    a.setPort(0);
    return a;
  }

  Bootstrap& bs_;
  FifoShape shape_;
  StreamAcceptor streams_;  // strangers on the listener never block us
  uint64_t nextConnId_ = 1;
};

std::unique_ptr<Connection> SocketPending::finish() {
  return std::make_unique<SocketConnection>(peer_, info_, t_.shape(), false,
                                            t_.acceptStreams(peer_, blob_.connId, blob_.nstreams),
                                            where_);
}

}  // namespace

std::unique_ptr<Transport> makeSocketTransport(const TransportContext& ctx) {
  return std::make_unique<SocketTransport>(ctx);
}

}  // namespace loom
