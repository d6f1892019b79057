#include "base/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/config.h"
#include "base/error.h"

namespace loom {

uint16_t SocketAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void SocketAddr::setPort(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

std::string SocketAddr::str() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, host,
              sizeof(host));
    return std::string(host) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, host,
              sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(port());
  }
  return "<no address>";
}

SocketAddr SocketAddr::parse(const std::string& text, const char* what) {
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      LOOM_THROW(kInvalidArgument, "%s='%s': expected [ipv6]:port", what, text.c_str());
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0)
      LOOM_THROW(kInvalidArgument, "%s='%s': expected host:port or [ipv6]:port", what,
                 text.c_str());
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  char* end = nullptr;
  long p = strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < 0 || p > 65535)
    LOOM_THROW(kInvalidArgument, "%s='%s': bad port '%s'", what, text.c_str(), port.c_str());
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res)
    LOOM_THROW(kInvalidArgument, "%s='%s': cannot resolve '%s': %s", what, text.c_str(),
               host.c_str(), gai_strerror(rc));
  SocketAddr a;
  memcpy(&a.storage, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  freeaddrinfo(res);
  a.setPort(static_cast<uint16_t>(p));
  return a;
}

bool matchIfName(const std::string& specIn, const std::string& name) {
  std::string spec = specIn;
  bool exclude = false, exact = false;
  if (!spec.empty() && spec[0] == '^') { exclude = true; spec.erase(0, 1); }
  if (!spec.empty() && spec[0] == '=') { exact = true; spec.erase(0, 1); }
  bool hit = false;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string tok = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    // NCCL allows "eth0:port"-less entries only; ignore anything after ':'.
    if (!tok.empty()) {
      if (exact ? name == tok : name.compare(0, tok.size(), tok) == 0) hit = true;
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return exclude ? !hit : hit;
}

std::vector<NetInterface> findInterfaces(const std::string& spec, int family) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throwErrno("getifaddrs");
  struct Raw { std::string name; SocketAddr addr; bool up; };
  std::vector<Raw> all;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (family != 0 && fam != family) continue;
    if (fam == AF_INET6) {
      // Link-local IPv6 needs a scope id that peers on other hosts cannot use.
      auto* s6 = reinterpret_cast<sockaddr_in6*>(i->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr)) continue;
    }
    Raw r;
    r.name = i->ifa_name;
    r.addr.len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    memcpy(&r.addr.storage, i->ifa_addr, r.addr.len);
    r.up = (i->ifa_flags & IFF_UP) && (i->ifa_flags & IFF_RUNNING);
    all.push_back(r);
  }
  freeifaddrs(list);
  std::vector<NetInterface> out;
  auto take = [&](auto pred) {
    // IPv4 first, as NCCL does unless NCCL_SOCKET_FAMILY says otherwise.
    for (int pass = 0; pass < 2; ++pass)
      for (const Raw& r : all) {
        if (!r.up || !pred(r.name)) continue;
        if ((pass == 0) != (r.addr.family() == AF_INET)) continue;
        out.push_back({r.name, r.addr});
      }
  };
  if (!spec.empty()) {
    take([&](const std::string& n) { return matchIfName(spec, n); });
  } else {
    take([](const std::string& n) { return n.rfind("docker", 0) != 0 && n.rfind("lo", 0) != 0; });
    if (out.empty()) take([](const std::string& n) { return n.rfind("lo", 0) == 0; });
  }
  return out;
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    peer_ = o.peer_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Socket Socket::listen(SocketAddr& addr, int backlog) {
  int fd = ::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throwErrno("socket(%s)", addr.str().c_str());
  Socket s(fd);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, addr.sa(), addr.len) != 0) throwErrno("bind(%s)", addr.str().c_str());
  if (::listen(fd, backlog) != 0) throwErrno("listen(%s)", addr.str().c_str());
  addr = s.localAddr();
  return s;
}

Socket Socket::connect(const SocketAddr& addr, Deadline deadline, const char* what,
                       bool retryRefused) {
  int delayMs = 1;
  for (;;) {
    int fd = ::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) throwErrno("socket for %s", what);
    Socket s(fd);
    s.peer_ = addr;
    int rc = ::connect(fd, addr.sa(), addr.len);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int pr;
      // A signal must not end the wait early: SO_ERROR reads 0 while still in progress.
      do pr = ::poll(&p, 1, deadline.pollMs());
      while (pr < 0 && errno == EINTR);
      if (pr == 0) {
        LOOM_THROW(kRemoteError, "%s: connect to %s timed out", what, addr.str().c_str());
      }
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) {
      s.setNonBlocking(false);
      s.setNoDelay();
      s.setLivenessTimeout();
      return s;
    }
    bool retry = (err == ECONNREFUSED && retryRefused) || err == ETIMEDOUT || err == ENETUNREACH ||
                 err == EHOSTUNREACH || err == ECONNRESET || err == EAGAIN;
    if (!retry || deadline.expired())
      LOOM_THROW(kRemoteError, "%s: connect to %s failed: %s", what, addr.str().c_str(),
                 strerror(err));
    usleep(delayMs * 1000);
    delayMs = delayMs < 100 ? delayMs * 2 : 100;
  }
}

int Socket::probe(const SocketAddr& addr, int timeoutMs) {
  int fd = ::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  Socket s(fd);
  int err = ::connect(fd, addr.sa(), addr.len) == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, timeoutMs) <= 0) return -1;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  }
  if (err == 0) return 1;
  return err == ECONNREFUSED ? 0 : -1;
}

Socket Socket::accept(Deadline deadline) const {
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    int pr = ::poll(&p, 1, deadline.pollMs());
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) throwErrno("poll(accept)");
    if (pr == 0) return Socket();
    SocketAddr peer;
    peer.len = sizeof(peer.storage);
    int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer.storage), &peer.len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      throwErrno("accept");
    }
    Socket s(fd);
    s.peer_ = peer;
    s.setNoDelay();
    s.setLivenessTimeout();
    return s;
  }
}

void Socket::sendAll(const void* buf, size_t len, Deadline deadline, const char* what) const {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = ::send(fd_, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd_, POLLOUT, 0};
      int pr = ::poll(&pf, 1, deadline.pollMs());
      if (pr == 0)
        LOOM_THROW(kRemoteError, "%s: send to %s timed out", what, peer_.str().c_str());
      continue;
    }
    LOOM_THROW(kRemoteError, "%s: send to %s failed: %s", what, peer_.str().c_str(),
               strerror(errno));
  }
}

void Socket::recvAll(void* buf, size_t len, Deadline deadline, const char* what) const {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = ::recv(fd_, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0)
      LOOM_THROW(kRemoteError, "%s: connection closed by %s", what, peer_.str().c_str());
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd pf{fd_, POLLIN, 0};
      int pr = ::poll(&pf, 1, deadline.pollMs());
      if (pr == 0)
        LOOM_THROW(kRemoteError, "%s: receive from %s timed out", what, peer_.str().c_str());
      continue;
    }
    LOOM_THROW(kRemoteError, "%s: receive from %s failed: %s", what, peer_.str().c_str(),
               strerror(errno));
  }
}

size_t Socket::trySend(const void* buf, size_t len, const char* what) const {
  for (;;) {
    ssize_t n = ::send(fd_, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    LOOM_THROW(kRemoteError, "%s: send to %s failed: %s", what, peer_.str().c_str(),
               strerror(errno));
  }
}

size_t Socket::tryRecv(void* buf, size_t len, const char* what, bool* eof) const {
  for (;;) {
    ssize_t n = ::recv(fd_, buf, len, MSG_DONTWAIT);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0 && eof) {
      *eof = true;
      return 0;
    }
    if (n == 0)
      LOOM_THROW(kRemoteError, "%s: connection closed by %s", what, peer_.str().c_str());
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    LOOM_THROW(kRemoteError, "%s: receive from %s failed: %s", what, peer_.str().c_str(),
               strerror(errno));
  }
}

void Socket::setNonBlocking(bool on) const {
  int flags = fcntl(fd_, F_GETFL, 0);
  fcntl(fd_, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

namespace {
IntKnob kSocketTimeout("LOOM_SOCKET_TIMEOUT", "", 8,
                       "Seconds a TCP peer may stay unreachable (sent data unacknowledged, "
                       "keepalive probes unanswered) before its connection fails: a host that "
                       "crashed or fell off the network sends no reset (0: the kernel's "
                       "defaults, many minutes)");
}  // namespace

// A dead process closes its sockets; a dead host or a cut cable does not. Keepalive
// probes find an idle connection's peer gone, TCP_USER_TIMEOUT one with data in flight;
// the peer's kernel answers both while the peer process is merely busy.
void Socket::setLivenessTimeout() const {
  static const int64_t seconds = kSocketTimeout.get();
  if (seconds <= 0) return;
  int one = 1, idle = static_cast<int>(std::max<int64_t>(1, seconds / 3)),
      intvl = static_cast<int>(std::max<int64_t>(1, seconds / 6)), cnt = 4;
  unsigned ms = static_cast<unsigned>(seconds * 1000);
  // Errors are ignored: a socket without these options still works, only detects later.
  setsockopt(fd_, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd_, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd_, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd_, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  setsockopt(fd_, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
}

void Socket::setNoDelay() const {
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void Socket::setBufferSizes(int bytes) const {
  setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

SocketAddr Socket::localAddr() const {
  SocketAddr a;
  a.len = sizeof(a.storage);
  getsockname(fd_, reinterpret_cast<sockaddr*>(&a.storage), &a.len);
  return a;
}

}  // namespace loom
