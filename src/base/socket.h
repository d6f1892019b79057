// TCP sockets with bounded waits, address parsing and interface selection
// (NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY semantics).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/time.h"

namespace loom {

struct SocketAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  int family() const { return storage.ss_family; }
  uint16_t port() const;
  void setPort(uint16_t port);
  bool valid() const { return len != 0; }
  std::string str() const;  // "1.2.3.4:5" or "[::1]:5"
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }

  // "<host>:<port>" or "[<ipv6>]:<port>"; host may be a name. Throws kInvalidArgument.
  static SocketAddr parse(const std::string& text, const char* what);
};

struct NetInterface {
  std::string name;
  SocketAddr addr;
};

// Interfaces matching `spec` (NCCL_SOCKET_IFNAME syntax: "eth,ib" prefixes, "^docker"
// excludes, "=eth0" exact names) and `family` (0 = any, AF_INET, AF_INET6). An empty spec
// picks like NCCL: anything but docker* and lo, else lo.
std::vector<NetInterface> findInterfaces(const std::string& spec, int family);
bool matchIfName(const std::string& spec, const std::string& name);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_), peer_(o.peer_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool isOpen() const { return fd_ >= 0; }
  void close();
  int release() { int f = fd_; fd_ = -1; return f; }
  const SocketAddr& peer() const { return peer_; }

  // Listening socket bound to `addr` (port 0 = any); `addr` is updated with the real port.
  static Socket listen(SocketAddr& addr, int backlog = 512);
  // Connects, retrying refused/unreachable attempts until the deadline. With
  // retryRefused = false a refusal fails at once: for addresses whose listener is known to
  // exist (a peer published it), a refusal means the process behind it is gone.
  static Socket connect(const SocketAddr& addr, Deadline deadline, const char* what,
                        bool retryRefused = true);
  // One connection attempt of at most timeoutMs: 1 when something listens at addr, 0 when
  // it is refused (nothing listens), -1 when it cannot tell (time-out, unreachable).
  static int probe(const SocketAddr& addr, int timeoutMs);
  // Accepts one connection or returns an unopened Socket when the deadline passes.
  Socket accept(Deadline deadline) const;

  // Blocking transfers bounded by `deadline`; throw kRemoteError naming `what` on EOF,
  // reset or time-out.
  void sendAll(const void* buf, size_t len, Deadline deadline, const char* what) const;
  void recvAll(void* buf, size_t len, Deadline deadline, const char* what) const;

  // Non-blocking best effort: bytes moved (0 if it would block); throws on EOF/error.
  size_t trySend(const void* buf, size_t len, const char* what) const;
  // With `eof` given, an orderly close sets *eof and returns 0 instead of throwing.
  size_t tryRecv(void* buf, size_t len, const char* what, bool* eof = nullptr) const;

  void setNonBlocking(bool on) const;
  void setNoDelay() const;
  // Keepalive and TCP_USER_TIMEOUT from LOOM_SOCKET_TIMEOUT (set on every connected socket).
  void setLivenessTimeout() const;
  void setBufferSizes(int bytes) const;
  SocketAddr localAddr() const;

 private:
  int fd_ = -1;
  SocketAddr peer_;
};

}  // namespace loom
