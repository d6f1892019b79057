#include "transports/shm/shm_transport.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/config.h"
#include "base/error.h"

namespace loom {
namespace {

BoolKnob kCma("LOOM_SHM_CMA", "", true,
              "Let shared-memory peers in different processes read large messages straight "
              "from the sender's buffer (Linux cross-memory attach): one copy instead of two");

size_t ctrlBytes() { return (sizeof(FifoCtrl) + 4095) & ~size_t(4095); }

}  // namespace

size_t ShmConnection::segmentBytes(FifoShape shape) {
  return ctrlBytes() + shape.slotBytes * static_cast<size_t>(shape.depth);
}

ShmConnection::ShmConnection(int peer, const PeerInfo& info, ShmSegment seg, FifoShape shape,
                             bool sender)
    : Connection(peer, TransportKind::kShm, info), seg_(std::move(seg)), sender_(sender) {
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
                                                         FifoShape shape, uint64_t commHash) {
  ShmSegment seg = ShmSegment::create("fifo", segmentBytes(shape));
  auto* ctrl = static_cast<FifoCtrl*>(seg.data());
  ctrl->receiverPid = static_cast<uint32_t>(getpid());
  (void)commHash;
  return std::unique_ptr<ShmConnection>(new ShmConnection(peer, info, std::move(seg), shape, false));
}

std::unique_ptr<ShmConnection> ShmConnection::openSend(int peer, const PeerInfo& info,
                                                       FifoShape shape, const std::string& name) {
  ShmSegment seg = ShmSegment::open(name, segmentBytes(shape));
  // Both ends unlink once mapped: whichever gets there first, the name is gone as soon as
  // it is no longer needed, even if the creator is killed right after.
  seg.unlink();
  static_cast<FifoCtrl*>(seg.data())->senderPid = static_cast<uint32_t>(getpid());
  return std::unique_ptr<ShmConnection>(new ShmConnection(peer, info, std::move(seg), shape, true));
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
  if (info_.pid == getpid()) return;  // a thread of this process: it cannot die alone
  // A pidfd sees an exited peer even while it is an unreaped zombie, which kill() does not.
  bool dead = false;
  if (pidfd_ >= 0) {
    pollfd p{pidfd_, POLLIN, 0};
    dead = ::poll(&p, 1, 0) > 0;
  } else {
    dead = kill(info_.pid, 0) != 0 && errno == ESRCH;
  }
  if (dead)
    LOOM_THROW(kRemoteError, "%s: the peer process (pid %d) has exited", describe().c_str(),
               info_.pid);
}

bool ShmConnection::supportsRemoteRead() const { return kCma.get(); }

void ShmConnection::readRemote(void* dst, uint64_t remote, size_t bytes) const {
  if (info_.pid == getpid()) {
    memcpy(dst, reinterpret_cast<const void*>(remote), bytes);
    return;
  }
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<char*>(dst) + done, bytes - done};
    iovec rem{reinterpret_cast<void*>(remote + done), bytes - done};
    ssize_t n = process_vm_readv(info_.pid, &local, 1, &rem, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      LOOM_THROW(kSystemError,
                 "%s: cross-memory read of %zu bytes failed: %s (set LOOM_SHM_CMA=0 if ptrace "
                 "is restricted here)",
                 describe().c_str(), bytes, n < 0 ? strerror(errno) : "short read");
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace loom
