#include "transports/socket/socket_connection.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"

namespace loom {
namespace {

IntKnob kNStreams("LOOM_SOCKET_NSTREAMS", "", 2,
                  "TCP streams per socket-transport connection; large steps are striped across "
                  "them. Unset, NCCL's NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD when either "
                  "is set");
IntKnob kSocketThreads("LOOM_SOCKET_NTHREADS", "NCCL_SOCKET_NTHREADS", 1,
                       "As NCCL: threads per TCP connection (1..16); with NCCL_NSOCKS_PERTHREAD, "
                       "Loom opens their product in TCP streams (one thread drives them), unless "
                       "LOOM_SOCKET_NSTREAMS is set");
IntKnob kSocksPerThread("LOOM_NSOCKS_PERTHREAD", "NCCL_NSOCKS_PERTHREAD", 1,
                        "As NCCL: sockets per thread of a TCP connection; see "
                        "NCCL_SOCKET_NTHREADS");

size_t ctrlBytes() { return (sizeof(FifoCtrl) + 4095) & ~size_t(4095); }

}  // namespace

int SocketConnection::streamCount() {
  if (!kNStreams.isSet() && (kSocketThreads.isSet() || kSocksPerThread.isSet())) {
    // As NCCL: at most 16 threads and 64 sockets in all, larger values clamped with a
    // warning (a job that runs on stock NCCL runs here); below 1, 1.
    const int64_t t0 = kSocketThreads.get(), s0 = kSocksPerThread.get();
    const int64_t t = std::clamp<int64_t>(t0, 1, 16);
    const int64_t s = std::clamp<int64_t>(s0, 1, 64 / t);
    if (t != t0 || s != s0) {
      static std::once_flag once;
      std::call_once(once, [&] {
        LOOM_WARN("NCCL_SOCKET_NTHREADS=%lld x NCCL_NSOCKS_PERTHREAD=%lld: using %lld x %lld (at "
                  "most 16 threads and 64 sockets, as NCCL)", static_cast<long long>(t0),
                  static_cast<long long>(s0), static_cast<long long>(t), static_cast<long long>(s));
      });
    }
    return static_cast<int>(t * s);
  }
  int64_t n = kNStreams.get();
  if (n < 1 || n > 64)
    LOOM_THROW(kInvalidArgument, "LOOM_SOCKET_NSTREAMS=%lld: expected 1..64",
               static_cast<long long>(n));
  return static_cast<int>(n);
}

SocketConnection::SocketConnection(int peer, const PeerInfo& info, FifoShape shape, bool sender,
                                   std::vector<Socket> streams, const std::string& where)
    : Connection(peer, "socket", info, where),
      sender_(sender),
      streams_(std::move(streams)),
      cursors_(streams_.size()),
      hdr_(streams_.size()),
      eof_(streams_.size(), 0) {
  size_t bytes = ctrlBytes() + shape.slotBytes * shape.depth;
  if (posix_memalign(&mem_, 4096, bytes) != 0)
    LOOM_THROW(kSystemError, "out of memory allocating %zu bytes for a socket FIFO", bytes);
  memset(mem_, 0, ctrlBytes());
  fifo_.ctrl = static_cast<FifoCtrl*>(mem_);
  fifo_.slots = static_cast<char*>(mem_) + ctrlBytes();
  fifo_.slotBytes = shape.slotBytes;
  fifo_.depth = shape.depth;
  for (auto& s : streams_) {
    s.setNonBlocking(true);
    s.setNoDelay();
  }
}

SocketConnection::~SocketConnection() {
  streams_.clear();
  free(mem_);
}

bool SocketConnection::progress() {
  bool any = false;
  for (size_t j = 0; j < streams_.size(); ++j)
    any |= sender_ ? progressSend(j) : progressRecv(j);
  if (!any) return false;
  uint64_t low = UINT64_MAX;
  for (const auto& c : cursors_) low = std::min(low, c.step);
  // A step is done only when every stream has moved its part.
  if (sender_) {
    if (low > fifo_.ctrl->head) HostAtomics::store(fifo_.ctrl->head, low);
  } else {
    if (low > fifo_.ctrl->tail) HostAtomics::store(fifo_.ctrl->tail, low);
  }
  return true;
}

void SocketConnection::close() {
  for (auto& s : streams_)
    if (s.isOpen()) ::shutdown(s.fd(), SHUT_RDWR);
}

void SocketConnection::checkPeer() const {
  // Our streams only carry data the other way: anything readable on a send stream is the
  // peer closing it.
  if (sender_)
    for (const auto& s : streams_) {
      char b;
      bool eof = false;
      if (s.tryRecv(&b, 1, describe().c_str(), &eof) > 0 || eof)
        LOOM_THROW(kRemoteError, "%s: the peer closed the connection (process exited?)",
                   describe().c_str());
    }
  // The executor waits for step fifo_.step; a closed stream that has not delivered its
  // part of that step never will.
  for (size_t j = 0; j < streams_.size(); ++j)
    if (!sender_ && eof_[j] && cursors_[j].step <= fifo_.step)
      LOOM_THROW(kRemoteError, "%s: the peer closed the connection (process exited?)",
               describe().c_str());
}

bool SocketConnection::progressSend(size_t j) {
  bool any = false;
  Cursor& c = cursors_[j];
  while (c.step < HostAtomics::load(fifo_.ctrl->tail)) {
    const FifoSlotInfo& info = fifo_.ctrl->info[c.step % fifo_.depth];
    PartHeader h{c.step, info.bytes};
    size_t begin = partBegin(info.bytes, j), end = partBegin(info.bytes, j + 1);
    size_t total = sizeof(h) + (end - begin);
    const char* payload = fifo_.slot(c.step) + begin;
    while (c.done < total) {
      size_t n;
      if (c.done < sizeof(h)) {
        n = streams_[j].trySend(reinterpret_cast<const char*>(&h) + c.done, sizeof(h) - c.done,
                                describe().c_str());
      } else {
        size_t off = c.done - sizeof(h);
        n = streams_[j].trySend(payload + off, end - begin - off, describe().c_str());
      }
      if (n == 0) return any;
      c.done += n;
      any = true;
    }
    c.step++;
    c.done = 0;
    any = true;
  }
  return any;
}

bool SocketConnection::progressRecv(size_t j) {
  bool any = false;
  if (eof_[j]) return false;
  Cursor& c = cursors_[j];
  // The slot for step s is free once the executor released step s - depth.
  while (c.step < HostAtomics::load(fifo_.ctrl->head) + fifo_.depth) {
    PartHeader& h = hdr_[j];
    while (c.done < sizeof(h)) {
      bool eof = false;
      size_t n = streams_[j].tryRecv(reinterpret_cast<char*>(&h) + c.done, sizeof(h) - c.done,
                                     describe().c_str(), c.done == 0 ? &eof : nullptr);
      if (eof) eof_[j] = 1;
      if (n == 0) return any;
      c.done += n;
      any = true;
    }
    if (h.step != c.step || h.slotBytes > fifo_.slotBytes)
      LOOM_THROW(kRemoteError, "%s: corrupt stream (step %llu, %llu bytes; expected step %llu)",
                 describe().c_str(), static_cast<unsigned long long>(h.step),
                 static_cast<unsigned long long>(h.slotBytes),
                 static_cast<unsigned long long>(c.step));
    size_t begin = partBegin(h.slotBytes, j), end = partBegin(h.slotBytes, j + 1);
    char* dst = fifo_.slot(c.step) + begin;
    while (c.done < sizeof(h) + (end - begin)) {
      size_t off = c.done - sizeof(h);
      size_t n = streams_[j].tryRecv(dst + off, end - begin - off, describe().c_str());
      if (n == 0) return any;
      c.done += n;
      any = true;
    }
    fifo_.ctrl->info[c.step % fifo_.depth].bytes = h.slotBytes;
    fifo_.ctrl->info[c.step % fifo_.depth].remote = 0;
    c.step++;
    c.done = 0;
    any = true;
  }
  return any;
}

}  // namespace loom
