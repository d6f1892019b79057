#include "transports/net/tcp_backend.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/time.h"
#include "bootstrap/wire.h"
#include "transports/net/listener.h"
#include "transports/socket/hello_stream.h"
#include "transports/socket/socket_connection.h"
#include "transports/socket/stream_acceptor.h"

namespace loom {
namespace {

constexpr uint16_t kKindNet = 4;  // PeerHello kind of a net stream: never a socket-transport one
constexpr uint32_t kHandleMagic = 0x4c4e5450;  // "LNTP"
// Requests in flight per comm, as NCCL_NET_MAX_REQUESTS (more than any FIFO's depth).
constexpr uint64_t kMaxRequests = 32;

struct TcpHandle {
  uint32_t magic;
  uint32_t nstreams;
  int32_t rank;  // the listening rank: hellos are addressed to it
  uint64_t connId;
  HandleAddr addr;  // the listener's
};
static_assert(sizeof(TcpHandle) <= kNetHandleBytes);

// Each stream carries its part of every message behind this header.
struct PartHeader {
  uint64_t seq;    // the message's number on this comm
  uint64_t bytes;  // the whole message's size
};

size_t partBegin(uint64_t bytes, size_t j, size_t n) { return bytes * j / n; }

class TcpMr : public NetMr {};

struct TcpRequest : NetRequest {
  uint64_t seq = 0;
  char* data = nullptr;
  size_t bytes = 0;     // send: the size; receive: what arrived
  size_t capacity = 0;  // receive only
  bool busy = false;    // handed out and not yet reported complete
};

// Requests by message number; a slot is reused once test() has reported its request.
class RequestRing {
 public:
  TcpRequest* post() {
    TcpRequest& r = reqs_[next_ % kMaxRequests];
    if (r.busy) return nullptr;
    r.busy = true;
    r.seq = next_++;
    return &r;
  }
  uint64_t posted() const { return next_; }
  TcpRequest& at(uint64_t seq) { return reqs_[seq % kMaxRequests]; }
  TcpRequest* check(NetRequest* req, const std::string& who) {
    auto* r = static_cast<TcpRequest*>(req);
    if (r < reqs_ || r >= reqs_ + kMaxRequests || !r->busy)
      LOOM_THROW(kInternalError, "%s: tested a request that is not in flight on this comm",
                 who.c_str());
    return r;
  }

 private:
  TcpRequest reqs_[kMaxRequests];
  uint64_t next_ = 0;
};

struct Cursor {
  uint64_t seq = 0;  // messages this stream has moved its part of
  size_t done = 0;   // bytes of header + part moved for `seq`
  PartHeader hdr{};  // receive: the header being read
  bool eof = false;  // receive: the peer closed this stream between messages
};

// Comm state common to both directions: the streams, the requests, one cursor per stream.
class TcpComm {
 protected:
  TcpComm(std::vector<Socket> streams, std::string who)
      : streams_(std::move(streams)), cur_(streams_.size()), who_(std::move(who)) {
    for (auto& s : streams_) {
      s.setNonBlocking(true);
      s.setNoDelay();
    }
  }
  ~TcpComm() {
    for (auto& s : streams_)
      if (s.isOpen()) ::shutdown(s.fd(), SHUT_RDWR);
  }
  // A message is complete once every stream has moved its part.
  uint64_t low() const {
    uint64_t m = UINT64_MAX;
    for (const Cursor& c : cur_) m = std::min(m, c.seq);
    return m;
  }
  size_t part(uint64_t bytes, size_t j) const { return partBegin(bytes, j, streams_.size()); }

  std::vector<Socket> streams_;
  std::vector<Cursor> cur_;
  RequestRing ring_;
  std::string who_;
};

class TcpSendComm : public NetSendComm, TcpComm {
 public:
  TcpSendComm(std::vector<Socket> streams, std::string who)
      : TcpComm(std::move(streams), std::move(who)) {}

  std::unique_ptr<NetMr> regMr(void*, size_t, NetMemType type) override {
    if (type != NetMemType::kHost)
      LOOM_THROW(kInvalidUsage, "%s: the TCP backend sends host memory only", who_.c_str());
    return std::make_unique<TcpMr>();
  }

  NetRequest* isend(const void* data, size_t bytes, int, NetMr*) override {
    TcpRequest* r = ring_.post();
    if (!r) return nullptr;
    r->data = const_cast<char*>(static_cast<const char*>(data));
    r->bytes = bytes;
    progress();  // small messages leave at once
    return r;
  }

  bool test(NetRequest* req, size_t* bytes) override {
    TcpRequest* r = ring_.check(req, who_);
    if (r->seq >= low()) progress();
    if (r->seq >= low()) return false;
    *bytes = r->bytes;
    r->busy = false;
    return true;
  }

 private:
  void progress() {
    for (size_t j = 0; j < streams_.size(); ++j) pushStream(j);
  }

  void pushStream(size_t j) {
    Cursor& c = cur_[j];
    while (c.seq < ring_.posted()) {
      const TcpRequest& r = ring_.at(c.seq);
      PartHeader h{c.seq, r.bytes};
      size_t b = part(r.bytes, j), e = part(r.bytes, j + 1);
      while (c.done < sizeof(h) + (e - b)) {
        // Header and payload in one system call where both remain.
        iovec iov[2];
        int n = 0;
        if (c.done < sizeof(h))
          iov[n++] = {reinterpret_cast<char*>(&h) + c.done, sizeof(h) - c.done};
        size_t off = c.done > sizeof(h) ? c.done - sizeof(h) : 0;
        if (e - b > off) iov[n++] = {r.data + b + off, e - b - off};
        size_t moved = sendv(streams_[j], iov, n);
        if (moved == 0) return;
        c.done += moved;
      }
      c.seq++;
      c.done = 0;
    }
  }

  size_t sendv(const Socket& s, iovec* iov, int n) {
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(n);
    for (;;) {
      ssize_t k = ::sendmsg(s.fd(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k >= 0) return static_cast<size_t>(k);
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      LOOM_THROW(kRemoteError, "%s: send failed: %s (the peer closed the connection or its "
                 "host is unreachable)", who_.c_str(), strerror(errno));
    }
  }
};

class TcpRecvComm : public NetRecvComm, TcpComm {
 public:
  TcpRecvComm(std::vector<Socket> streams, std::string who)
      : TcpComm(std::move(streams), std::move(who)) {}

  std::unique_ptr<NetMr> regMr(void*, size_t, NetMemType type) override {
    if (type != NetMemType::kHost)
      LOOM_THROW(kInvalidUsage, "%s: the TCP backend receives into host memory only",
                 who_.c_str());
    return std::make_unique<TcpMr>();
  }

  NetRequest* irecv(void* data, size_t capacity, int, NetMr*) override {
    TcpRequest* r = ring_.post();
    if (!r) return nullptr;
    r->data = static_cast<char*>(data);
    r->capacity = capacity;
    r->bytes = 0;
    return r;
  }

  // Host memory written by the kernel: nothing to flush.
  NetRequest* iflush(void*, size_t, NetMr*) override { return nullptr; }

  bool test(NetRequest* req, size_t* bytes) override {
    TcpRequest* r = ring_.check(req, who_);
    if (r->seq >= low()) progress();
    if (r->seq < low()) {
      *bytes = r->bytes;
      r->busy = false;
      return true;
    }
    // A stream the peer closed between messages will never bring its part of this one.
    for (const Cursor& c : cur_)
      if (c.eof && c.seq <= r->seq)
        LOOM_THROW(kRemoteError, "%s: the peer closed the connection (process exited?)",
                   who_.c_str());
    return false;
  }

 private:
  void progress() {
    for (size_t j = 0; j < streams_.size(); ++j) pullStream(j);
  }

  void pullStream(size_t j) {
    Cursor& c = cur_[j];
    while (!c.eof && c.seq < ring_.posted()) {
      TcpRequest& r = ring_.at(c.seq);
      while (c.done < sizeof(c.hdr)) {
        bool eof = false;
        size_t n = streams_[j].tryRecv(reinterpret_cast<char*>(&c.hdr) + c.done,
                                       sizeof(c.hdr) - c.done, who_.c_str(),
                                       c.done == 0 ? &eof : nullptr);
        if (eof) c.eof = true;
        if (n == 0) return;
        c.done += n;
      }
      if (c.hdr.seq != c.seq)
        LOOM_THROW(kRemoteError, "%s: corrupt stream (message %llu where %llu was due)",
                   who_.c_str(), static_cast<unsigned long long>(c.hdr.seq),
                   static_cast<unsigned long long>(c.seq));
      if (c.hdr.bytes > r.capacity)
        LOOM_THROW(kRemoteError, "%s: a %llu-byte message arrived for a %zu-byte receive",
                   who_.c_str(), static_cast<unsigned long long>(c.hdr.bytes), r.capacity);
      size_t b = part(c.hdr.bytes, j), e = part(c.hdr.bytes, j + 1);
      while (c.done < sizeof(c.hdr) + (e - b)) {
        size_t off = c.done - sizeof(c.hdr);
        size_t n = streams_[j].tryRecv(r.data + b + off, e - b - off, who_.c_str());
        if (n == 0) return;
        c.done += n;
      }
      r.bytes = c.hdr.bytes;
      c.seq++;
      c.done = 0;
    }
  }
};

class TcpListenComm : public NetListenComm {
 public:
  TcpListenComm(StreamAcceptor& acceptor, uint64_t connId, uint32_t nstreams, std::string who)
      : acceptor_(acceptor), connId_(connId), nstreams_(nstreams), who_(std::move(who)) {}

  std::unique_ptr<NetRecvComm> accept(std::unique_ptr<NetStage>&) override {
    auto got = acceptor_.tryTake(-1, connId_, nstreams_, 0);
    if (!got) return nullptr;
    std::string who = strprintf("%s from %s", who_.c_str(), (*got)[0].peer().str().c_str());
    return std::make_unique<TcpRecvComm>(std::move(*got), who);
  }
  bool mayStillArrive() const override { return acceptor_.busy(); }

 private:
  StreamAcceptor& acceptor_;
  uint64_t connId_;
  uint32_t nstreams_;
  std::string who_;
};

// A connect in progress: each stream connects, then sends its hello, without blocking.
struct TcpConnectStage : NetStage {
  std::vector<HelloStream> streams;
  Deadline deadline = Deadline::in(60);
};

class TcpBackend : public BootstrapIfaceBackend {
 public:
  explicit TcpBackend(const NetContext& ctx)
      : BootstrapIfaceBackend(ctx, "TCP", kKindNet, "net listener") {}

  std::unique_ptr<NetListenComm> listen(int dev, NetHandle* handle) override {
    checkDev(dev);
    TcpHandle h{};
    h.magic = kHandleMagic;
    h.nstreams = static_cast<uint32_t>(SocketConnection::streamCount());
    h.rank = ctx_.rank;
    h.connId = nextConnId();
    h.addr.set(acceptor().addr(), ctx_.rank);
    memset(handle->bytes, 0, sizeof(handle->bytes));
    memcpy(handle->bytes, &h, sizeof(h));
    return std::make_unique<TcpListenComm>(
        acceptor(), h.connId, h.nstreams,
        strprintf("rank %d TCP net connection #%llu", ctx_.rank,
                  static_cast<unsigned long long>(h.connId)));
  }

  std::unique_ptr<NetSendComm> connect(int dev, const NetHandle& handle,
                                       std::unique_ptr<NetStage>& stage) override {
    checkDev(dev);
    TcpHandle h;
    memcpy(&h, handle.bytes, sizeof(h));
    SocketAddr a;
    bool ok = h.magic == kHandleMagic && h.nstreams >= 1 &&
              h.nstreams <= StreamAcceptor::kMaxStreams && h.rank >= 0 && h.rank < ctx_.nranks &&
              h.addr.get(&a);
    if (!ok) LOOM_THROW(kRemoteError, "rank %d: malformed TCP net handle", ctx_.rank);
    std::string who = strprintf("rank %d TCP net connection #%llu to rank %d at %s", ctx_.rank,
                                static_cast<unsigned long long>(h.connId), h.rank,
                                a.str().c_str());
    if (!stage) stage = start(h, a, who);
    auto& st = static_cast<TcpConnectStage&>(*stage);
    bool all = true;
    for (HelloStream& s : st.streams) all &= s.advance();
    if (!all) {
      if (st.deadline.expired())
        LOOM_THROW(kRemoteError, "%s: connect timed out", who.c_str());
      return nullptr;
    }
    std::vector<Socket> socks;
    for (HelloStream& s : st.streams) socks.push_back(s.take());
    stage.reset();
    return std::make_unique<TcpSendComm>(std::move(socks), who);
  }

 private:
  std::unique_ptr<NetStage> start(const TcpHandle& h, const SocketAddr& a, const std::string& who) {
    auto st = std::make_unique<TcpConnectStage>();
    for (uint32_t s = 0; s < h.nstreams; ++s)
      st->streams.emplace_back(a, makePeerHello(ctx_.job, kKindNet, ctx_.rank, h.rank,
                                                StreamAcceptor::streamId(h.connId, s)),
                               who);
    return st;
  }

};

}  // namespace

std::unique_ptr<NetBackend> makeTcpNetBackend(const NetContext& ctx) {
  return std::make_unique<TcpBackend>(ctx);
}

std::unique_ptr<NetRecvComm> makeTcpRecvComm(std::vector<Socket> streams, std::string who) {
  return std::make_unique<TcpRecvComm>(std::move(streams), std::move(who));
}

}  // namespace loom
