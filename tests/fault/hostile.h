// Hostile clients for the listeners of a job's ranks: garbage, idle and half-open
// connections, oversized headers, hellos that look right but are not authenticated, and
// authenticated hellos addressed to another rank. Each client keeps its socket so the
// test can tell afterwards whether the rank cut it off.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "base/hmac.h"
#include "bootstrap/root.h"
#include "bootstrap/unique_id.h"
#include "bootstrap/wire.h"
#include "fault/fault_util.h"

namespace loomtest::fault {

struct Endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int port = 0;
  bool operator<(const Endpoint& o) const { return port < o.port; }
};

// TCP listeners of process `pid` with the address each is bound to.
inline std::vector<Endpoint> listenersOf(pid_t pid) {
  std::vector<Endpoint> out;
  for (const TcpSocket& t : tcpSocketsOf(pid)) {
    if (t.state != 0x0A) continue;
    Endpoint ep;
    ep.port = t.localPort;
    // The kernel prints each 32-bit word of the address as the CPU reads it.
    if (!t.v6) {
      auto* a = reinterpret_cast<sockaddr_in*>(&ep.addr);
      a->sin_family = AF_INET;
      a->sin_port = htons(static_cast<uint16_t>(ep.port));
      a->sin_addr.s_addr = static_cast<uint32_t>(strtoul(t.localHex.c_str(), nullptr, 16));
      if (a->sin_addr.s_addr == 0) a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ep.len = sizeof(*a);
    } else {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ep.addr);
      a->sin6_family = AF_INET6;
      a->sin6_port = htons(static_cast<uint16_t>(ep.port));
      for (int w = 0; w < 4; ++w) {
        uint32_t word = static_cast<uint32_t>(strtoul(t.localHex.substr(w * 8, 8).c_str(), nullptr, 16));
        memcpy(reinterpret_cast<uint8_t*>(&a->sin6_addr) + 4 * w, &word, 4);
      }
      ep.len = sizeof(*a);
    }
    out.push_back(ep);
  }
  return out;
}

enum class Attack {
  kGarbage,          // 4 KiB of random bytes
  kIdle,             // connects and says nothing
  kHalfHello,        // the first bytes of a hello, then silence
  kForgedPeerHello,  // bootstrap hello with a made-up MAC, then a huge message header
  kForgedStream,     // transport-stream hello with a made-up MAC, then a huge part header
  kWrongRank,        // correctly authenticated hello addressed to another rank
  kOversized,        // 256 KiB of 0xff: every length field at its maximum
  kRootHello,        // what the root expects, sent to a rank instead
  kConnectClose,     // connects and hangs up at once
};
constexpr Attack kAllAttacks[] = {Attack::kGarbage,     Attack::kIdle,        Attack::kHalfHello,
                                  Attack::kForgedPeerHello, Attack::kForgedStream, Attack::kWrongRank,
                                  Attack::kOversized,   Attack::kRootHello,   Attack::kConnectClose};
inline const char* attackName(Attack a) {
  switch (a) {
    case Attack::kGarbage: return "garbage";
    case Attack::kIdle: return "idle";
    case Attack::kHalfHello: return "half hello";
    case Attack::kForgedPeerHello: return "forged peer hello";
    case Attack::kForgedStream: return "forged stream hello";
    case Attack::kWrongRank: return "hello for another rank";
    case Attack::kOversized: return "oversized";
    case Attack::kRootHello: return "root hello";
    case Attack::kConnectClose: return "connect-close";
  }
  return "?";
}

struct HostileConn {
  int fd = -1;
  int rank = -1;
  int port = 0;
  Attack kind = Attack::kIdle;
  int phase = 0;
};

inline int connectTo(const Endpoint& ep) {
  int fd = socket(ep.addr.ss_family, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&ep.addr), ep.len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline void sendBytes(int fd, const void* p, size_t n) { (void)!send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT); }

// Opens one hostile connection to rank `rank` (of `nranks`) at `ep`; -1 if refused.
inline HostileConn attack(const loom::JobId& job, const Endpoint& ep, int rank, int nranks, Attack kind,
                          int phase) {
  HostileConn c{connectTo(ep), rank, ep.port, kind, phase};
  if (c.fd < 0) return c;
  auto forged = [&](uint16_t helloKind) {
    loom::PeerHello h{};
    h.magic = loom::kUniqueIdMagic;
    h.version = loom::kWireVersion;
    h.kind = helloKind;
    h.fromRank = (rank + 1) % nranks;
    h.toRank = rank;
    h.connId = (1ull << 8);
    loom::randomBytes(h.nonce, sizeof(h.nonce));
    loom::randomBytes(h.mac, sizeof(h.mac));
    return h;
  };
  switch (kind) {
    case Attack::kGarbage: {
      std::vector<uint8_t> junk(4096);
      loom::randomBytes(junk.data(), junk.size());
      sendBytes(c.fd, junk.data(), junk.size());
      break;
    }
    case Attack::kIdle:
      break;
    case Attack::kHalfHello: {
      loom::PeerHello h = forged(2);
      sendBytes(c.fd, &h, sizeof(h) / 2);
      break;
    }
    case Attack::kForgedPeerHello: {
      loom::PeerHello h = forged(2);
      sendBytes(c.fd, &h, sizeof(h));
      struct { uint32_t magic, tag; uint64_t len; } msg{0x4c4d5347, 0x10000000u, 1ull << 40};
      sendBytes(c.fd, &msg, sizeof(msg));
      break;
    }
    case Attack::kForgedStream: {
      loom::PeerHello h = forged(3);
      sendBytes(c.fd, &h, sizeof(h));
      uint64_t part[2] = {0, ~0ull};
      sendBytes(c.fd, part, sizeof(part));
      break;
    }
    case Attack::kWrongRank: {
      int other = (rank + 1) % nranks;
      loom::PeerHello h = loom::makePeerHello(job, 2, (rank + 2) % nranks, other, 0);
      sendBytes(c.fd, &h, sizeof(h));
      break;
    }
    case Attack::kOversized: {
      std::vector<uint8_t> ff(256 << 10, 0xff);
      sendBytes(c.fd, ff.data(), ff.size());
      break;
    }
    case Attack::kRootHello: {
      loom::RootHello h{};
      h.magic = loom::kUniqueIdMagic;
      h.version = loom::kWireVersion;
      h.kind = 1;
      h.rank = rank;
      h.nranks = nranks;
      loom::randomBytes(h.mac, sizeof(h.mac));
      sendBytes(c.fd, &h, sizeof(h));
      break;
    }
    case Attack::kConnectClose:
      close(c.fd);
      c.fd = -1;
      break;
  }
  return c;
}

// Whether the other side has closed (EOF or reset) the connection.
inline bool closedByPeer(int fd) {
  if (fd < 0) return true;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
}

}  // namespace loomtest::fault
