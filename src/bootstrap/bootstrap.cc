#include "bootstrap/bootstrap.h"

#include <poll.h>

#include <cstring>

#include "base/config.h"
#include "base/error.h"
#include "base/hmac.h"
#include "base/log.h"
#include "bootstrap/hello_acceptor.h"
#include "bootstrap/root.h"
#include "bootstrap/wire.h"

namespace loom {
namespace {

IntKnob kBootstrapTimeout("LOOM_BOOTSTRAP_TIMEOUT", "", 120,
                          "Seconds a rank waits for the rendezvous (all ranks reaching the root) "
                          "and for any single out-of-band message");

constexpr uint32_t kMsgMagic = 0x4c4d5347;  // "LMSG"
constexpr uint16_t kKindBootstrapPeer = 2;
// The most a single out-of-band message may carry; anything larger is a corrupt stream.
constexpr uint64_t kMaxMsgBytes = 1ull << 30;
constexpr double kSliceSec = 0.1;  // wake up this often to notice an abort
constexpr uint64_t kProbeEveryNs = 500000000;  // how often a peer we wait for is probed

struct MsgHeader {
  uint32_t magic;
  uint32_t tag;
  uint64_t len;
};

}  // namespace

Bootstrap::Bootstrap(const JobId& job, int rank, int nranks, const std::atomic<bool>* abortFlag)
    : job_(job), rank_(rank), nranks_(nranks), abort_(abortFlag) {
  timeoutSec_ = static_cast<double>(kBootstrapTimeout.get());
  statusJob_ = job;
  auto key = statusKey(job);
  memcpy(statusJob_.secret, key.data(), kSecretBytes);
  iface_ = bootstrapInterface();
  SocketAddr me = iface_.addr;
  me.setPort(0);
  listener_ = Socket::listen(me);
  // Strangers are read and dropped by the acceptor's thread from now on, rendezvous
  // included; replayed hellos (a nonce seen before) count as strangers.
  acceptor_ = std::make_unique<HelloAcceptor>(
      &listener_, strprintf("rank %d bootstrap listener %s", rank, me.str().c_str()),
      [this, seen = std::set<std::string>()](const PeerHello& h) mutable {
        if (!verifyPeerHello(job_, h, kKindBootstrapPeer, rank_) || h.fromRank < 0 ||
            h.fromRank >= nranks_)
          return false;
        return seen.insert(std::string(reinterpret_cast<const char*>(h.nonce), sizeof(h.nonce)))
            .second;
      },
      [this](const PeerHello& h, const Socket& s) { return serveStatus(h, s); });
  peers_.resize(nranks);
  out_.resize(nranks);
  in_.resize(nranks);
  stash_.resize(nranks);

  RootHello h{};
  h.magic = kUniqueIdMagic;
  h.version = kWireVersion;
  h.kind = 1;
  h.rank = rank;
  h.nranks = nranks;
  randomBytes(h.nonce, sizeof(h.nonce));
  memcpy(h.listen, &me.storage, sizeof(me.storage));
  h.listenLen = me.len;
  Digest mac = helloMac(job_, h);
  memcpy(h.mac, mac.data(), 32);

  Deadline deadline = Deadline::in(timeoutSec_);
  std::string what = strprintf("rank %d/%d bootstrap rendezvous with root %s", rank, nranks,
                               job_.root.str().c_str());
  Socket root = Socket::connect(job_.root, deadline, what.c_str());
  root.sendAll(&h, sizeof(h), deadline, what.c_str());
  RootReplyHeader r;
  // Wait in slices so an abort from another thread is noticed.
  for (;;) {
    checkAbort("bootstrap rendezvous", -1);
    pollfd p{root.fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(kSliceSec * 1000)) > 0) break;
    if (deadline.expired())
      LOOM_THROW(kRemoteError,
                 "%s: timed out after %.0f s waiting for all %d ranks to join (raise "
                 "LOOM_BOOTSTRAP_TIMEOUT if ranks start slowly)",
                 what.c_str(), timeoutSec_, nranks);
  }
  root.recvAll(&r, sizeof(r), deadline, what.c_str());
  if (r.magic != kUniqueIdMagic || r.version != kWireVersion)
    LOOM_THROW(kRemoteError, "%s: the root answered with a malformed reply", what.c_str());
  if (r.status != 0) {
    Digest want = replyMac(job_, h, r, nullptr, 0), got0;
    memcpy(got0.data(), r.mac, 32);
    if (!digestEqual(want, got0))
      LOOM_THROW(kRemoteError, "%s: the root's reply failed authentication", what.c_str());
  }
  if (r.status == 1)
    LOOM_THROW(kInvalidUsage, "%s: other ranks joined this unique id with nranks=%d", what.c_str(),
               r.nranks);
  if (r.status == 3)
    LOOM_THROW(kRemoteError,
               "%s: rank %d connected to the root and then went away (process died?) before "
               "all ranks arrived",
               what.c_str(), r.nranks);
  if (r.status == 2)
    LOOM_THROW(kInvalidUsage, "%s: another process already joined as rank %d", what.c_str(), rank);
  if (r.status == 4)
    LOOM_THROW(kRemoteError,
               "%s: the process that made this unique id cancelled the rendezvous (for an id "
               "from ncclCommGetUniqueId: the existing ranks' ncclCommGrow failed, or their "
               "communicator was destroyed before the grow; its error says why)",
               what.c_str());
  if (r.nranks != nranks)
    LOOM_THROW(kRemoteError, "%s: root reports nranks=%d", what.c_str(), r.nranks);
  std::vector<sockaddr_storage> table(nranks);
  root.recvAll(table.data(), table.size() * sizeof(sockaddr_storage), deadline, what.c_str());
  Digest expect = replyMac(job_, h, r, table.data(), table.size() * sizeof(sockaddr_storage));
  Digest got;
  memcpy(got.data(), r.mac, 32);
  if (!digestEqual(expect, got))
    LOOM_THROW(kRemoteError, "%s: the root's reply failed authentication", what.c_str());
  for (int i = 0; i < nranks; ++i) {
    memcpy(&peers_[i].storage, &table[i], sizeof(table[i]));
    peers_[i].len = peers_[i].family() == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  }
  LOOM_INFO(kLogBootstrap, "rank %d/%d bootstrap ready on %s (%s)", rank, nranks,
            me.str().c_str(), iface_.name.c_str());
}

// The acceptor's thread goes first: it serves status queries with members declared after it
// (statusSource_, statusMu_, peers_).
Bootstrap::~Bootstrap() { acceptor_.reset(); }

void Bootstrap::checkAbort(const char* what, int peer) const {
  if (abort_ && abort_->load(std::memory_order_relaxed)) {
    if (peer >= 0)
      LOOM_THROW(kInvalidUsage, "rank %d: %s with rank %d interrupted: communicator aborted", rank_,
                 what, peer);
    LOOM_THROW(kInvalidUsage, "rank %d: %s interrupted: communicator aborted", rank_, what);
  }
}

Deadline Bootstrap::opDeadline() const { return Deadline::in(timeoutSec_); }

Socket& Bootstrap::sendSocket(int peer) {
  if (!out_[peer].isOpen()) {
    std::string what = strprintf("rank %d bootstrap connect to rank %d", rank_, peer);
    // The peer's listener existed before its address was published: a refusal means the
    // peer is gone, not that it is slow, so it fails at once.
    Socket s = Socket::connect(peers_[peer], opDeadline(), what.c_str(), false);
    PeerHello h = makePeerHello(job_, kKindBootstrapPeer, rank_, peer, 0);
    s.sendAll(&h, sizeof(h), opDeadline(), what.c_str());
    out_[peer] = std::move(s);
  }
  return out_[peer];
}

void Bootstrap::send(int peer, uint32_t tag, const void* data, size_t len) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  LOOM_ASSERT(peer >= 0 && peer < nranks_);
  checkAbort("bootstrap send", peer);
  Socket& s = sendSocket(peer);
  MsgHeader h{kMsgMagic, tag, len};
  std::string what = strprintf("rank %d bootstrap send to rank %d (%s)", rank_, peer,
                               peers_[peer].str().c_str());
  Deadline d = opDeadline();
  s.sendAll(&h, sizeof(h), d, what.c_str());
  if (len) s.sendAll(data, len, d, what.c_str());
}

void Bootstrap::acceptSome(int waitMs) {
  for (auto& [h, s] : acceptor_->take(waitMs)) {
    if (in_[h.fromRank].isOpen()) {
      LOOM_WARN("rank %d: dropped a second bootstrap connection claiming rank %d from %s",
                rank_, h.fromRank, s.peer().str().c_str());
      continue;
    }
    in_[h.fromRank] = std::move(s);
  }
}

void Bootstrap::checkPeer(int peer, const char* what) {
  checkAbort(what, peer);
  if (liveness_) liveness_(peer);
}

void Bootstrap::probePeer(int peer) {
  if (Socket::probe(peers_[peer], 200) == 0)
    LOOM_THROW(kRemoteError,
               "rank %d: rank %d (%s) is gone: nothing listens at its bootstrap address any more "
               "(the process died or destroyed its communicator)",
               rank_, peer, peers_[peer].str().c_str());
}

Socket& Bootstrap::recvSocket(int peer, Deadline deadline) {
  uint64_t nextProbeNs = nowNs() + kProbeEveryNs;
  while (!in_[peer].isOpen()) {
    checkAbort("bootstrap receive", peer);
    if (deadline.expired())
      LOOM_THROW(kRemoteError,
                 "rank %d: timed out after %.0f s waiting for rank %d (%s) to connect for an "
                 "out-of-band message",
                 rank_, timeoutSec_, peer, peers_[peer].str().c_str());
    acceptSome(static_cast<int>(kSliceSec * 1000));
    if (in_[peer].isOpen()) break;
    try {
      if (liveness_) liveness_(peer);
      // Before the liveness check exists (the first all-gather), and for peers on other
      // hosts, a peer that died before connecting to us is seen by its closed listener.
      if (nowNs() >= nextProbeNs) {
        probePeer(peer);
        nextProbeNs = nowNs() + kProbeEveryNs;
      }
    } catch (const Error&) {
      // A peer may connect, send and exit before we look: its connection may still be
      // going through the acceptor. Only once that is empty is the peer really lost.
      if (acceptor_->busy()) continue;
      acceptSome(0);
      if (!in_[peer].isOpen()) throw;
    }
  }
  return in_[peer];
}

void Bootstrap::readMsg(int peer, Deadline deadline) {
  Socket& s = recvSocket(peer, deadline);
  std::string what = strprintf("rank %d bootstrap receive from rank %d (%s)", rank_, peer,
                               peers_[peer].str().c_str());
  for (;;) {
    checkAbort("bootstrap receive", peer);
    // Accept other peers meanwhile so their connects never wait on us.
    acceptSome(0);
    pollfd p{s.fd(), POLLIN, 0};
    if (::poll(&p, 1, 20) > 0) break;
    if (liveness_) {
      try {
        liveness_(peer);  // nothing to read: is the peer still there to send it?
      } catch (const Error&) {
        // It may have sent its message and exited since we looked.
        if (::poll(&p, 1, 0) > 0) break;
        throw;
      }
    }
    if (deadline.expired())
      LOOM_THROW(kRemoteError, "%s: timed out after %.0f s", what.c_str(), timeoutSec_);
  }
  MsgHeader h;
  s.recvAll(&h, sizeof(h), deadline, what.c_str());
  if (h.magic != kMsgMagic || h.len > kMaxMsgBytes)
    LOOM_THROW(kRemoteError, "%s: corrupt out-of-band message header", what.c_str());
  Msg m{h.tag, std::vector<uint8_t>(h.len)};
  if (h.len) s.recvAll(m.data.data(), h.len, deadline, what.c_str());
  stash_[peer].push_back(std::move(m));
}

void Bootstrap::recv(int peer, uint32_t tag, void* data, size_t len) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  LOOM_ASSERT(peer >= 0 && peer < nranks_);
  Deadline deadline = opDeadline();
  for (;;) {
    auto& q = stash_[peer];
    for (auto it = q.begin(); it != q.end(); ++it) {
      if (it->tag != tag) continue;
      if (it->data.size() != len)
        LOOM_THROW(kInternalError,
                   "rank %d: out-of-band message %#x from rank %d has %zu bytes, expected %zu",
                   rank_, tag, peer, it->data.size(), len);
      if (len) memcpy(data, it->data.data(), len);
      q.erase(it);
      return;
    }
    readMsg(peer, deadline);
  }
}

void Bootstrap::allGather(void* allData, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  uint32_t base = kUserTagLimit + ((collSeq_++ & 0xffffu) << 8);
  auto* data = static_cast<uint8_t*>(allData);
  int next = (rank_ + 1) % nranks_, prev = (rank_ + nranks_ - 1) % nranks_;
  // Ring: at step i pass on the slot received at step i-1 (our own at step 0).
  for (int i = 0; i < nranks_ - 1; ++i) {
    int sendSlot = (rank_ - i + nranks_) % nranks_;
    int recvSlot = (rank_ - i - 1 + nranks_) % nranks_;
    send(next, base + (i & 0xff), data + sendSlot * bytes, bytes);
    recv(prev, base + (i & 0xff), data + recvSlot * bytes, bytes);
  }
}

void Bootstrap::barrier() {
  std::vector<uint8_t> v(nranks_);
  allGather(v.data(), 1);
}

}  // namespace loom

namespace loom {

std::array<uint8_t, 32> Bootstrap::statusKey(const JobId& job) {
  static const char kLabel[] = "loom-status-key";
  return hmacSha256(job.secret, kSecretBytes, kLabel, sizeof(kLabel) - 1);
}

void Bootstrap::setStatusSource(std::function<std::string(uint64_t)> source) {
  std::lock_guard<std::mutex> lock(statusMu_);
  statusSource_ = std::move(source);
}

// On the acceptor's thread. Replay protection is not needed: a status reply reveals
// nothing the key does not already give access to.
bool Bootstrap::serveStatus(const PeerHello& h, const Socket& s) {
  if (h.kind != kStatusHelloKind || !verifyPeerHello(statusJob_, h, kStatusHelloKind, rank_))
    return false;
  std::string payload;
  {
    std::lock_guard<std::mutex> lock(statusMu_);
    if (statusSource_) payload = statusSource_(h.connId);
  }
  uint32_t len = static_cast<uint32_t>(payload.size());
  Deadline d = Deadline::in(1.0);
  s.sendAll(&len, sizeof(len), d, "status reply");
  s.sendAll(payload.data(), payload.size(), d, "status reply");
  return true;
}

std::string Bootstrap::queryStatus(int peer, double timeoutSec, uint64_t detail) {
  return queryStatusAt(statusTarget(peer), timeoutSec, detail);
}

std::string Bootstrap::queryStatusAt(const StatusTarget& t, double timeoutSec, uint64_t detail) {
  try {
    Deadline d = Deadline::in(timeoutSec);
    Socket s = Socket::connect(t.addr, d, "status query", false);
    PeerHello h = makePeerHello(t.statusJob, kStatusHelloKind, t.from, t.to, detail);
    s.sendAll(&h, sizeof(h), d, "status query");
    uint32_t len = 0;
    s.recvAll(&len, sizeof(len), d, "status reply");
    if (len > (1u << 20)) return "";
    std::string payload(len, '\0');
    s.recvAll(payload.data(), len, d, "status reply");
    return payload;
  } catch (const Error&) {
    return "";
  }
}

}  // namespace loom
