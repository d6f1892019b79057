// Conformance suite for network backends: what any NetBackend must do for the generic
// net transport to run over it, checked through the interface alone against every
// backend this build offers (TCP; UCX over tcp, posix shared memory and cma, each alone;
// Loom's test NCCL net plugins of every ABI version, v6..v11, through the plugin loader;
// verbs as it comes).
// Two instances of the backend play ranks 0 and 1 of one job in this process, driven
// from one thread (the API is non-blocking); the peer-death cases fork a process that is
// killed mid-transfer. Every case is bounded: a backend that hangs fails, never stalls.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/hmac.h"
#include "transports/net/ib_backend.h"
#include "transports/net/net_backend.h"
#include "transports/net/plugin_backend.h"
#include "transports/net/ucx_backend.h"
#include "transports/test_plugins.h"

namespace loomtest {
namespace {

using loom::NetBackend;
using loom::NetHandle;
using loom::NetRecvComm;
using loom::NetRequest;
using loom::NetSendComm;
using Clock = std::chrono::steady_clock;

loom::JobId randomJob() {
  loom::JobId j;
  loom::randomBytes(j.secret, sizeof(j.secret));
  return j;
}

loom::NetInterface loopback() {
  return {"lo", loom::SocketAddr::parse("127.0.0.1:0", "conformance test")};
}

// Byte i of message `m`: every message distinct, every offset distinct within it.
uint8_t pattern(int m, size_t i) { return static_cast<uint8_t>(m * 131 + i * 7 + (i >> 9)); }

std::vector<uint8_t> message(int m, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = pattern(m, i);
  return v;
}

// Keeps calling `step` until it returns true; fails the test after `seconds`.
void drive(const std::function<bool()>& step, double seconds, const char* what) {
  auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (!step()) {
    if (Clock::now() > end) FAIL() << what << ": not done after " << seconds << " s";
  }
}

// A connection and the memory registered with each end (as ncclNet requires, every
// buffer a request names lies inside a registration of its comm).
struct Conn {
  std::unique_ptr<loom::NetListenComm> listen;
  std::unique_ptr<NetSendComm> send;
  std::unique_ptr<NetRecvComm> recv;
  std::vector<std::unique_ptr<loom::NetMr>> sendMrs, recvMrs;  // go before their comms

  loom::NetMr* sreg(const void* p, size_t n) {
    sendMrs.push_back(send->regMr(const_cast<void*>(p), n, loom::NetMemType::kHost));
    return sendMrs.back().get();
  }
  loom::NetMr* rreg(void* p, size_t n) {
    recvMrs.push_back(recv->regMr(p, n, loom::NetMemType::kHost));
    return recvMrs.back().get();
  }
};

// UCX pinned to one transport (UCX_TLS) and, for tcp, to the loopback device.
loom::UcxConfig ucxVariant(const std::string& name) {
  if (name == "UcxTcp") return {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
  if (name == "UcxPosix") return {{"TLS", "posix"}};
  // Shared memory for small messages and the handshake, cma (process_vm_readv) for the
  // rendezvous of every message over 8 KiB.
  return {{"TLS", "posix,cma"}, {"RNDV_THRESH", "8192"}};
}

// A built-in backend by name, "Ucx<Transport>": UCX over that transport alone, or
// "PluginV<N>": the test plugin of ABI version N, or "IbQps<N>[Split|Ar]": verbs with N
// queue pairs per connection (messages whole on one, or split across all; Ar: whole, with
// adaptive routing's write-then-immediate for every message).
std::unique_ptr<NetBackend> makeBackend(const std::string& name, const loom::JobId& job,
                                        int rank) {
  loom::NetContext ctx{job, rank, 2, loopback()};
  if (name.rfind("Ucx", 0) == 0)
    return loom::makeUcxNetBackend(ctx, ucxVariant(name), name.rfind("UcxRma", 0) == 0);
  if (name.rfind("IbQps", 0) == 0) {
    auto endsWith = [&](const std::string& t) {
      return name.size() > t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
    };
    setenv("NCCL_IB_QPS_PER_CONNECTION", std::to_string(std::stoi(name.substr(5))).c_str(), 1);
    if (endsWith("Split")) setenv("NCCL_IB_SPLIT_DATA_ON_QPS", "1", 1);
    if (endsWith("Ar")) {
      setenv("NCCL_IB_ADAPTIVE_ROUTING", "1", 1);
      setenv("NCCL_IB_AR_THRESHOLD", "0", 1);
    }
    auto b = loom::makeIbNetBackend(ctx);
    for (const char* k : {"NCCL_IB_QPS_PER_CONNECTION", "NCCL_IB_SPLIT_DATA_ON_QPS", "NCCL_IB_ADAPTIVE_ROUTING",
                          "NCCL_IB_AR_THRESHOLD"})
      unsetenv(k);
    return b;
  }
  if (name.rfind("PluginV", 0) == 0) {
    auto api = testPlugin(std::stoi(name.substr(7)));
    if (!api) throw std::runtime_error("test plugin " + name + " did not load");
    return loom::makePluginNetBackend(api, ctx);
  }
  return loom::findNetBackend(name).make(ctx);
}

class NetBackendConformance : public testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<NetBackend> make(const loom::JobId& job, int rank) {
    return makeBackend(GetParam(), job, rank);
  }
  void SetUp() override {
    job_ = randomJob();
    a_ = make(job_, 0);
    b_ = make(job_, 1);
  }

  // A connection from `from` to `to`: listen, then connect and accept polled in turn.
  Conn connect(NetBackend& from, NetBackend& to) {
    Conn c;
    NetHandle h;
    c.listen = to.listen(0, &h);
    std::unique_ptr<loom::NetStage> cs, as;
    drive([&] {
      if (!c.send) c.send = from.connect(0, h, cs);
      if (!c.recv) c.recv = c.listen->accept(as);
      return c.send && c.recv;
    }, 10, "connect/accept");
    return c;
  }

  // One message each way through `c`, both ends driven until done; returns the size the
  // receiver saw.
  size_t transfer(Conn& c, const void* data, size_t bytes, void* into, size_t capacity) {
    NetRequest* s = nullptr;
    NetRequest* r = nullptr;
    loom::NetMr* sm = c.sreg(data, bytes);
    loom::NetMr* rm = c.rreg(into, capacity);
    drive([&] {
      if (!s) s = c.send->isend(data, bytes, 0, sm);
      if (!r) r = c.recv->irecv(into, capacity, 0, rm);
      return s && r;
    }, 10, "posting");
    bool sent = false, got = false;
    size_t sentBytes = 0, gotBytes = 0;
    drive([&] {
      if (!sent) sent = c.send->test(s, &sentBytes);
      if (!got) got = c.recv->test(r, &gotBytes);
      return sent && got;
    }, 20, "transfer");
    EXPECT_EQ(sentBytes, bytes);
    return gotBytes;
  }

  loom::JobId job_;
  std::unique_ptr<NetBackend> a_, b_;
};

TEST_P(NetBackendConformance, DevicesAndProperties) {
  ASSERT_GE(a_->devices(), 1);
  loom::NetProperties p = a_->properties(0);
  EXPECT_FALSE(p.name.empty());
  EXPECT_TRUE(p.ptrSupport & loom::kNetPtrHost) << "the net transport's FIFOs are host memory";
  EXPECT_GE(p.maxRecvs, 1);
  EXPECT_THROW(a_->properties(a_->devices()), loom::Error);
}

// Two connections made in opposite directions on the same backends are independent: each
// accept gets its own peer, and each message arrives where it was sent.
TEST_P(NetBackendConformance, ConnectAcceptHandshake) {
  Conn ab = connect(*a_, *b_);
  Conn ba = connect(*b_, *a_);
  ASSERT_TRUE(ab.send && ab.recv && ba.send && ba.recv);
  std::vector<uint8_t> x = message(1, 1000), y = message(2, 3000), gx(4096), gy(4096);
  EXPECT_EQ(transfer(ab, x.data(), x.size(), gx.data(), gx.size()), x.size());
  EXPECT_EQ(transfer(ba, y.data(), y.size(), gy.data(), gy.size()), y.size());
  EXPECT_TRUE(std::equal(x.begin(), x.end(), gx.begin()));
  EXPECT_TRUE(std::equal(y.begin(), y.end(), gy.begin()));
}

// Every size from empty to several MiB arrives whole, into receives larger than the
// message; bytes past the message are left alone.
TEST_P(NetBackendConformance, SizesFromZeroToSeveralMiB) {
  Conn c = connect(*a_, *b_);
  ASSERT_TRUE(c.send && c.recv);
  int m = 0;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{3}, size_t{4095}, size_t{4096}, size_t{65537},
                       size_t{1} << 20, (size_t{3} << 20) + 5, size_t{8} << 20}) {
    std::vector<uint8_t> out = message(++m, bytes), in(bytes + 64, 0xee);
    ASSERT_EQ(transfer(c, out.data(), bytes, in.data(), in.size()), bytes) << bytes << " bytes";
    ASSERT_TRUE(std::equal(out.begin(), out.end(), in.begin())) << bytes << " bytes corrupted";
    for (size_t i = bytes; i < in.size(); ++i) ASSERT_EQ(in[i], 0xee) << "wrote past " << bytes;
  }
}

// Many requests in flight before any is tested (at least a FIFO's depth): messages match
// receives in posting order whatever order the requests are tested in.
TEST_P(NetBackendConformance, ManyOutstandingRequestsInOrder) {
  Conn c = connect(*a_, *b_);
  ASSERT_TRUE(c.send && c.recv);
  const int n = 24;
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<NetRequest*> sends, recvs;
  for (int m = 0; m < n; ++m) {
    out.push_back(message(m, 1000 + 37000 * m));
    in.emplace_back(out.back().size() + 100);
  }
  for (int m = 0; m < n; ++m) {
    NetRequest* r = c.recv->irecv(in[m].data(), in[m].size(), m, c.rreg(in[m].data(), in[m].size()));
    ASSERT_TRUE(r) << "receive " << m << " refused: fewer than " << n << " in flight";
    // A send may wait for its receive's clear-to-send (RMA), never for an earlier send.
    NetRequest* s = nullptr;
    loom::NetMr* sm = c.sreg(out[m].data(), out[m].size());
    drive([&] { return (s = c.send->isend(out[m].data(), out[m].size(), m, sm)) != nullptr; },
          10, "a send with fewer than 24 in flight");
    ASSERT_TRUE(s) << "send " << m << " refused: fewer than " << n << " in flight";
    recvs.push_back(r);
    sends.push_back(s);
  }
  std::vector<bool> sent(n), got(n);
  int left = 2 * n;
  drive([&] {
    for (int m = n - 1; m >= 0; --m) {  // newest first: completion must not depend on it
      size_t b;
      if (!sent[m] && c.send->test(sends[m], &b)) sent[m] = true, --left;
      if (!got[m] && c.recv->test(recvs[m], &b)) {
        got[m] = true, --left;
        EXPECT_EQ(b, out[m].size()) << "message " << m;
      }
    }
    return left == 0;
  }, 30, "outstanding requests");
  for (int m = 0; m < n; ++m)
    EXPECT_TRUE(std::equal(out[m].begin(), out[m].end(), in[m].begin())) << "message " << m;
}

TEST_P(NetBackendConformance, HostMemoryNeedsNoFlush) {
  Conn c = connect(*a_, *b_);
  ASSERT_TRUE(c.recv);
  char buf[64];
  NetRequest* f = c.recv->iflush(buf, sizeof(buf), c.rreg(buf, sizeof(buf)));
  if (f) {
    size_t b;
    drive([&] { return c.recv->test(f, &b); }, 5, "flush");
  }
}

// A backend whose device does not offer NCCL_PTR_DMABUF refuses a DMA-BUF registration with
// an error that says so (the device executor asks only where it is offered).
TEST_P(NetBackendConformance, DmaBufOnlyWhereOffered) {
  if (a_->properties(0).ptrSupport & loom::kNetPtrDmaBuf) GTEST_SKIP() << "this device offers DMA-BUF";
  Conn c = connect(*a_, *b_);
  ASSERT_TRUE(c.recv);
  char buf[64];
  std::string e;
  try {
    c.recv->regMrDmaBuf(buf, sizeof(buf), -1, 0);
  } catch (const loom::Error& x) {
    e = x.what();
  }
  std::string lower;
  for (char ch : e) lower += static_cast<char>(tolower(static_cast<unsigned char>(ch)));
  EXPECT_TRUE(lower.find("dmabuf") != std::string::npos || lower.find("dma-buf") != std::string::npos)
      << "no error naming DMA-BUF: '" << e << "'";
}

// A message larger than its receive is an error, and nothing is written past the receive.
TEST_P(NetBackendConformance, OversizedMessageIsAnError) {
  Conn c = connect(*a_, *b_);
  ASSERT_TRUE(c.send && c.recv);
  std::vector<uint8_t> out = message(7, 1000), in(200, 0xee);
  NetRequest* s = nullptr;
  NetRequest* r = nullptr;
  loom::NetMr* rm = c.rreg(in.data(), 100);
  loom::NetMr* sm = c.sreg(out.data(), out.size());
  // Null means "call again" (an RMA sender waits for the receiver's clear-to-send).
  drive([&] {
    if (!r) r = c.recv->irecv(in.data(), 100, 0, rm);
    if (!s) s = c.send->isend(out.data(), out.size(), 0, sm);
    return s && r;
  }, 10, "posting");
  ASSERT_TRUE(s && r);
  bool threw = false;
  auto end = Clock::now() + std::chrono::seconds(10);
  size_t b;
  bool sent = false;
  while (!threw && Clock::now() < end) {
    if (!sent) sent = c.send->test(s, &b);
    try {
      c.recv->test(r, &b);
    } catch (const loom::Error&) {
      threw = true;
    }
  }
  EXPECT_TRUE(threw) << "a 1000-byte message into a 100-byte receive was not reported";
  for (size_t i = 100; i < in.size(); ++i) ASSERT_EQ(in[i], 0xee) << "wrote past the receive";
}

// A sender that closes after its last message: the receives it matched complete, the one
// after fails (kRemoteError) instead of waiting for ever.
TEST_P(NetBackendConformance, PeerClosedBetweenMessagesFailsTheNextReceive) {
  Conn c = connect(*a_, *b_);
  ASSERT_TRUE(c.send && c.recv);
  std::vector<uint8_t> out = message(3, 5000), in(6000);
  ASSERT_EQ(transfer(c, out.data(), out.size(), in.data(), in.size()), out.size());
  ASSERT_EQ(transfer(c, out.data(), 17, in.data(), in.size()), 17u);
  c.sendMrs.clear();
  c.send.reset();
  // Receives posted ahead after the close are accepted (a pump keeps several posted); only
  // testing one reports the sender gone.
  std::vector<uint8_t> ahead(6000);
  NetRequest* r = c.recv->irecv(in.data(), in.size(), 0, c.rreg(in.data(), in.size()));
  ASSERT_TRUE(r);
  usleep(20000);  // let the close reach this side before the next post
  loom::NetMr* am = c.rreg(ahead.data(), ahead.size());
  ASSERT_NO_THROW(c.recv->irecv(ahead.data(), ahead.size(), 0, am));
  size_t b;
  try {
    drive([&] { return c.recv->test(r, &b); }, 10, "receive after close");
    ADD_FAILURE() << "a receive completed after its sender closed";
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.code(), loom::Code::kRemoteError) << e.what();
  }
}

// A connection made with another job's secret is never handed over; ours still is.
TEST_P(NetBackendConformance, OtherJobsAreNotAccepted) {
  std::unique_ptr<NetBackend> stranger = make(randomJob(), 0);
  NetHandle h;
  auto listen = b_->listen(0, &h);
  std::unique_ptr<loom::NetStage> ss, as;
  std::unique_ptr<NetSendComm> theirs;
  std::unique_ptr<NetRecvComm> got;
  auto end = Clock::now() + std::chrono::milliseconds(1500);
  while (Clock::now() < end && !got) {
    try {
      if (!theirs) theirs = stranger->connect(0, h, ss);
    } catch (const loom::Error&) {
      break;  // refused outright: as good
    }
    got = listen->accept(as);
  }
  EXPECT_FALSE(got) << "accepted a connection that did not know the job's secret";
}

TEST_P(NetBackendConformance, MalformedHandleIsRefused) {
  NetHandle h;
  memset(h.bytes, 0x41, sizeof(h.bytes));
  std::unique_ptr<loom::NetStage> st;
  EXPECT_THROW(
      {
        for (int i = 0; i < 1000; ++i)
          if (a_->connect(0, h, st)) break;
      },
      loom::Error);
}

// ---- peer death: a forked peer is SIGKILLed mid-transfer ----

// Runs `fn` in a child process; the child never returns into the test.
pid_t forkPeer(const std::function<void()>& fn) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    try {
      fn();
    } catch (...) {
    }
    _exit(0);
  }
  return pid;
}

void writeAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = write(fd, c, n);
    if (k <= 0) return;
    c += k;
    n -= static_cast<size_t>(k);
  }
}

bool readAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t k = read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// The survivor's requests fail within this bound once its peer is killed.
constexpr double kDeathBoundSec = 10;

class NetBackendDeath : public testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<NetBackend> make(const loom::JobId& job, int rank) {
    return makeBackend(GetParam(), job, rank);
  }
};

// The sender dies: the receiver's next receive fails within the bound.
TEST_P(NetBackendDeath, SenderKilledFailsTheReceiver) {
  loom::JobId job = randomJob();
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  // Fork first: the child must not inherit threads' locks (the acceptor's among them).
  pid_t child = forkPeer([&] {
    close(p[1]);
    NetHandle h;
    if (!readAll(p[0], &h, sizeof(h))) return;
    auto be = make(job, 1);
    std::unique_ptr<loom::NetStage> st;
    std::unique_ptr<NetSendComm> s;
    while (!(s = be->connect(0, h, st))) usleep(100);
    std::vector<uint8_t> big(1 << 20, 0x5a);
    auto mr = s->regMr(big.data(), big.size(), loom::NetMemType::kHost);
    for (;;) {
      NetRequest* r = nullptr;
      while (!(r = s->isend(big.data(), big.size(), 0, mr.get()))) usleep(10);
      size_t b;
      while (!s->test(r, &b)) {
      }
    }
  });
  close(p[0]);
  auto be = make(job, 0);
  NetHandle h;
  auto listen = be->listen(0, &h);
  writeAll(p[1], &h, sizeof(h));
  close(p[1]);
  std::unique_ptr<loom::NetStage> st;
  std::unique_ptr<NetRecvComm> r;
  drive([&] { return (r = listen->accept(st)) != nullptr; }, 10, "accept");
  ASSERT_TRUE(r);
  std::vector<uint8_t> in(1 << 20);
  auto mr = r->regMr(in.data(), in.size(), loom::NetMemType::kHost);
  for (int m = 0; m < 3; ++m) {
    NetRequest* q = r->irecv(in.data(), in.size(), 0, mr.get());
    size_t b;
    drive([&] { return r->test(q, &b); }, 10, "receive before the kill");
    ASSERT_EQ(b, in.size());
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  auto killed = Clock::now();
  bool failed = false;
  while (!failed && Clock::now() - killed < std::chrono::duration<double>(kDeathBoundSec)) {
    NetRequest* q = r->irecv(in.data(), in.size(), 0, mr.get());
    ASSERT_TRUE(q);
    size_t b;
    try {
      while (!r->test(q, &b) && Clock::now() - killed < std::chrono::duration<double>(kDeathBoundSec)) {
      }
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::Code::kRemoteError) << e.what();
      failed = true;
    }
  }
  EXPECT_TRUE(failed) << "no error " << kDeathBoundSec << " s after the sender was killed";
}

// The receiver dies: the sender's sends fail within the bound.
TEST_P(NetBackendDeath, ReceiverKilledFailsTheSender) {
  loom::JobId job = randomJob();
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  pid_t child = forkPeer([&] {
    close(p[0]);
    auto be = make(job, 1);
    NetHandle h;
    auto listen = be->listen(0, &h);
    writeAll(p[1], &h, sizeof(h));
    std::unique_ptr<loom::NetStage> st;
    std::unique_ptr<NetRecvComm> r;
    while (!(r = listen->accept(st))) usleep(100);
    std::vector<uint8_t> in(1 << 20);
    auto mr = r->regMr(in.data(), in.size(), loom::NetMemType::kHost);
    for (;;) {
      NetRequest* q = r->irecv(in.data(), in.size(), 0, mr.get());
      size_t b;
      while (!r->test(q, &b)) {
      }
    }
  });
  close(p[1]);
  NetHandle h;
  ASSERT_TRUE(readAll(p[0], &h, sizeof(h)));
  close(p[0]);
  auto be = make(job, 0);
  std::unique_ptr<loom::NetStage> st;
  std::unique_ptr<NetSendComm> s;
  drive([&] { return (s = be->connect(0, h, st)) != nullptr; }, 10, "connect");
  ASSERT_TRUE(s);
  std::vector<uint8_t> big(1 << 20, 0x33);
  auto mr = s->regMr(big.data(), big.size(), loom::NetMemType::kHost);
  auto sendOne = [&](double bound) {
    NetRequest* q = nullptr;
    auto end = Clock::now() + std::chrono::duration<double>(bound);
    while (!(q = s->isend(big.data(), big.size(), 0, mr.get())))
      if (Clock::now() > end) return false;
    size_t b;
    while (!s->test(q, &b))
      if (Clock::now() > end) return false;
    return true;
  };
  for (int m = 0; m < 3; ++m) ASSERT_TRUE(sendOne(10)) << "send " << m << " before the kill";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  auto killed = Clock::now();
  bool failed = false;
  try {
    while (Clock::now() - killed < std::chrono::duration<double>(kDeathBoundSec)) sendOne(1);
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.code(), loom::Code::kRemoteError) << e.what();
    failed = true;
  }
  EXPECT_TRUE(failed) << "sends still succeed " << kDeathBoundSec << " s after the receiver died";
}

std::vector<std::string> backendNames() {
  std::vector<std::string> v;
  for (const auto& b : loom::netBackends())
    if (b.name.rfind("UCX", 0) != 0 && b.name != "IB") v.push_back(b.name);
  // Verbs where an RDMA port is active (the rxe VM: ctest -L rxe), with 1 and 4 QPs (each
  // message whole on one, or split across all; or whole with adaptive routing's way).
  std::string why;
  if (loom::ibIsDefault(&why))
    for (const char* b : {"IB", "IbQps4", "IbQps4Split", "IbQps4Ar"}) v.push_back(b);
  if (loom::ucxBuiltIn())
    for (const char* u : {"UcxTcp", "UcxPosix", "UcxCma", "UcxRmaCma"}) v.push_back(u);
  for (int version = 6; version <= 11; ++version) v.push_back("PluginV" + std::to_string(version));
  return v;
}

INSTANTIATE_TEST_SUITE_P(Net, NetBackendConformance, testing::ValuesIn(backendNames()),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Net, NetBackendDeath, testing::ValuesIn(backendNames()),
                         [](const auto& info) { return info.param; });

// UCX is offered wherever it is built (CI builds it); a build without it says why not.
TEST(NetBackendSelection, UcxIsOfferedWhereBuilt) {
  if (loom::ucxBuiltIn()) {
    EXPECT_EQ(loom::findNetBackend("ucx").name, "UCX");
    return;
  }
  try {
    loom::findNetBackend("UCX");
    FAIL() << "UCX was found in a build without it";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find(loom::ucxUnavailable()), std::string::npos) << e.what();
  }
}

// UCX_RMA over tcp is refused up front: UCX 1.13 would abort the receiving process when
// a sender dies mid-put (software-emulated puts), and a dead peer must never crash a rank.
TEST(NetBackendSelection, UcxRmaRefusesTcp) {
  if (!loom::ucxBuiltIn()) GTEST_SKIP() << loom::ucxUnavailable();
  loom::NetContext ctx{randomJob(), 0, 2, loopback()};
  for (const char* tls : {"tcp", "tcp,posix,cma", "all"}) {
    try {
      loom::makeUcxNetBackend(ctx, {{"TLS", tls}}, true);
      ADD_FAILURE() << "UCX_RMA started with UCX_TLS=" << tls;
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::Code::kInvalidUsage) << e.what();
      EXPECT_NE(std::string(e.what()).find("native RMA"), std::string::npos) << e.what();
    }
  }
}

TEST(NetBackendSelection, NamesAreCaseInsensitiveAndUnknownOnesListWhatExists) {
  EXPECT_EQ(loom::findNetBackend("socket").name, "Socket");
  EXPECT_EQ(loom::findNetBackend("SOCKET").name, "Socket");
  try {
    loom::findNetBackend("Carrier-Pigeon");
    FAIL() << "an unknown backend was found";
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.code(), loom::Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("NCCL_NET=Carrier-Pigeon"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Socket"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loomtest
