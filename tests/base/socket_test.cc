#include "base/socket.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "base/error.h"

namespace loom {
namespace {

TEST(MatchIfName, Semantics) {
  EXPECT_TRUE(matchIfName("eth", "eth0"));
  EXPECT_TRUE(matchIfName("eth", "eth10"));
  EXPECT_FALSE(matchIfName("eth", "ib0"));
  EXPECT_FALSE(matchIfName("^docker,lo", "docker0"));
  EXPECT_FALSE(matchIfName("^docker,lo", "lo"));
  EXPECT_TRUE(matchIfName("^docker,lo", "eth0"));
  EXPECT_TRUE(matchIfName("=eth0", "eth0"));
  EXPECT_FALSE(matchIfName("=eth0", "eth01"));
  EXPECT_FALSE(matchIfName("^=eth0", "eth0"));
  EXPECT_TRUE(matchIfName("^=eth0", "eth01"));
  EXPECT_TRUE(matchIfName("eth,ib", "ib0"));
  EXPECT_TRUE(matchIfName("eth,ib", "eth1"));
  EXPECT_FALSE(matchIfName("eth,ib", "enp1s0"));
}

TEST(SocketAddr, ParsesForms) {
  SocketAddr a = SocketAddr::parse("127.0.0.1:1234", "test");
  EXPECT_EQ(a.family(), AF_INET);
  EXPECT_EQ(a.port(), 1234);
  EXPECT_EQ(a.str(), "127.0.0.1:1234");

  SocketAddr b = SocketAddr::parse("[::1]:80", "test");
  EXPECT_EQ(b.family(), AF_INET6);
  EXPECT_EQ(b.port(), 80);
  EXPECT_EQ(b.str(), "[::1]:80");

  SocketAddr c = SocketAddr::parse("localhost:5", "test");
  EXPECT_EQ(c.port(), 5);
  EXPECT_TRUE(c.str() == "127.0.0.1:5" || c.str() == "[::1]:5") << c.str();
}

TEST(SocketAddr, ErrorsAreInvalidArgument) {
  struct Case {
    const char* text;
    const char* mention;
  };
  for (const Case& k : {Case{"127.0.0.1", "127.0.0.1"}, Case{"127.0.0.1:", "bad port"},
                        Case{"127.0.0.1:70000", "bad port"}, Case{"127.0.0.1:12x", "bad port"},
                        Case{"[::1]80", "[::1]80"}, Case{"no-such-host.invalid:80", "resolve"}}) {
    try {
      SocketAddr::parse(k.text, "NCCL_COMM_ID");
      ADD_FAILURE() << "parsed " << k.text;
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_EQ(e.code(), Code::kInvalidArgument) << msg;
      EXPECT_NE(msg.find("NCCL_COMM_ID"), std::string::npos) << msg;
      EXPECT_NE(msg.find(k.mention), std::string::npos) << msg;
    }
  }
}

TEST(Socket, TenMegabytesRoundTrip) {
  SocketAddr addr = SocketAddr::parse("127.0.0.1:0", "test");
  Socket listener = Socket::listen(addr);
  ASSERT_NE(addr.port(), 0) << "listen did not report the bound port";

  const size_t n = 10 << 20;
  std::vector<uint8_t> src(n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 31 + (i >> 12));
  std::atomic<bool> sent{false};
  std::string sendError;
  std::thread client([&] {
    try {
      Socket s = Socket::connect(addr, Deadline::in(10), "test client");
      s.sendAll(src.data(), n, Deadline::in(30), "test client");
      uint32_t ack = 0;
      s.recvAll(&ack, sizeof(ack), Deadline::in(30), "test client");
      sent = ack == 0x600dull;
    } catch (const std::exception& e) {
      sendError = e.what();
    }
  });
  Socket conn = listener.accept(Deadline::in(10));
  ASSERT_TRUE(conn.isOpen());
  EXPECT_EQ(conn.peer().family(), AF_INET);
  std::vector<uint8_t> dst(n, 0);
  conn.recvAll(dst.data(), n, Deadline::in(30), "test server");
  uint32_t ack = 0x600d;
  conn.sendAll(&ack, sizeof(ack), Deadline::in(10), "test server");
  client.join();
  EXPECT_EQ(sendError, "");
  EXPECT_TRUE(sent);
  EXPECT_TRUE(dst == src) << "payload corrupted";
}

TEST(Socket, RecvTimesOutNamingPeer) {
  SocketAddr addr = SocketAddr::parse("127.0.0.1:0", "test");
  Socket listener = Socket::listen(addr);
  Socket client = Socket::connect(addr, Deadline::in(10), "test client");
  Socket conn = listener.accept(Deadline::in(10));
  ASSERT_TRUE(conn.isOpen());
  char buf[16];
  auto t0 = Clock::now();
  try {
    conn.recvAll(buf, sizeof(buf), Deadline::in(0.2), "silent peer");
    FAIL() << "received from a silent peer";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.code(), Code::kRemoteError);
    EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
    EXPECT_NE(msg.find(conn.peer().str()), std::string::npos) << msg;
    EXPECT_NE(msg.find("silent peer"), std::string::npos) << msg;
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(s, 0.19);
  EXPECT_LT(s, 2.0);
}

TEST(Socket, RecvReportsClosedPeer) {
  SocketAddr addr = SocketAddr::parse("127.0.0.1:0", "test");
  Socket listener = Socket::listen(addr);
  Socket client = Socket::connect(addr, Deadline::in(10), "test client");
  Socket conn = listener.accept(Deadline::in(10));
  client.close();
  char buf[4];
  try {
    conn.recvAll(buf, sizeof(buf), Deadline::in(5), "closing peer");
    FAIL() << "received from a closed peer";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kRemoteError);
    EXPECT_NE(std::string(e.what()).find("closed"), std::string::npos) << e.what();
  }
}

// A port that is bound but not yet listening refuses connections, like a peer that has
// not started; returns the fd and fills `addr`.
int bindOnly(SocketAddr& addr) {
  addr = SocketAddr::parse("127.0.0.1:0", "test");
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::bind(fd, addr.sa(), addr.len), 0);
  addr.len = sizeof(addr.storage);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr.storage), &addr.len);
  return fd;
}

TEST(Socket, ConnectRetriesUntilPeerListens) {
  SocketAddr addr;
  Socket bound(bindOnly(addr));
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    ::listen(bound.fd(), 4);
  });
  Socket s = Socket::connect(addr, Deadline::in(10), "late peer");
  late.join();
  EXPECT_TRUE(s.isOpen());
  EXPECT_EQ(s.peer().str(), addr.str());
}

TEST(Socket, ConnectGivesUpAtDeadlineNamingAddress) {
  SocketAddr addr;
  Socket bound(bindOnly(addr));
  auto t0 = Clock::now();
  try {
    Socket::connect(addr, Deadline::in(0.2), "absent peer");
    FAIL() << "connected to a port nobody listens on";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.code(), Code::kRemoteError);
    EXPECT_NE(msg.find(addr.str()), std::string::npos) << msg;
    EXPECT_NE(msg.find("absent peer"), std::string::npos) << msg;
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(s, 0.19);
  EXPECT_LT(s, 2.0);
}

TEST(Socket, AcceptTimesOutEmpty) {
  SocketAddr addr = SocketAddr::parse("127.0.0.1:0", "test");
  Socket listener = Socket::listen(addr);
  EXPECT_FALSE(listener.accept(Deadline::in(0.05)).isOpen());
}

TEST(FindInterfaces, Loopback) {
  std::vector<NetInterface> lo = findInterfaces("lo", 0);
  bool found = false;
  for (const NetInterface& i : lo) {
    EXPECT_EQ(i.name.rfind("lo", 0), 0u) << i.name;
    if (i.addr.family() == AF_INET &&
        reinterpret_cast<const sockaddr_in*>(&i.addr.storage)->sin_addr.s_addr ==
            htonl(INADDR_LOOPBACK))
      found = true;
    if (i.addr.family() == AF_INET6 &&
        IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&i.addr.storage)->sin6_addr))
      found = true;
  }
  EXPECT_TRUE(found) << lo.size() << " entries, none loopback";
  for (const NetInterface& i : findInterfaces("lo", AF_INET)) EXPECT_EQ(i.addr.family(), AF_INET);
  EXPECT_TRUE(findInterfaces("=doesnotexist", 0).empty());
  EXPECT_FALSE(findInterfaces("", 0).empty()) << "the default spec must fall back to lo";
}

}  // namespace
}  // namespace loom
