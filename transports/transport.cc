#include "transports/transport.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>

#include "base/error.h"
#include "base/host.h"
#include "base/log.h"

namespace loom {
namespace {

constexpr uint32_t kTagInfo = 0x10000000u;
constexpr uint32_t kTagAck = 0x20000000u;

// The receiver's answer to "how do I reach your end": which transport it chose and that
// transport's blob. Fixed size, so the bootstrap's length check covers it.
// kSetupFailed in SetupMsg::transport: the receiver's setup() threw; `len` is its code,
// `error` its message, which the sender then fails with (instead of "connection closed").
constexpr uint32_t kSetupFailed = 0xffffffffu;

struct SetupMsg {
  uint32_t transport;  // index in registry order (the same on every rank: transportSet)
  uint32_t len;
  uint8_t blob[kMaxConnBlobBytes];
  char error[1024];
};

std::string names(const std::vector<TransportSpec>& specs) {
  std::string s;
  for (const auto& t : specs) s += (s.empty() ? "" : ", ") + t.name;
  return s;
}

}  // namespace

TransportManager::TransportManager(Bootstrap& bootstrap, FifoShape shape, uint64_t commHash)
    : bootstrap_(bootstrap),
      commHash_(commHash),
      specs_(registeredTransports()),
      send_(bootstrap.nranks() * kMaxConnsPerPeer),
      recv_(bootstrap.nranks() * kMaxConnsPerPeer) {
  if (specs_.size() > static_cast<size_t>(kMaxTransports))
    LOOM_THROW(kInternalError, "%zu transports registered (%s); a peer info holds %d",
               specs_.size(), names(specs_).c_str(), kMaxTransports);
  TransportContext ctx{bootstrap, shape, commHash};
  for (const TransportSpec& s : specs_) {
    transports_.push_back(s.make(ctx));
    if (!transports_.back())
      LOOM_THROW(kInternalError, "transport '%s': its factory made nothing", s.name.c_str());
  }
}

TransportManager::~TransportManager() {
  // The proxy stops calling into connections before they go; connections refer to their
  // transports (listeners, acceptor threads): they go first.
  proxy_.stop();
  active_.clear();
  buffered_.clear();
  send_.clear();
  recv_.clear();
}

PeerInfo TransportManager::localInfo() const {
  PeerInfo p{};
  p.rank = bootstrap_.rank();
  p.pid = getpid();
  p.hostHash = hostHash();
  p.pidNs = pidNamespace();
  p.commHash = commHash_;
  p.transportSet = transportSetHash(specs_);
  std::string h = hostName();
  snprintf(p.hostname, sizeof(p.hostname), "%s", h.c_str());
  for (size_t t = 0; t < transports_.size(); ++t) {
    Blob b = transports_[t]->localInfo();
    if (b.size() > kPeerSectionBytes)
      LOOM_THROW(kInternalError,
                 "transport '%s' publishes %zu bytes per rank; a peer-info section holds %zu",
                 specs_[t].name.c_str(), b.size(), kPeerSectionBytes);
    p.sections[t].len = static_cast<uint32_t>(b.size());
    if (!b.empty()) memcpy(p.sections[t].bytes, b.data(), b.size());
  }
  return p;
}

void TransportManager::setPeers(const std::vector<PeerInfo>& peers) {
  int me = bootstrap_.rank();
  uint64_t mine = transportSetHash(specs_);
  for (const PeerInfo& p : peers)
    if (p.transportSet != mine)
      LOOM_THROW(kInvalidUsage,
                 "rank %d registers the transports [%s] but rank %d a different list: every "
                 "rank of a communicator must offer the same transports",
                 me, names(specs_).c_str(), p.rank);
  for (size_t t = 0; t < transports_.size(); ++t) transports_[t]->checkPeers(peers, static_cast<int>(t));
  peers_ = peers;
  choice_.assign(peers.size(), -1);
  const PeerInfo& self = peers_[me];
  localRank_ = 0;
  localRanks_ = 0;
  for (const PeerInfo& q : peers_) {
    localRank_ += q.hostHash == self.hostHash && q.rank < self.rank;
    localRanks_ += q.hostHash == self.hostHash;
  }
}

int TransportManager::transportIndex(int peer) const {
  if (choice_[peer] >= 0) return choice_[peer];
  const PeerInfo& me = peers_[bootstrap_.rank()];
  // Decided once per peer, so every connection of a pair uses the same transport.
  for (size_t t = 0; t < transports_.size(); ++t)
    if (transports_[t]->canConnect(me, peers_[peer])) return choice_[peer] = static_cast<int>(t);
  LOOM_THROW(kInvalidUsage, "rank %d: no transport can reach rank %d (%s pid %d); tried [%s]",
             me.rank, peer, peers_[peer].hostname, peers_[peer].pid, names(specs_).c_str());
}

const std::string& TransportManager::transportFor(int peer) const {
  return specs_[transportIndex(peer)].name;
}

ConnRequest TransportManager::request(ConnKey k, int transport) const {
  int p = k.first;
  ConnRequest r{p, k.second, peers_[bootstrap_.rank()], peers_[p],
                peers_[p].sections[transport].view(), bootstrap_.peerAddr(p).str()};
  r.localRank = localRank_;
  r.localRanks = localRanks_;
  return r;
}

void TransportManager::add(std::unique_ptr<Connection>& slot, std::unique_ptr<Connection> conn) {
  if (conn->needsProgress()) {
    buffered_.push_back(conn.get());
    if (conn->progressOnProxy()) proxy_.add(conn.get());
    else active_.push_back(conn.get());
  }
  slot = std::move(conn);
}

void TransportManager::connect(const std::vector<ConnKey>& sendKeys,
                               const std::vector<ConnKey>& recvKeys) {
  int me = bootstrap_.rank();
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

  // 1. Receivers create their end and tell the sender how to reach it. A receiver whose
  // setup fails tells its sender why (and every later sender of this round too), then still
  // takes its senders' setups in step 2 without attaching, so that a peer that is both its
  // sender and its receiver has sent its own setup before this rank leaves, and reads the
  // reason instead of failing on a closed socket.
  std::map<ConnKey, std::unique_ptr<PendingRecv>> pending;
  std::exception_ptr failed;
  SetupMsg failure{};
  for (ConnKey k : recvs) {
    int p = k.first;
    if (!failed) {
      int t = transportIndex(p);
      Blob blob;
      try {
        pending[k] = transports_[t]->setup(request(k, t), &blob);
        if (blob.size() > kMaxConnBlobBytes)
          LOOM_THROW(kInternalError,
                     "rank %d: transport '%s' made a %zu-byte setup blob for rank %d; a "
                     "connection setup carries at most %zu",
                     me, specs_[t].name.c_str(), blob.size(), p, kMaxConnBlobBytes);
        SetupMsg msg{};
        msg.transport = static_cast<uint32_t>(t);
        msg.len = static_cast<uint32_t>(blob.size());
        if (!blob.empty()) memcpy(msg.blob, blob.data(), blob.size());
        bootstrap_.send(p, kTagInfo + k.second, &msg, sizeof(msg));
        continue;
      } catch (const std::exception& e) {
        failed = std::current_exception();
        const auto* err = dynamic_cast<const Error*>(&e);
        failure.transport = kSetupFailed;
        failure.len = static_cast<uint32_t>(err ? err->code() : Code::kInternalError);
        snprintf(failure.error, sizeof(failure.error), "%s", e.what());
      }
    }
    try {
      bootstrap_.send(p, kTagInfo + k.second, &failure, sizeof(failure));
    } catch (const Error&) {
      // The sender is gone too: this rank's own error is the one to report.
    }
  }
  // 2. Senders attach to the receiver's end, then acknowledge.
  for (ConnKey k : sends) {
    int p = k.first;
    SetupMsg msg;
    if (failed) {
      try {
        bootstrap_.recv(p, kTagInfo + k.second, &msg, sizeof(msg));
      } catch (const Error&) {
        // Gone: this rank fails with its own error below either way.
      }
      continue;
    }
    bootstrap_.recv(p, kTagInfo + k.second, &msg, sizeof(msg));
    if (msg.transport == kSetupFailed) {
      const bool known = msg.len >= static_cast<uint32_t>(Code::kUnhandledCudaError) &&
                         msg.len <= static_cast<uint32_t>(Code::kRemoteError);
      throw Error(known ? static_cast<Code>(msg.len) : Code::kRemoteError,
                  strprintf("rank %d: rank %d failed to set up its end of connection #%d from "
                            "this rank: %.*s",
                            me, p, k.second, static_cast<int>(strnlen(msg.error, sizeof(msg.error))),
                            msg.error));
    }
    if (msg.transport >= transports_.size() || msg.len > kMaxConnBlobBytes)
      LOOM_THROW(kRemoteError, "rank %d: rank %d sent a corrupt connection setup (transport %u, %u bytes)",
                 me, p, msg.transport, msg.len);
    int t = static_cast<int>(msg.transport);
    add(send_[slot(k)], transports_[t]->connect(request(k, t), {msg.blob, msg.len}));
    uint32_t ack = 1;
    bootstrap_.send(p, kTagAck + k.second, &ack, sizeof(ack));
    LOOM_INFO(kLogInit, "connected rank %d -> rank %d (#%d) via %s", me, p, k.second,
              specs_[t].name.c_str());
  }
  if (failed) std::rethrow_exception(failed);
  // 3. Receivers finish once their sender is attached (shm names unlinked, streams taken).
  for (ConnKey k : recvs) {
    uint32_t ack;
    bootstrap_.recv(k.first, kTagAck + k.second, &ack, sizeof(ack));
    add(recv_[slot(k)], pending[k]->finish());
  }
  // 4. Connects left to finish in the background (they needed their peer's accept) are
  // made, or the init fails with their error.
  for (ConnKey k : sends) send_[slot(k)]->awaitConnected();
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
    s += strprintf("%zu:%s", p, c->transport().c_str());
  }
  return s.empty() ? "none" : s;
}

}  // namespace loom
