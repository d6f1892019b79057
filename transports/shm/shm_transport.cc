#include "transports/shm/shm_transport.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "base/time.h"

namespace loom {
namespace {

BoolKnob kShmDisable("LOOM_SHM_DISABLE", "NCCL_SHM_DISABLE", false,
                     "Never use shared memory between ranks of one host (use TCP instead)");

StringKnob kCma("LOOM_SHM_CMA", "", "auto",
                "Let shared-memory peers in different processes read large messages straight "
                "from the sender's buffer (Linux cross-memory attach): one copy instead of two. "
                "auto: only where a cross-memory read is at least 2/3 as fast as memcpy here "
                "(measured once per process); 1: always; 0: never");

double bestOf(int reps, void (*fn)(char*, char*, size_t), char* a, char* b, size_t n) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    fn(a, b, n);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s < best) best = s;
  }
  return best;
}

// The copy path costs two memcpys (sender into the FIFO, receiver out of it), which run
// on two cores at once and hit caches; a cross-memory read is one copy but pins pages
// and, on some kernels and VMs, runs several times slower than memcpy. Measured on this
// process's own memory, which takes the same kernel path as a peer's.
bool cmaPaysOff() {
  constexpr size_t kBytes = 1 << 20;
  char* a = static_cast<char*>(aligned_alloc(4096, kBytes));
  char* b = static_cast<char*>(aligned_alloc(4096, kBytes));
  if (!a || !b) {
    free(a);
    free(b);
    return false;
  }
  memset(a, 1, kBytes);
  memset(b, 2, kBytes);
  double copy = bestOf(4, [](char* d, char* s, size_t n) { memcpy(d, s, n); }, b, a, kBytes);
  double cma = bestOf(4, [](char* d, char* s, size_t n) {
    iovec local{d, n}, rem{s, n};
    if (process_vm_readv(getpid(), &local, 1, &rem, 1, 0) != static_cast<ssize_t>(n))
      memset(d, 0, 1);  // fails the check below
  }, b, a, kBytes);
  bool ok = b[0] == 1 && b[kBytes - 1] == 1;
  free(a);
  free(b);
  bool use = ok && cma * 2 <= copy * 3;
  LOOM_INFO(kLogShm, "shm: cross-memory read %.1f GB/s, memcpy %.1f GB/s: %s", kBytes / cma / 1e9,
            kBytes / copy / 1e9, use ? "using it for large messages" : "copying through the FIFO");
  return use;
}

// Threads of one process read each other's buffers with memcpy: always worth it.
bool cmaEnabled(bool sameProcess) {
  std::string v = kCma.get();
  for (char& c : v) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  if (v != "auto")
    LOOM_THROW(kInvalidArgument, "LOOM_SHM_CMA=%s: expected 0, 1 or auto", kCma.get().c_str());
  if (sameProcess) return true;
  static std::once_flag once;
  static bool pays = false;
  std::call_once(once, [] { pays = cmaPaysOff(); });
  return pays;
}

size_t ctrlBytes() { return (sizeof(FifoCtrl) + 4095) & ~size_t(4095); }

}  // namespace

size_t ShmConnection::segmentBytes(FifoShape shape) {
  return ctrlBytes() + shape.slotBytes * static_cast<size_t>(shape.depth);
}

ShmConnection::ShmConnection(int peer, const PeerInfo& info, ShmSegment seg, FifoShape shape,
                             bool sender, const std::string& where)
    : Connection(peer, "shm", info, where), seg_(std::move(seg)), sender_(sender) {
  // Decided once per connection: the executor asks on every large step.
  cma_ = cmaEnabled(info.pid == getpid());
  fifo_.ctrl = static_cast<FifoCtrl*>(seg_.data());
  fifo_.slots = static_cast<char*>(seg_.data()) + ctrlBytes();
  fifo_.slotBytes = shape.slotBytes;
  fifo_.depth = shape.depth;
  if (info.pid != getpid()) pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, info.pid, 0));
}

ShmConnection::~ShmConnection() {
  close();
  if (pidfd_ >= 0) ::close(pidfd_);
}

void ShmConnection::close() {
  if (fifo_.ctrl) std::atomic_ref<uint32_t>(fifo_.ctrl->closed).store(1, std::memory_order_release);
}

std::unique_ptr<ShmConnection> ShmConnection::createRecv(int peer, const PeerInfo& info,
                                                         FifoShape shape, const std::string& where) {
  ShmSegment seg = ShmSegment::create("fifo", segmentBytes(shape));
  auto* ctrl = static_cast<FifoCtrl*>(seg.data());
  ctrl->receiverPid = static_cast<uint32_t>(getpid());
  return std::unique_ptr<ShmConnection>(
      new ShmConnection(peer, info, std::move(seg), shape, false, where));
}

std::unique_ptr<ShmConnection> ShmConnection::openSend(int peer, const PeerInfo& info,
                                                       FifoShape shape, const std::string& name,
                                                       const std::string& where) {
  ShmSegment seg = ShmSegment::open(name, segmentBytes(shape));
  // Both ends unlink once mapped: whichever gets there first, the name is gone as soon as
  // it is no longer needed, even if the creator is killed right after.
  seg.unlink();
  static_cast<FifoCtrl*>(seg.data())->senderPid = static_cast<uint32_t>(getpid());
  return std::unique_ptr<ShmConnection>(
      new ShmConnection(peer, info, std::move(seg), shape, true, where));
}

void ShmConnection::checkPeer() const {
  if (std::atomic_ref<uint32_t>(fifo_.ctrl->closed).load(std::memory_order_acquire)) {
    // The peer posts its last data before closing: only an empty FIFO means it is gone.
    bool waiting = sender_ ? !fifo_.canSend() : !fifo_.canRecv();
    if (waiting)
      LOOM_THROW(kRemoteError,
                 "%s: the peer closed the connection (it failed, aborted or was destroyed)",
                 describe().c_str());
  }
  if (peerPid_ == getpid()) return;  // a thread of this process: it cannot die alone
  // A pidfd sees an exited peer even while it is an unreaped zombie, which kill() does not.
  bool dead = false;
  if (pidfd_ >= 0) {
    pollfd p{pidfd_, POLLIN, 0};
    dead = ::poll(&p, 1, 0) > 0;
  } else {
    dead = kill(peerPid_, 0) != 0 && errno == ESRCH;
  }
  if (dead)
    LOOM_THROW(kRemoteError, "%s: the peer process (pid %d) has exited", describe().c_str(),
               peerPid_);
}

bool ShmConnection::supportsRemoteRead() const { return cma_; }

void ShmConnection::readRemote(void* dst, uint64_t remote, size_t bytes) const {
  if (peerPid_ == getpid()) {
    memcpy(dst, reinterpret_cast<const void*>(remote), bytes);
    return;
  }
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<char*>(dst) + done, bytes - done};
    iovec rem{reinterpret_cast<void*>(remote + done), bytes - done};
    ssize_t n = process_vm_readv(peerPid_, &local, 1, &rem, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      // The peer's process is gone (killed mid-collective): a dead peer, as on any transport.
      if (n < 0 && errno == ESRCH)
        LOOM_THROW(kRemoteError, "%s: the peer's process is gone (cross-memory read: %s)",
                   describe().c_str(), strerror(errno));
      LOOM_THROW(kSystemError,
                 "%s: cross-memory read of %zu bytes failed: %s (set LOOM_SHM_CMA=0 if ptrace "
                 "is restricted here)",
                 describe().c_str(), bytes, n < 0 ? strerror(errno) : "short read");
    }
    done += static_cast<size_t>(n);
  }
}

namespace {

// The receiver's segment, mapped by both ends once the sender acknowledges.
class ShmPending : public PendingRecv {
 public:
  explicit ShmPending(std::unique_ptr<ShmConnection> conn) : conn_(std::move(conn)) {}
  std::unique_ptr<Connection> finish() override {
    conn_->unlinkName();
    return std::move(conn_);
  }

 private:
  std::unique_ptr<ShmConnection> conn_;
};

class ShmTransport : public Transport {
 public:
  explicit ShmTransport(FifoShape shape) : shape_(shape) {}

  // Shared memory relies on pids (liveness, single-copy reads): one pid namespace only,
  // even when LOOM_HOSTID puts ranks of several namespaces on one "host".
  bool canConnect(const PeerInfo& me, const PeerInfo& peer) const override {
    return peer.hostHash == me.hostHash && peer.pidNs == me.pidNs && !kShmDisable.get();
  }

  std::unique_ptr<PendingRecv> setup(const ConnRequest& req, Blob* blob) override {
    auto conn = ShmConnection::createRecv(req.peer, req.peerInfo, shape_, req.where);
    const std::string& name = conn->name();
    blob->assign(name.begin(), name.end());
    return std::make_unique<ShmPending>(std::move(conn));
  }

  std::unique_ptr<Connection> connect(const ConnRequest& req,
                                      std::span<const uint8_t> blob) override {
    std::string name(blob.begin(), blob.end());
    // Only a name ShmSegment::create makes: a peer must not point us at other files.
    bool ok = name.rfind("/loom-", 0) == 0;
    for (char c : name.substr(1)) ok &= isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
    if (!ok)
      LOOM_THROW(kRemoteError, "rank %d sent a malformed shared-memory name (%zu bytes)",
                 req.peer, blob.size());
    return ShmConnection::openSend(req.peer, req.peerInfo, shape_, name, req.where);
  }

 private:
  FifoShape shape_;
};

}  // namespace

std::unique_ptr<Transport> makeShmTransport(const TransportContext& ctx) {
  return std::make_unique<ShmTransport>(ctx.shape);
}

}  // namespace loom
