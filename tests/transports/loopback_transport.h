// A transport that exists only in the tests: ranks that are threads of one process share
// a FIFO in this process's heap, and the setup blob carries its address. It proves that a
// transport registered from outside plugs in without any change to shared code, and lets
// tests bend each hook (who it serves, what it publishes, how large its blob is).
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <string>

#include "base/error.h"
#include "transports/registry.h"

namespace loomtest {

struct LoopbackStats {
  std::atomic<int> asked{0};     // canConnect() calls
  std::atomic<int> setups{0};    // receiver ends made
  std::atomic<int> connects{0};  // sender ends made
  std::atomic<int> alive{0};     // connections not yet destroyed
};

struct LoopbackOptions {
  std::string name = "loopback";
  int priority = 50;  // ahead of shm (100)
  // Which pairs it serves, beyond "threads of one process" (always required).
  std::function<bool(const loom::PeerInfo& me, const loom::PeerInfo& peer)> admit;
  bool never = false;     // canConnect() always says no (it still counts the question)
  size_t blobBytes = 0;   // pad the setup blob to this size (0: just the pointer)
  size_t sectionBytes = 0;  // publish this many bytes in the peer info
  std::shared_ptr<LoopbackStats> stats = std::make_shared<LoopbackStats>();
};

// One FIFO in the heap, shared by a sender thread and a receiver thread; whichever end
// goes last frees it.
struct LoopbackFifo {
  explicit LoopbackFifo(loom::FifoShape s) : slots(new char[s.slotBytes * s.depth]()) {}
  std::atomic<int> refs{1};
  loom::FifoCtrl ctrl{};
  std::unique_ptr<char[]> slots;
};

struct LoopbackBlob {
  uint64_t magic;
  uint64_t pid;  // the pointer means something in this process only
  LoopbackFifo* fifo;
};
constexpr uint64_t kLoopbackMagic = 0x6c6f6f706261636bull;

class LoopbackConnection : public loom::Connection {
 public:
  LoopbackConnection(const loom::ConnRequest& req, const std::string& name, LoopbackFifo* f,
                     loom::FifoShape shape, bool sender, std::shared_ptr<LoopbackStats> stats)
      : Connection(req.peer, name, req.peerInfo, req.where), f_(f), sender_(sender),
        stats_(std::move(stats)) {
    fifo_.ctrl = &f->ctrl;
    fifo_.slots = f->slots.get();
    fifo_.slotBytes = shape.slotBytes;
    fifo_.depth = shape.depth;
    ++stats_->alive;
  }
  ~LoopbackConnection() override {
    close();
    if (--f_->refs == 0) delete f_;
    --stats_->alive;
  }
  void close() override {
    std::atomic_ref<uint32_t>(f_->ctrl.closed).store(1, std::memory_order_release);
  }
  void checkPeer() const override {
    bool waiting = sender_ ? !fifo_.canSend() : !fifo_.canRecv();
    if (waiting && std::atomic_ref<uint32_t>(f_->ctrl.closed).load(std::memory_order_acquire))
      LOOM_THROW(kRemoteError, "%s: the peer closed the connection", describe().c_str());
  }

 private:
  LoopbackFifo* f_;
  bool sender_;
  std::shared_ptr<LoopbackStats> stats_;
};

class LoopbackTransport : public loom::Transport {
 public:
  LoopbackTransport(const loom::TransportContext& ctx, LoopbackOptions opt)
      : shape_(ctx.shape), opt_(std::move(opt)) {}

  loom::Blob localInfo() override { return loom::Blob(opt_.sectionBytes, 0x5a); }

  bool canConnect(const loom::PeerInfo& me, const loom::PeerInfo& peer) const override {
    ++opt_.stats->asked;
    if (opt_.never) return false;
    bool sameProcess = me.hostHash == peer.hostHash && me.pidNs == peer.pidNs && me.pid == peer.pid;
    return sameProcess && (!opt_.admit || opt_.admit(me, peer));
  }

  std::unique_ptr<loom::PendingRecv> setup(const loom::ConnRequest& req, loom::Blob* blob) override {
    struct Pending : loom::PendingRecv {
      std::unique_ptr<loom::Connection> conn;
      std::unique_ptr<loom::Connection> finish() override { return std::move(conn); }
    };
    auto* f = new LoopbackFifo(shape_);
    auto p = std::make_unique<Pending>();
    p->conn = std::make_unique<LoopbackConnection>(req, opt_.name, f, shape_, false, opt_.stats);
    LoopbackBlob b{kLoopbackMagic, static_cast<uint64_t>(getpid()), f};
    *blob = loom::toBlob(b);
    if (opt_.blobBytes > blob->size()) blob->resize(opt_.blobBytes, 0);
    ++opt_.stats->setups;
    return p;
  }

  std::unique_ptr<loom::Connection> connect(const loom::ConnRequest& req,
                                            std::span<const uint8_t> blob) override {
    LoopbackBlob b;
    if (blob.size() < sizeof(b))
      LOOM_THROW(kRemoteError, "loopback blob of %zu bytes", blob.size());
    memcpy(&b, blob.data(), sizeof(b));
    if (b.magic != kLoopbackMagic || b.pid != static_cast<uint64_t>(getpid()))
      LOOM_THROW(kRemoteError, "loopback blob from rank %d is not from this process", req.peer);
    // The receiver holds its reference until we acknowledge: taking ours now is safe.
    ++b.fifo->refs;
    ++opt_.stats->connects;
    return std::make_unique<LoopbackConnection>(req, opt_.name, b.fifo, shape_, true, opt_.stats);
  }

 private:
  loom::FifoShape shape_;
  LoopbackOptions opt_;
};

inline loom::TransportSpec loopbackSpec(LoopbackOptions opt) {
  std::string name = opt.name;
  int priority = opt.priority;
  return {name, priority, [opt](const loom::TransportContext& ctx) {
            return std::make_unique<LoopbackTransport>(ctx, opt);
          }};
}

}  // namespace loomtest
