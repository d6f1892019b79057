#include "transports/net/net_transport.h"

#include <strings.h>
#include <unistd.h>

#include <cstdlib>
#include <algorithm>
#include <cstring>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "base/time.h"

namespace loom {
namespace {

IntKnob kCrossNic("LOOM_CROSS_NIC", "NCCL_CROSS_NIC", 2,
                  "1: each end of a network connection uses its own rail's NIC (the NICs' rails "
                  "must be linked); 0 or 2: both ends use the receiver's rail, so a connection "
                  "never crosses rails");
IntKnob kConnectTimeout("LOOM_NET_CONNECT_TIMEOUT", "", 60,
                        "Seconds a network backend may take to connect or accept one "
                        "connection (the peer alive) before the init fails naming the pair");

}  // namespace

double netConnectTimeoutSec() { return static_cast<double>(kConnectTimeout.get()); }

namespace {

size_t ctrlBytes() { return (sizeof(FifoCtrl) + 4095) & ~size_t(4095); }
int tagOf(uint64_t step) { return static_cast<int>(step & 0x7fffffff); }

// Polls a non-blocking backend call until it yields, checking the peer between polls:
// waits of microseconds at first (a LAN connect), up to a millisecond.
template <class T, class Call, class Gone>
std::unique_ptr<T> pollUntil(Bootstrap& bs, int peer, const char* what, Call call, Gone gone) {
  int64_t limit = kConnectTimeout.get();
  Deadline deadline = Deadline::in(static_cast<double>(limit));
  unsigned us = 10;
  for (;;) {
    if (auto c = call()) return c;
    try {
      bs.checkPeer(peer, what);  // aborted, or the peer died
    } catch (const Error&) {
      // A peer may connect, finish its init and exit before we look: what it sent first
      // is still ours to take.
      for (;;) {
        bool maybe = gone();
        if (auto c = call()) return c;
        if (!maybe) throw;
        usleep(1000);
      }
    }
    if (deadline.expired())
      LOOM_THROW(kRemoteError, "rank %d: %s with rank %d timed out after %lld s "
                 "(LOOM_NET_CONNECT_TIMEOUT)", bs.rank(), what, peer, static_cast<long long>(limit));
    usleep(us);
    us = us < 1000 ? us * 2 : 1000;
  }
}

class NetTransport;

class NetPending : public PendingRecv {
 public:
  NetPending(NetTransport& t, const ConnRequest& req, std::unique_ptr<NetListenComm> listen)
      : t_(t), peer_(req.peer), info_(req.peerInfo), where_(req.where), listen_(std::move(listen)) {}
  std::unique_ptr<Connection> finish() override;

 private:
  NetTransport& t_;
  int peer_;
  const PeerInfo& info_;
  std::string where_;
  std::unique_ptr<NetListenComm> listen_;
};

class NetTransport : public Transport {
 public:
  explicit NetTransport(const TransportContext& ctx) : bs_(ctx.bootstrap), shape_(ctx.shape) {
    crossNic_ = kCrossNic.get();
    LOOM_CHECK_ARG(crossNic_ >= 0 && crossNic_ <= 2, "NCCL_CROSS_NIC=%lld: expected 0, 1 or 2",
                   static_cast<long long>(crossNic_));
    StartedNet n = startNetBackend(NetContext{bs_.job(), bs_.rank(), bs_.nranks(), bs_.iface()});
    if (!n.backend) {
      LOOM_INFO(kLogNet | kLogInit, "rank %d: NET: no network backend (no NCCL_NET, no net plugin "
                "started, no active RDMA port): ranks on other hosts are reached through the "
                "built-in socket transport", bs_.rank());
      return;
    }
    name_ = "net/" + n.name;
    LOOM_INFO(kLogNet | kLogInit, "rank %d: NET: ranks on other hosts are reached through %s",
              bs_.rank(), n.name.c_str());
    backend_ = std::shared_ptr<NetBackend>(std::move(n.backend));
  }

  // The backend this rank started ("" for none), so that a receiver can tell a sender that
  // picked another one (a handle it cannot read) before it connects.
  Blob localInfo() override {
    std::string n = published();
    return Blob(n.begin(), n.end());
  }

  // Ranks on several hosts must all have picked one network: a pair that disagrees would
  // fail at its first connection (a handle one backend cannot read), at init or in the
  // middle of a collective. Alike on every rank: rank 0 against the first rank that differs.
  void checkPeers(const std::vector<PeerInfo>& peers, int slot) const override {
    bool severalHosts = false;
    for (const PeerInfo& p : peers) severalHosts |= p.hostHash != peers[0].hostHash;
    if (!severalHosts) return;
    const std::string first = nameIn(peers[0], slot);
    for (const PeerInfo& p : peers) {
      const std::string other = nameIn(p, slot);
      if (strcasecmp(first.c_str(), other.c_str()) == 0) continue;
      LOOM_THROW(kInvalidUsage,
                 "the ranks of this communicator picked different networks: rank 0 (%s) %s, "
                 "rank %d (%s) %s. Every rank must pick the same (NCCL_NET, NCCL_NET_PLUGIN, "
                 "NCCL_IB_DISABLE; with NCCL_DEBUG=INFO each rank logs the one it picks)",
                 peers[0].hostname, uses(first).c_str(), p.rank, p.hostname, uses(other).c_str());
    }
  }

  // Every pair that shm left over, when NCCL_NET names a backend or a plugin started.
  bool canConnect(const PeerInfo&, const PeerInfo&) const override { return backend_ != nullptr; }

  // The receiver's blob: the backend's handle, then the rail (a 4-byte device index).
  std::unique_ptr<PendingRecv> setup(const ConnRequest& req, Blob* blob) override {
    // Ranks of one host (shared memory off) are not compared at init: here, per pair.
    const std::string mine = published();
    const std::string theirs(req.peerSection.begin(), req.peerSection.end());
    if (strcasecmp(mine.c_str(), theirs.c_str()) != 0)
      LOOM_THROW(kInvalidUsage,
                 "rank %d receives from rank %d (%s) through the network backend %s, but rank %d "
                 "%s: every rank must pick the same network (NCCL_NET, NCCL_NET_PLUGIN, "
                 "NCCL_IB_DISABLE; with NCCL_DEBUG=INFO each rank logs the one it picks)",
                 bs_.rank(), req.peer, req.peerInfo.hostname, mine.c_str(), req.peer,
                 uses(theirs).c_str());
    NetHandle h;
    int32_t rail = netRail(req.localRank, req.localRanks, req.index, backend_->devices());
    auto listen = backend_->listen(rail, &h);
    logRail("receives from", req, rail);
    blob->assign(h.bytes, h.bytes + sizeof(h.bytes));
    const auto* r = reinterpret_cast<const uint8_t*>(&rail);
    blob->insert(blob->end(), r, r + sizeof(rail));
    return std::make_unique<NetPending>(*this, req, std::move(listen));
  }

  std::unique_ptr<Connection> connect(const ConnRequest& req,
                                      std::span<const uint8_t> blob) override {
    if (!backend_)
      LOOM_THROW(kInvalidUsage,
                 "rank %d: rank %d reaches this rank through NCCL_NET's backend, which is not "
                 "set here: every rank must set the same NCCL_NET",
                 bs_.rank(), req.peer);
    NetHandle h;
    int32_t rail;
    if (blob.size() != sizeof(h.bytes) + sizeof(rail))
      LOOM_THROW(kRemoteError, "rank %d: rank %d sent a %zu-byte network handle, expected %zu",
                 bs_.rank(), req.peer, blob.size(), sizeof(h.bytes) + sizeof(rail));
    memcpy(h.bytes, blob.data(), sizeof(h.bytes));
    memcpy(&rail, blob.data() + sizeof(h.bytes), sizeof(rail));
    if (rail < 0)
      LOOM_THROW(kRemoteError, "rank %d: rank %d sent rail %d", bs_.rank(), req.peer, rail);
    // NCCL_CROSS_NIC=1: this end takes its own rail (a fabric whose rails are linked);
    // 0 and 2 (NCCL's "try the same NIC", always possible here): the receiver's rail.
    int dev = crossNic_ == 1
                  ? netRail(req.localRank, req.localRanks, req.index, backend_->devices())
                  : rail % backend_->devices();
    logRail("sends to", req, dev);
    std::unique_ptr<NetStage> stage;
    if (auto comm = backend_->connect(dev, h, stage))
      return std::make_unique<NetConnection>(req.peer, req.peerInfo, shape_, name_,
                                             std::move(comm), nullptr, req.where);
    return std::make_unique<NetConnection>(req.peer, req.peerInfo, shape_, name_, backend_, dev, h,
                                           std::move(stage),
                                           static_cast<double>(kConnectTimeout.get()), req.where);
  }

  std::unique_ptr<Connection> accept(int peer, const PeerInfo& info, const std::string& where,
                                     NetListenComm& listen) {
    return std::make_unique<NetConnection>(peer, info, shape_, name_, nullptr,
                                           netAccept(bs_, peer, "network accept", listen), where);
  }

 private:
  // The backend's name as published in the peer info ("" for none), cut to its section.
  std::string published() const {
    std::string n = backend_ ? name_.substr(4) : "";
    n.resize(std::min(n.size(), kPeerSectionBytes));
    return n;
  }
  static std::string nameIn(const PeerInfo& p, int slot) {
    std::span<const uint8_t> s = p.sections[slot].view();
    return std::string(s.begin(), s.end());
  }
  static std::string uses(const std::string& name) {
    return name.empty() ? "uses no network backend (no NCCL_NET, no net plugin started, no active "
                          "RDMA port: the built-in socket transport)"
                        : "uses " + name;
  }

  void logRail(const char* how, const ConnRequest& req, int dev) {
    int n = backend_->devices();
    if (n < 2) return;
    LOOM_INFO(kLogNet | kLogInit, "rank %d %s rank %d (connection %d) on %s, rail %d of %d",
              bs_.rank(), how, req.peer, req.index, backend_->properties(dev).name.c_str(), dev, n);
  }

  Bootstrap& bs_;
  FifoShape shape_;
  std::string name_;
  std::shared_ptr<NetBackend> backend_;  // null: NCCL_NET unset and no plugin started
  int64_t crossNic_ = 2;                 // NCCL_CROSS_NIC, read at init
};

std::unique_ptr<Connection> NetPending::finish() {
  return t_.accept(peer_, info_, where_, *listen_);
}

}  // namespace

NetConnection::NetConnection(int peer, const PeerInfo& info, FifoShape shape,
                             const std::string& transport, std::unique_ptr<NetSendComm> send,
                             std::unique_ptr<NetRecvComm> recv, const std::string& where,
                             const NetFifoMemory* memory)
    : Connection(peer, transport, info, where),
      sender_(send != nullptr),
      send_(std::move(send)),
      recv_(std::move(recv)) {
  allocate(shape, memory);
  attach();
}

NetConnection::NetConnection(int peer, const PeerInfo& info, FifoShape shape,
                             const std::string& transport, std::shared_ptr<NetBackend> backend,
                             int dev, const NetHandle& handle, std::unique_ptr<NetStage> stage,
                             double timeoutSec, const std::string& where,
                             const NetFifoMemory* memory)
    : Connection(peer, transport, info, where), sender_(true) {
  allocate(shape, memory);
  pending_.reset(new PendingConnect{std::move(backend), dev, handle, std::move(stage), timeoutSec,
                                    Deadline::in(timeoutSec)});
}

void NetConnection::allocate(FifoShape shape, const NetFifoMemory* memory) {
  if (memory) {
    memory_ = *memory;
  } else {
    size_t slots = shape.slotBytes * static_cast<size_t>(shape.depth);
    if (posix_memalign(&mem_, 4096, ctrlBytes() + slots) != 0)
      LOOM_THROW(kSystemError, "out of memory allocating %zu bytes for a network FIFO",
                 ctrlBytes() + slots);
    memset(mem_, 0, ctrlBytes());
    memory_.ctrl = static_cast<FifoCtrl*>(mem_);
    memory_.slots = static_cast<char*>(mem_) + ctrlBytes();
  }
  fifo_.ctrl = memory_.ctrl;
  fifo_.slots = memory_.slots;
  fifo_.slotBytes = shape.slotBytes;
  fifo_.depth = shape.depth;
}

void NetConnection::attach() {
  size_t slots = fifo_.slotBytes * static_cast<size_t>(fifo_.depth);
  if (memory_.dmabufFd >= 0)
    mr_ = send_ ? send_->regMrDmaBuf(fifo_.slots, slots, memory_.dmabufFd, memory_.dmabufOffset)
                : recv_->regMrDmaBuf(fifo_.slots, slots, memory_.dmabufFd, memory_.dmabufOffset);
  else
    mr_ = send_ ? send_->regMr(fifo_.slots, slots, memory_.type)
                : recv_->regMr(fifo_.slots, slots, memory_.type);
}

Error NetConnection::located(const Error& e) const {
  return Error(e.code(), strprintf("%s: %s", describe().c_str(), e.what()));
}

// Without mu_, which a pump holds across backend calls (a slow connect): error_ is written
// once, before failed_.
std::optional<Error> NetConnection::failure() const {
  if (!failed_.load(std::memory_order_acquire)) return std::nullopt;
  return error_;
}

bool NetConnection::finishConnect() {
  send_ = pending_->backend->connect(pending_->dev, pending_->handle, pending_->stage);
  if (!send_) {
    if (pending_->deadline.expired())
      LOOM_THROW(kRemoteError, "network connect timed out after %.0f s (LOOM_NET_CONNECT_TIMEOUT)",
                 pending_->timeoutSec);
    return false;
  }
  pending_.reset();
  attach();
  return true;
}

NetConnection::~NetConnection() {
  close();
  free(mem_);
}

void NetConnection::close() {
  std::lock_guard<std::mutex> g(mu_);
  // Registrations go before their comm; closing the comm is what the peer notices.
  mr_.reset();
  send_.reset();
  recv_.reset();
  pending_.reset();
  flushReq_ = nullptr;  // the comm's
}

bool NetConnection::progress() {
  std::lock_guard<std::mutex> g(mu_);
  if (error_ || (!send_ && !recv_ && !pending_)) return false;
  try {
    if (pending_ && !finishConnect()) return false;
    return send_ ? pumpSend() : pumpRecv();
  } catch (const Error& e) {
    error_.emplace(located(e));
    failed_.store(true, std::memory_order_release);
    return false;
  }
}

void NetConnection::awaitConnected() const {
  for (unsigned us = 10;; us = us < 1000 ? us * 2 : 1000) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (error_) throw *error_;
      if (!pending_) return;  // the proxy thread bounds a pending connect (its deadline)
    }
    usleep(us);
  }
}

void NetConnection::checkPeer() const {
  bool waiting = sender_ ? !fifo_.drained() : !fifo_.canRecv();
  if (!waiting) return;
  std::lock_guard<std::mutex> g(mu_);
  if (error_) throw *error_;
  if (postError_)  // waiting, and what may still come was posted before it failed
    throw located(*postError_);
  if (pending_) return;  // still connecting: the proxy thread bounds it
  if (!send_ && !recv_)
    LOOM_THROW(kRemoteError, "%s: the connection was closed on this rank", describe().c_str());
}

// Step s leaves as one message once the executor published it; its slot returns to the
// executor (head) only when the backend says the bytes are out of it.
bool NetConnection::pumpSend() {
  bool any = false;
  int depth = fifo_.depth;
  uint64_t tail = HostAtomics::load(fifo_.ctrl->tail);
  while (posted_ < tail) {
    const FifoSlotInfo& info = fifo_.ctrl->info[posted_ % depth];
    NetRequest* r = send_->isend(fifo_.slot(posted_), info.bytes, tagOf(posted_), mr_.get());
    if (!r) break;
    reqs_[posted_ % depth] = r;
    ++posted_;
    any = true;
  }
  uint64_t before = done_;
  size_t bytes;
  try {
    while (done_ < posted_ && send_->test(reqs_[done_ % depth], &bytes)) ++done_;
  } catch (const Error&) {
    HostAtomics::store(fifo_.ctrl->head, done_);  // what completed before the failure stands
    throw;
  }
  if (done_ != before) {
    HostAtomics::store(fifo_.ctrl->head, done_);
    any = true;
  }
  return any;
}

// A receive is posted into every slot the executor has released (s < head + depth);
// completed steps are published in order (into GPU memory: once flushed).
bool NetConnection::pumpRecv() {
  bool any = false;
  int depth = fifo_.depth;
  const uint64_t before = HostAtomics::load(fifo_.ctrl->tail);
  if (!recvError_) {
    try {
      size_t bytes;
      while (done_ < posted_ && recv_->test(reqs_[done_ % depth], &bytes)) {
        FifoSlotInfo& info = fifo_.ctrl->info[done_ % depth];
        info.bytes = bytes;
        info.remote = 0;
        ++done_;
      }
    } catch (const Error& e) {
      // A sender that finished and closed fails the receives posted ahead of its last
      // message: the steps that arrived before are still the executor's, once published
      // (flushed, in GPU memory), and only then does the error stand.
      recvError_.emplace(e);
    }
  }
  // A receive that fails to post (a plugin refusing one on a connection its peer closed)
  // ends the posting, not the receives posted before it: what they bring is published as
  // it arrives, and the error stands once they are all in, or once the executor has
  // waited for more in vain (checkPeer).
  if (!recvError_ && !postError_) {
    try {
      uint64_t head = HostAtomics::load(fifo_.ctrl->head);
      while (posted_ < head + depth) {
        NetRequest* r = recv_->irecv(fifo_.slot(posted_), fifo_.slotBytes, tagOf(posted_), mr_.get());
        if (!r) break;
        reqs_[posted_ % depth] = r;
        ++posted_;
        any = true;
      }
    } catch (const Error& e) {
      postError_.emplace(e);
    }
  }
  const uint64_t tail = flushed(done_);
  if (tail != before) {
    HostAtomics::store(fifo_.ctrl->tail, tail);
    any = true;
  }
  if (tail == done_) {
    if (recvError_) throw *recvError_;
    if (postError_ && done_ == posted_) throw *postError_;
  }
  return any || flushReq_ != nullptr;
}

// Data a NIC wrote into GPU memory is published only once a flush (iflush, one for every
// step received since the last) has made it visible to the GPU; host memory needs none.
uint64_t NetConnection::flushed(uint64_t received) {
  if (memory_.type != NetMemType::kCuda) return received;
  size_t bytes;
  if (flushReq_ && recv_->test(flushReq_, &bytes)) {
    flushReq_ = nullptr;
    flushed_ = flushing_;
  }
  if (!flushReq_ && received > flushed_) {
    // One flush covers every write the NIC made before it: that of the last step.
    const uint64_t last = received - 1;
    flushReq_ = recv_->iflush(fifo_.slot(last), std::max<uint64_t>(fifo_.ctrl->info[last % fifo_.depth].bytes, 1),
                              mr_.get());
    flushing_ = received;
    if (!flushReq_) flushed_ = received;  // nothing to flush (a NIC that writes in order)
  }
  return flushed_;
}

std::unique_ptr<NetRecvComm> netAccept(Bootstrap& bs, int peer, const char* what, NetListenComm& listen) {
  std::unique_ptr<NetStage> stage;
  return pollUntil<NetRecvComm>(
      bs, peer, what, [&] { return listen.accept(stage); }, [&] { return listen.mayStillArrive(); });
}

std::unique_ptr<Transport> makeNetTransport(const TransportContext& ctx) {
  return std::make_unique<NetTransport>(ctx);
}

}  // namespace loom
