#include "transports/transport.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "base/config.h"
#include "base/error.h"
#include "base/host.h"
#include "base/log.h"
#include "bootstrap/hello_acceptor.h"
#include "bootstrap/wire.h"
#include "transports/shm/shm_transport.h"
#include "transports/socket/socket_transport.h"

namespace loom {
namespace {

BoolKnob kShmDisable("LOOM_SHM_DISABLE", "NCCL_SHM_DISABLE", false,
                     "Never use shared memory between ranks of one host (use TCP instead)");

constexpr uint32_t kTagInfo = 0x10000000u;
constexpr uint32_t kTagAck = 0x20000000u;
constexpr uint16_t kKindStream = 3;

struct ConnectInfo {
  uint32_t kind;
  uint32_t nstreams;
  uint64_t connId;
  char shmName[96];
};

}  // namespace

const char* transportName(TransportKind k) { return k == TransportKind::kShm ? "shm" : "socket"; }

Connection::Connection(int peer, TransportKind kind, const PeerInfo& info)
    : peer_(peer), kind_(kind), info_(info) {
  SocketAddr a;
  memcpy(&a.storage, &info.netAddr, sizeof(a.storage));
  a.len = info.netAddrLen;
  desc_ = strprintf("rank %d (%s pid %d, %s) via %s", peer, info.hostname, info.pid,
                    a.str().c_str(), transportName(kind));
}

void Connection::readRemote(void*, uint64_t, size_t) const {
  LOOM_THROW(kInternalError, "%s: transport cannot read remote memory", desc_.c_str());
}

struct TransportManager::Impl {
  Bootstrap& bootstrap;
  std::vector<PeerInfo> peers;
  FifoShape shape;
  Socket listener;
  std::unique_ptr<HelloAcceptor> acceptor;  // strangers on the listener never block us
  uint64_t nextConnId = 1;
  // Authenticated streams that arrived before we looked for them: (from, connId, stream).
  std::map<std::tuple<int, uint64_t, uint32_t>, Socket> early;

  Impl(Bootstrap& b, const std::vector<PeerInfo>& p, FifoShape s) : bootstrap(b), peers(p), shape(s) {}

  // Accepts streams until the `n` streams of connection `connId` from `from` are here.
  std::vector<Socket> acceptStreams(int from, uint64_t connId, uint32_t n) {
    Deadline deadline = Deadline::in(60);
    int me = bootstrap.rank();
    if (!acceptor)
      LOOM_THROW(kInternalError, "rank %d: the transport listener was never adopted", me);
    auto arrived = [&] {
      bool all = true;
      for (uint32_t s = 0; s < n; ++s) all &= early.count({from, connId, s}) > 0;
      return all;
    };
    while (!arrived()) {
      try {
        bootstrap.checkPeer(from, "transport setup");  // aborted, or the peer died
      } catch (const Error&) {
        // A peer may open its streams, finish its init and exit before we get here: its
        // streams are then still queued, or their hellos being read. Take those first.
        while (!arrived() && acceptor->busy()) takeStreams(100);
        if (!arrived()) throw;
        break;
      }
      if (deadline.expired())
        LOOM_THROW(kRemoteError,
                   "rank %d: timed out waiting for rank %d to open its TCP streams to %s", me,
                   from, listener.localAddr().str().c_str());
      takeStreams(100);
    }
    std::vector<Socket> out;
    for (uint32_t s = 0; s < n; ++s) {
      auto it = early.find({from, connId, s});
      out.push_back(std::move(it->second));
      early.erase(it);
    }
    return out;
  }

  // Authenticated streams the acceptor has for us, by (rank, connection, stream).
  void takeStreams(int waitMs) {
    int me = bootstrap.rank();
    for (auto& [h, sock] : acceptor->take(waitMs)) {
      auto key = std::make_tuple(h.fromRank, h.connId >> 8, static_cast<uint32_t>(h.connId & 0xff));
      if (early.count(key)) {
        LOOM_WARN("rank %d: dropped a second TCP stream claiming to be %llu/%u of rank %d from %s",
                  me, static_cast<unsigned long long>(h.connId >> 8),
                  static_cast<unsigned>(h.connId & 0xff), h.fromRank, sock.peer().str().c_str());
        continue;
      }
      early[key] = std::move(sock);
    }
  }
};

TransportManager::TransportManager(Bootstrap& bootstrap, const std::vector<PeerInfo>& peers,
                                   FifoShape shape)
    : impl_(std::make_unique<Impl>(bootstrap, peers, shape)),
      send_(peers.size() * kMaxConnsPerPeer),
      recv_(peers.size() * kMaxConnsPerPeer) {}

TransportManager::~TransportManager() = default;

PeerInfo TransportManager::localInfo(int rank, uint64_t commHash, const SocketAddr& netAddr) {
  PeerInfo p{};
  p.rank = rank;
  p.pid = getpid();
  p.hostHash = hostHash();
  p.pidNs = pidNamespace();
  p.commHash = commHash;
  memcpy(&p.netAddr, &netAddr.storage, sizeof(p.netAddr));
  p.netAddrLen = netAddr.len;
  std::string h = hostName();
  snprintf(p.hostname, sizeof(p.hostname), "%s", h.c_str());
  return p;
}

SocketAddr TransportManager::makeNetListener(Bootstrap& bootstrap, Socket* out) {
  SocketAddr a = bootstrap.iface().addr;
  a.setPort(0);
  *out = Socket::listen(a);
  return a;
}

void TransportManager::adoptNetListener(Socket listener) {
  Impl& im = *impl_;
  im.listener = std::move(listener);
  JobId job = im.bootstrap.job();
  int me = im.bootstrap.rank(), nranks = im.bootstrap.nranks();
  // From here on strangers on the listener are dropped by the acceptor's thread even
  // while no connection is being made; a replayed stream hello counts as a stranger.
  im.acceptor = std::make_unique<HelloAcceptor>(
      &im.listener,
      strprintf("rank %d transport listener %s", me, im.listener.localAddr().str().c_str()),
      [job, me, nranks, seen = std::set<std::string>()](const PeerHello& h) mutable {
        if (!verifyPeerHello(job, h, kKindStream, me) || h.fromRank < 0 || h.fromRank >= nranks)
          return false;
        return seen.insert(std::string(reinterpret_cast<const char*>(h.nonce), sizeof(h.nonce)))
            .second;
      });
}

TransportKind TransportManager::kindFor(int peer) const {
  const PeerInfo& me = impl_->peers[impl_->bootstrap.rank()];
  const PeerInfo& p = impl_->peers[peer];
  // Shared memory relies on pids (liveness, single-copy reads): one pid namespace only,
  // even when LOOM_HOSTID puts ranks of several namespaces on one "host".
  if (p.hostHash == me.hostHash && p.pidNs == me.pidNs && !kShmDisable.get())
    return TransportKind::kShm;
  return TransportKind::kSocket;
}

void TransportManager::connect(const std::vector<ConnKey>& sendKeys,
                               const std::vector<ConnKey>& recvKeys) {
  Bootstrap& bs = impl_->bootstrap;
  int me = bs.rank();
  auto slot = [](ConnKey k) { return static_cast<size_t>(k.first * kMaxConnsPerPeer + k.second); };
  auto missing = [&](const std::vector<ConnKey>& keys, const auto& table) {
    std::vector<ConnKey> out;
    for (ConnKey k : keys) {
      if (k.second < 0 || k.second >= kMaxConnsPerPeer)
        LOOM_THROW(kInternalError, "connection index %d out of range", k.second);
      if (!table[slot(k)] && std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
    }
    // Both ends walk a pair's connections in the same order.
    std::sort(out.begin(), out.end());
    return out;
  };
  std::vector<ConnKey> sends = missing(sendKeys, send_), recvs = missing(recvKeys, recv_);
  if (sends.empty() && recvs.empty()) return;

  // 1. Receivers create their end and tell the sender how to reach it.
  std::map<ConnKey, ConnectInfo> mine;
  std::map<ConnKey, std::unique_ptr<ShmConnection>> shmRecv;
  int nstreams = SocketConnection::streamCount();
  for (ConnKey k : recvs) {
    int p = k.first;
    ConnectInfo ci{};
    ci.kind = static_cast<uint32_t>(kindFor(p));
    ci.connId = impl_->nextConnId++;
    ci.nstreams = static_cast<uint32_t>(nstreams);
    if (kindFor(p) == TransportKind::kShm) {
      auto c = ShmConnection::createRecv(p, impl_->peers[p], impl_->shape, impl_->peers[me].commHash);
      snprintf(ci.shmName, sizeof(ci.shmName), "%s", c->name().c_str());
      shmRecv[k] = std::move(c);
    }
    mine[k] = ci;
    bs.send(p, kTagInfo + k.second, &ci, sizeof(ci));
  }
  // 2. Senders attach to the receiver's end, then acknowledge.
  for (ConnKey k : sends) {
    int p = k.first;
    ConnectInfo ci;
    bs.recv(p, kTagInfo + k.second, &ci, sizeof(ci));
    ci.shmName[sizeof(ci.shmName) - 1] = '\0';
    std::unique_ptr<Connection> conn;
    if (ci.kind == static_cast<uint32_t>(TransportKind::kShm)) {
      conn = ShmConnection::openSend(p, impl_->peers[p], impl_->shape, ci.shmName);
    } else {
      if (ci.nstreams < 1 || ci.nstreams > 64)
        LOOM_THROW(kRemoteError, "rank %d: rank %d asked for %u TCP streams", me, p, ci.nstreams);
      SocketAddr a;
      memcpy(&a.storage, &impl_->peers[p].netAddr, sizeof(a.storage));
      a.len = impl_->peers[p].netAddrLen;
      std::vector<Socket> streams;
      std::string what = strprintf("rank %d transport connect to rank %d", me, p);
      for (uint32_t s = 0; s < ci.nstreams; ++s) {
        // The listener was up before its address was published: refused means gone.
        Socket sock = Socket::connect(a, Deadline::in(60), what.c_str(), false);
        PeerHello h = makePeerHello(bs.job(), kKindStream, me, p, (ci.connId << 8) | s);
        sock.sendAll(&h, sizeof(h), Deadline::in(60), what.c_str());
        streams.push_back(std::move(sock));
      }
      conn = std::make_unique<SocketConnection>(p, impl_->peers[p], impl_->shape, true,
                                                std::move(streams));
      active_.push_back(conn.get());
    }
    send_[slot(k)] = std::move(conn);
    uint32_t ack = 1;
    bs.send(p, kTagAck + k.second, &ack, sizeof(ack));
    LOOM_INFO(kLogInit, "connected rank %d -> rank %d (#%d) via %s", me, p, k.second,
              transportName(send_[slot(k)]->kind()));
  }
  // 3. Receivers finish: unlink shm names (both sides have them mapped), accept streams.
  for (ConnKey k : recvs) {
    int p = k.first;
    uint32_t ack;
    bs.recv(p, kTagAck + k.second, &ack, sizeof(ack));
    const ConnectInfo& ci = mine[k];
    if (ci.kind == static_cast<uint32_t>(TransportKind::kShm)) {
      shmRecv[k]->unlinkName();
      recv_[slot(k)] = std::move(shmRecv[k]);
    } else {
      recv_[slot(k)] = std::make_unique<SocketConnection>(
          p, impl_->peers[p], impl_->shape, false, impl_->acceptStreams(p, ci.connId, ci.nstreams));
      active_.push_back(recv_[slot(k)].get());
    }
  }
}

void TransportManager::closeAll() {
  for (auto& c : send_)
    if (c) c->close();
  for (auto& c : recv_)
    if (c) c->close();
}

std::string TransportManager::summary() const {
  std::string s;
  for (size_t p = 0; p * kMaxConnsPerPeer < send_.size(); ++p) {
    const Connection* c = nullptr;
    for (int i = 0; i < kMaxConnsPerPeer && !c; ++i) {
      size_t k = p * kMaxConnsPerPeer + i;
      c = send_[k] ? send_[k].get() : recv_[k].get();
    }
    if (!c) continue;
    if (!s.empty()) s += ", ";
    s += strprintf("%zu:%s", p, transportName(c->kind()));
  }
  return s.empty() ? "none" : s;
}

}  // namespace loom
