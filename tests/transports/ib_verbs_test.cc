// The verbs backend over a failure-injecting copy of libibverbs' function table: each
// failure (QP creation, a QP's move to RTR, memory registration, posting, a completion
// with an error status such as retry-exceeded) becomes a clear error naming the call or
// the status, never a hang or a crash; the IB knobs reach the QPs. The table wraps the
// real libibverbs, so these need an active RDMA port: they run in the rxe VM
// (ctest -L rxe); elsewhere they skip, except the checks that need no device.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <array>
#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/hmac.h"
#include "transports/net/ib_backend.h"
#include "transports/net/ib_gid.h"
#include "transports/net/ib_verbs.h"
#include "transports/net/ibv_api.h"
#include "transports/net/net_backend.h"

namespace loomtest {
namespace {

using loom::Code;
using loom::NetBackend;
using loom::NetHandle;
using loom::NetRequest;
using Clock = std::chrono::steady_clock;

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// Environment set for one scope.
struct Env {
  Env(const char* k, const char* v) : k_(k) { setenv(k, v, 1); }
  ~Env() { unsetenv(k_); }
  const char* k_;
};

// `k` set to `v` for the scope of the result; null `v`: left unset.
std::unique_ptr<Env> envIf(const char* k, const char* v) { return v ? std::make_unique<Env>(k, v) : nullptr; }

// The message of the loom::Error fn throws ("" when none), its code in *code.
template <typename Fn>
std::string errorOf(Fn fn, Code* code = nullptr) {
  try {
    fn();
  } catch (const loom::Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

#ifdef LOOM_VERBS_HEADERS

// What the faulty table does differently from the real one.
struct Faults {
  int createQpErrno = 0;     // ibv_create_qp fails with this
  bool rtrFails = false;     // ibv_modify_qp to RTR fails (EINVAL)
  int regMrErrno = 0;        // ibv_reg_mr fails with this
  int postSendErr = 0;       // ibv_post_send returns this
  int postRecvErr = 0;       // ibv_post_recv returns this
  ibv_wc_status completionStatus = IBV_WC_SUCCESS;  // the next completion polled gets this
  int failNthCompletion = 0;  // > 0: the completion polled that many from now gets failStatus
  ibv_wc_status failStatus = IBV_WC_SUCCESS;
  int createdQps = 0;
  std::vector<ibv_qp_attr> rts;  // what each move to RTR/RTS asked for
  std::vector<ibv_qp_attr> inits;  // and each move to INIT
  int pkeyTable = 0;  // > 0: ports report a P_Key table this long (INIT then asks the device for 0)
  struct Reg {
    bool iova2;  // by ibv_reg_mr_iova2 (else ibv_reg_mr)
    unsigned access;
    size_t bytes;
  };
  std::vector<Reg> regs;
  bool noIova2 = false;  // the table lacks ibv_reg_mr_iova2 (an older libibverbs)
  std::vector<uint32_t> dataWrites;  // the QP number of each RDMA WRITE WITH IMMEDIATE posted
  struct Posted {
    uint32_t qp;
    ibv_wr_opcode opcode;
    uint32_t bytes;
    bool signaled;
    bool chained;  // posted in one call with the work request before it
  };
  std::vector<Posted> writes;  // every RDMA WRITE (WITH IMMEDIATE) work request posted
  std::vector<ibv_qp*> qps;      // the QPs made through the table
  std::vector<ibv_async_event> events;  // handed out before the device's own
  int eventsUnacked = 0;
};
Faults gF;
const loom::IbvApi* gReal = nullptr;

ibv_qp* createQp(ibv_pd* pd, ibv_qp_init_attr* a) {
  if (gF.createQpErrno) {
    errno = gF.createQpErrno;
    return nullptr;
  }
  ++gF.createdQps;
  ibv_qp* qp = gReal->createQp(pd, a);
  if (qp) gF.qps.push_back(qp);
  return qp;
}
int getAsyncEvent(ibv_context* ctx, ibv_async_event* e) {
  if (gF.events.empty()) return gReal->getAsyncEvent(ctx, e);
  *e = gF.events.front();
  gF.events.erase(gF.events.begin());
  ++gF.eventsUnacked;
  return 0;
}
void ackAsyncEvent(ibv_async_event* e) {
  if (gF.eventsUnacked > 0) --gF.eventsUnacked;  // one of ours
  else gReal->ackAsyncEvent(e);
}
int modifyQp(ibv_qp* qp, ibv_qp_attr* a, int mask) {
  if (a->qp_state == IBV_QPS_RTR && gF.rtrFails) return EINVAL;
  if (a->qp_state == IBV_QPS_RTR || a->qp_state == IBV_QPS_RTS) gF.rts.push_back(*a);
  if (a->qp_state == IBV_QPS_INIT) {
    gF.inits.push_back(*a);
    if (gF.pkeyTable) {  // the table is a pretence: the device gets its own index 0
      ibv_qp_attr real = *a;
      real.pkey_index = 0;
      return gReal->modifyQp(qp, &real, mask);
    }
  }
  return gReal->modifyQp(qp, a, mask);
}
int queryPort(ibv_context* ctx, uint8_t port, ibv_port_attr* a) {
  int rc = gReal->queryPort(ctx, port, a);
  if (rc == 0 && gF.pkeyTable) a->pkey_tbl_len = static_cast<uint16_t>(gF.pkeyTable);
  return rc;
}
ibv_mr* regMr(ibv_pd* pd, void* p, size_t n, int access) {
  if (gF.regMrErrno) {
    errno = gF.regMrErrno;
    return nullptr;
  }
  gF.regs.push_back({false, static_cast<unsigned>(access), n});
  return gReal->regMr(pd, p, n, access);
}
ibv_mr* regMrIova2(ibv_pd* pd, void* p, size_t n, uint64_t iova, unsigned access) {
  if (gF.regMrErrno) {
    errno = gF.regMrErrno;
    return nullptr;
  }
  gF.regs.push_back({true, access, n});
  return gReal->regMrIova2(pd, p, n, iova, access);
}
int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  if (gF.postSendErr) return gF.postSendErr;
  for (const ibv_send_wr* w = wr; w; w = w->next) {
    if (w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) gF.dataWrites.push_back(qp->qp_num);
    uint32_t n = 0;
    for (int i = 0; i < w->num_sge; ++i) n += w->sg_list[i].length;
    if (w->opcode == IBV_WR_RDMA_WRITE || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
      gF.writes.push_back({qp->qp_num, w->opcode, n, (w->send_flags & IBV_SEND_SIGNALED) != 0, w != wr});
  }
  return gReal->postSend(qp, wr, bad);
}
int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if (gF.postRecvErr) return gF.postRecvErr;
  return gReal->postRecv(qp, wr, bad);
}
int pollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  int got = gReal->pollCq(cq, n, wc);
  if (got > 0 && gF.completionStatus != IBV_WC_SUCCESS) {
    wc[0].status = gF.completionStatus;
    gF.completionStatus = IBV_WC_SUCCESS;
  }
  for (int i = 0; i < got && gF.failNthCompletion > 0; ++i)
    if (--gF.failNthCompletion == 0) wc[i].status = gF.failStatus;
  return got;
}

loom::IbvApi faultyTable() {
  loom::IbvApi t = *gReal;
  t.createQp = createQp;
  t.modifyQp = modifyQp;
  t.queryPort = queryPort;
  t.regMr = regMr;
  t.regMrIova2 = gReal->regMrIova2 && !gF.noIova2 ? regMrIova2 : nullptr;
  t.postSend = postSend;
  t.postRecv = postRecv;
  t.pollCq = pollCq;
  t.getAsyncEvent = getAsyncEvent;
  t.ackAsyncEvent = ackAsyncEvent;
  return t;
}

loom::JobId randomJob() {
  loom::JobId j;
  loom::randomBytes(j.secret, sizeof(j.secret));
  return j;
}

class IbVerbs : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!loom::ibIsDefault(&why)) GTEST_SKIP() << "no active RDMA port here (" << why << ")";
    gReal = loom::ibvApi(nullptr);
    gF = Faults{};
    faulty_ = faultyTable();
    job_ = randomJob();
  }
  // Rank 0 over the faulty table, rank 1 over the real one (or both faulty).
  void make(bool bothFaulty = false) {
    a_ = backend(0, &faulty_);
    b_ = backend(1, bothFaulty ? &faulty_ : nullptr);
  }
  // A backend of this job's rank over `table` (null: the real one), its knobs read now.
  std::unique_ptr<NetBackend> backend(int rank, const loom::IbvApi* table) {
    loom::NetInterface lo{"lo", loom::SocketAddr::parse("127.0.0.1:0", "ib test")};
    return loom::makeIbNetBackend({job_, rank, 2, lo}, table);
  }
  // Back to no connection, no backend and no faults, for a case that makes its own.
  void restart() {
    send_.reset();
    recv_.reset();
    listen_.reset();
    a_.reset();
    b_.reset();
    gF = Faults{};
  }
  // Connects a_ (sender) to b_ (receiver), both polled until done or `seconds` pass;
  // the first error either side throws is rethrown.
  void connect(double seconds = 10) {
    NetHandle h;
    listen_ = b_->listen(0, &h);
    std::unique_ptr<loom::NetStage> cs, as;
    auto end = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
    while (!(send_ && recv_)) {
      if (Clock::now() > end) FAIL() << "connect/accept not done after " << seconds << " s";
      if (!send_) {
        try {
          send_ = a_->connect(0, h, cs);
        } catch (...) {
          cs.reset();  // the sender gives up: its stream closes
          drainAccept(as, end);
          throw;
        }
      }
      if (!recv_) recv_ = listen_->accept(as);
    }
  }
  // After a failed connect the listener's accept must fail or stay empty, never hang.
  void drainAccept(std::unique_ptr<loom::NetStage>& as, Clock::time_point end) {
    try {
      while (Clock::now() < end && !recv_) recv_ = listen_->accept(as);
    } catch (const loom::Error& e) {
      acceptError_ = e.what();
    }
  }
  // One message a_ → b_; throws the first error either side reports within 15 s.
  bool transfer(size_t bytes) {
    std::vector<uint8_t> out(bytes), in(bytes);
    for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(i * 131 + i / 251 + 7);
    auto sm = send_->regMr(out.data(), out.size(), loom::NetMemType::kHost);
    auto rm = recv_->regMr(in.data(), in.size(), loom::NetMemType::kHost);
    NetRequest* r = recv_->irecv(in.data(), in.size(), 0, rm.get());
    NetRequest* s = nullptr;
    bool sent = false, got = false;
    size_t b;
    auto end = Clock::now() + std::chrono::seconds(15);
    while (!(sent && got) && Clock::now() < end) {
      if (!s) s = send_->isend(out.data(), out.size(), 0, sm.get());
      if (s && !sent) sent = send_->test(s, &b);
      if (!got) got = recv_->test(r, &b);
    }
    return sent && got && in == out;
  }

  loom::IbvApi faulty_;
  loom::JobId job_;
  std::unique_ptr<NetBackend> a_, b_;
  std::unique_ptr<loom::NetListenComm> listen_;
  std::unique_ptr<loom::NetSendComm> send_;
  std::unique_ptr<loom::NetRecvComm> recv_;
  std::string acceptError_;
};

TEST_F(IbVerbs, TheRealTableMovesData) {
  make();
  ASSERT_NO_THROW(connect());
  EXPECT_TRUE(transfer(1 << 20));
}

TEST_F(IbVerbs, QpCreationFailureNamesTheCall) {
  make();
  gF.createQpErrno = ENOMEM;
  Code c{};
  std::string e = errorOf([&] { connect(); }, &c);
  EXPECT_EQ(c, Code::kSystemError) << e;
  EXPECT_TRUE(has(e, "ibv_create_qp failed") && has(e, strerror(ENOMEM))) << e;
  EXPECT_FALSE(recv_) << "the listener accepted a connection whose sender failed";
}

TEST_F(IbVerbs, RtrFailureNamesTheTransitionAndWhatToCheck) {
  make(true);
  gF.rtrFails = true;
  Code c{};
  std::string e = errorOf([&] { connect(); }, &c);
  if (e.empty()) e = acceptError_;
  EXPECT_TRUE(has(e, "to RTR") && has(e, "NCCL_IB_GID_INDEX")) << e;
  EXPECT_FALSE(send_ && recv_);
}

TEST_F(IbVerbs, RegistrationFailureNamesTheLockedMemoryLimit) {
  make();
  ASSERT_NO_THROW(connect());
  gF.regMrErrno = ENOMEM;
  std::vector<char> buf(1 << 16);
  Code c{};
  std::string e = errorOf([&] { send_->regMr(buf.data(), buf.size(), loom::NetMemType::kHost); }, &c);
  EXPECT_EQ(c, Code::kSystemError) << e;
  // ibv_reg_mr_iova2 with relaxed ordering (the default where libibverbs has it), else ibv_reg_mr.
  EXPECT_TRUE(has(e, (gReal->regMrIova2 ? "ibv_reg_mr_iova2" : "ibv_reg_mr") + std::string("(65536 bytes) failed")) &&
              has(e, "ulimit -l"))
      << e;
  gF.regMrErrno = 0;
  EXPECT_TRUE(transfer(4096)) << "the comm is still usable after a failed registration";
}

// Receives into GPU memory are flushed by an RDMA READ on a queue pair connected to itself
// (as NCCL's). The VM has no GPU: host memory registered as GPU memory (rxe registers any
// memory) runs the flush for real; memory registered as host memory needs none; a flush
// whose post fails is an error naming it.
TEST_F(IbVerbs, GpuMemoryIsFlushedByRdmaRead) {
  make(true);
  ASSERT_NO_THROW(connect());
  std::vector<uint8_t> out(4096), in(4096, 0), host(64);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + 1);
  auto sm = send_->regMr(out.data(), out.size(), loom::NetMemType::kHost);
  auto rm = recv_->regMr(in.data(), in.size(), loom::NetMemType::kCuda);
  auto hm = recv_->regMr(host.data(), host.size(), loom::NetMemType::kHost);
  EXPECT_EQ(recv_->iflush(host.data(), host.size(), hm.get()), nullptr);
  NetRequest* r = recv_->irecv(in.data(), in.size(), 0, rm.get());
  NetRequest* s = nullptr;
  NetRequest* f = nullptr;
  bool sent = false, got = false, flushed = false;
  size_t b;
  auto end = Clock::now() + std::chrono::seconds(15);
  while (!(sent && flushed) && Clock::now() < end) {
    if (!s) s = send_->isend(out.data(), out.size(), 0, sm.get());
    if (s && !sent) sent = send_->test(s, &b);
    if (!got && (got = recv_->test(r, &b))) {
      f = recv_->iflush(in.data(), b, rm.get());
      ASSERT_NE(f, nullptr) << "memory registered as GPU memory was not flushed";
    }
    if (f && !flushed) flushed = recv_->test(f, &b);
  }
  ASSERT_TRUE(sent && got && flushed);
  EXPECT_EQ(in, out);
  gF.postSendErr = ENOMEM;
  Code c{};
  std::string e = errorOf([&] { recv_->iflush(in.data(), 1, rm.get()); }, &c);
  EXPECT_EQ(c, Code::kSystemError) << e;
  EXPECT_TRUE(has(e, "flush (RDMA READ)")) << e;
}

// A DMA-BUF the driver will not take (a memfd is none) is an error naming the call.
TEST_F(IbVerbs, DmaBufRegistrationFailureNamesTheCall) {
  make();
  ASSERT_NO_THROW(connect());
  int fd = memfd_create("loom-not-a-dmabuf", 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  std::vector<uint8_t> b(4096);
  Code c{};
  std::string e = errorOf([&] { recv_->regMrDmaBuf(b.data(), b.size(), fd, 0); }, &c);
  close(fd);
  EXPECT_TRUE(c == Code::kSystemError || c == Code::kInvalidUsage) << e;
  EXPECT_TRUE(has(e, "ibv_reg_dmabuf_mr")) << e;
}

// A post that fails is this side's error (kSystemError), not the peer's.
TEST_F(IbVerbs, PostFailureIsAnError) {
  make();
  ASSERT_NO_THROW(connect());
  gF.postSendErr = ENOMEM;
  Code c{};
  std::string e = errorOf([&] { transfer(4096); }, &c);
  EXPECT_EQ(c, Code::kSystemError) << e;
  EXPECT_TRUE(has(e, "ibv_post_send failed") && has(e, strerror(ENOMEM))) << e;
}

// A receive whose posting failed never reports success (nothing was received), and
// neither does one posted after it.
TEST_F(IbVerbs, ReceivePostFailureFailsTheReceive) {
  make(true);
  ASSERT_NO_THROW(connect());
  std::vector<char> in(4096);
  auto rm = recv_->regMr(in.data(), in.size(), loom::NetMemType::kHost);
  gF.postRecvErr = EAGAIN;
  NetRequest* r = recv_->irecv(in.data(), in.size(), 0, rm.get());
  ASSERT_TRUE(r);
  gF.postRecvErr = 0;
  size_t b;
  Code c{};
  std::string e = errorOf([&] { recv_->test(r, &b); }, &c);
  EXPECT_EQ(c, Code::kSystemError) << e;
  EXPECT_TRUE(has(e, "ibv_post_recv failed")) << e;
  NetRequest* next = recv_->irecv(in.data(), in.size(), 0, rm.get());
  ASSERT_TRUE(next);
  EXPECT_EQ(errorOf([&] { recv_->test(next, &b); }), e);
}

// A write that the peer never acknowledged (retry counter exceeded) fails the send naming
// the status and the knobs that bound it; the comm stays failed.
TEST_F(IbVerbs, RetryExceededCompletionFailsTheSend) {
  make();
  ASSERT_NO_THROW(connect());
  ASSERT_TRUE(transfer(4096));
  gF.completionStatus = IBV_WC_RETRY_EXC_ERR;
  Code c{};
  std::string e = errorOf([&] { transfer(4096); }, &c);
  EXPECT_EQ(c, Code::kRemoteError) << e;
  EXPECT_TRUE(has(e, "message write failed") && has(e, gReal->wcStatusStr(IBV_WC_RETRY_EXC_ERR)) &&
              has(e, "NCCL_IB_RETRY_CNT"))
      << e;
  std::vector<char> buf(64);
  auto mr = send_->regMr(buf.data(), buf.size(), loom::NetMemType::kHost);
  std::string again = errorOf([&] { send_->isend(buf.data(), buf.size(), 0, mr.get()); });
  EXPECT_EQ(again, e) << "a failed comm must keep failing with the first error";
}

// The receiver's own clear-to-send write fails (remote access error): its receive fails.
TEST_F(IbVerbs, ReceiverCompletionErrorFailsTheReceive) {
  make(true);
  ASSERT_NO_THROW(connect());
  std::vector<char> in(4096);
  auto rm = recv_->regMr(in.data(), in.size(), loom::NetMemType::kHost);
  NetRequest* r = recv_->irecv(in.data(), in.size(), 0, rm.get());
  gF.completionStatus = IBV_WC_REM_ACCESS_ERR;
  Code c{};
  size_t b;
  std::string e = errorOf([&] {
    auto end = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < end) recv_->test(r, &b);
  }, &c);
  EXPECT_EQ(c, Code::kRemoteError) << e;
  EXPECT_TRUE(has(e, "clear-to-send write failed") &&
              has(e, gReal->wcStatusStr(IBV_WC_REM_ACCESS_ERR)))
      << e;
}

// A receiver posts receives ahead of the messages: the clear-to-send of one the sender
// never sends may fail (a sender closing after its last message, seen once in CI as a
// remote access error) in the same batch of completions as the last real message. That
// message's receive succeeds (and its flush, in GPU memory); only the receive ahead fails.
TEST_F(IbVerbs, AFailureAheadLeavesAnArrivedMessageReceived) {
  Env qps("NCCL_IB_QPS_PER_CONNECTION", "1");  // one receive completion per message
  make(true);
  ASSERT_NO_THROW(connect());
  std::vector<char> out(4096, 0x3a), in0(4096), in1(4096);
  auto sm = send_->regMr(out.data(), out.size(), loom::NetMemType::kHost);
  auto rm0 = recv_->regMr(in0.data(), in0.size(), loom::NetMemType::kCuda);  // flushed below
  auto rm1 = recv_->regMr(in1.data(), in1.size(), loom::NetMemType::kHost);
  size_t b = 0;
  NetRequest* r0 = recv_->irecv(in0.data(), in0.size(), 0, rm0.get());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_FALSE(recv_->test(r0, &b));  // its clear-to-send's completion taken
  NetRequest* s = nullptr;
  bool sent = false;
  auto end = Clock::now() + std::chrono::seconds(10);
  while (!sent && Clock::now() < end) {
    if (!s) s = send_->isend(out.data(), out.size(), 0, sm.get());
    if (s) sent = send_->test(s, &b);
  }
  ASSERT_TRUE(sent);
  // The message is in (its write acknowledged): its receive's completion is queued first,
  // then the clear-to-send of the receive ahead, which fails.
  NetRequest* r1 = recv_->irecv(in1.data(), in1.size(), 0, rm1.get());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  gF.failStatus = IBV_WC_REM_ACCESS_ERR;
  gF.failNthCompletion = 2;
  bool got = false;
  std::string e0 = errorOf([&] {
    auto until = Clock::now() + std::chrono::seconds(10);
    while (!got && Clock::now() < until) got = recv_->test(r0, &b);
  });
  EXPECT_EQ(e0, "");
  EXPECT_TRUE(got);
  EXPECT_EQ(b, in0.size());
  EXPECT_TRUE(in0 == out);
  EXPECT_EQ(gF.failNthCompletion, 0) << "the clear-to-send's completion was not polled";
  // Its flush (GPU memory) too, on the flush QP, though the connection broke since.
  bool flushed = false;
  std::string ef = errorOf([&] {
    NetRequest* f = recv_->iflush(in0.data(), b, rm0.get());
    ASSERT_NE(f, nullptr);
    auto until = Clock::now() + std::chrono::seconds(10);
    while (!flushed && Clock::now() < until) flushed = recv_->test(f, &b);
  });
  EXPECT_EQ(ef, "");
  EXPECT_TRUE(flushed);
  Code c{};
  std::string e1 = errorOf([&] {
    auto until = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < until) recv_->test(r1, &b);
  }, &c);
  EXPECT_EQ(c, Code::kRemoteError) << e1;
  EXPECT_TRUE(has(e1, "clear-to-send write failed") && has(e1, gReal->wcStatusStr(IBV_WC_REM_ACCESS_ERR)))
      << e1;
}

// NCCL_IB_TIMEOUT, _RETRY_CNT, _TC, _SL and _QPS_PER_CONNECTION reach every QP.
TEST_F(IbVerbs, KnobsReachTheQueuePairs) {
  Env t("NCCL_IB_TIMEOUT", "14"), r("NCCL_IB_RETRY_CNT", "3"), tc("NCCL_IB_TC", "96"),
      sl("NCCL_IB_SL", "2"), q("NCCL_IB_QPS_PER_CONNECTION", "3");
  make(true);
  ASSERT_NO_THROW(connect());
  EXPECT_EQ(gF.createdQps, 6) << "3 QPs on each side";
  ASSERT_EQ(gF.rts.size(), 12u) << "each QP to RTR, then RTS";
  for (const ibv_qp_attr& a : gF.rts) {
    if (a.qp_state == IBV_QPS_RTR) {
      EXPECT_EQ(a.ah_attr.sl, 2);
      EXPECT_EQ(a.ah_attr.grh.traffic_class, 96);
    } else {
      EXPECT_EQ(a.timeout, 14);
      EXPECT_EQ(a.retry_cnt, 3);
    }
  }
  EXPECT_TRUE(transfer((1 << 20) + 3));
}

// NCCL_IB_PKEY is the P_Key index every QP takes at INIT (the ports pretend to a table of
// 8, and the device is then asked for its own index 0); one outside the table is refused
// naming the knob and the table's size.
TEST_F(IbVerbs, PkeyIndexReachesTheQueuePairs) {
  {
    Env p("NCCL_IB_PKEY", "3");
    gF.pkeyTable = 8;
    make(true);
    ASSERT_NO_THROW(connect());
    EXPECT_TRUE(transfer(4099));
    ASSERT_EQ(gF.inits.size(), 2u);
    for (const ibv_qp_attr& a : gF.inits) EXPECT_EQ(a.pkey_index, 3);
  }
  restart();
  gF.pkeyTable = 8;
  Env p("NCCL_IB_PKEY", "8");
  make(true);
  NetHandle h;
  Code c{};
  std::string e = errorOf([&] { b_->listen(0, &h); }, &c);
  EXPECT_EQ(c, Code::kInvalidArgument) << e;
  EXPECT_TRUE(has(e, "NCCL_IB_PKEY=8") && has(e, "partition-key table (8 entries")) << e;
}

// NCCL_IB_PCI_RELAXED_ORDERING, as NCCL reads it: 1 or 2 (the default) register data
// buffers (host memory, and GPU memory: here host memory registered as such) with
// IBV_ACCESS_RELAXED_ORDERING through ibv_reg_mr_iova2 where libibverbs has it (Debian 12's
// does; rxe takes the flag), 0 and an older libibverbs with plain ibv_reg_mr; the
// clear-to-send FIFOs, which the peer polls without a completion, always plainly. Data
// moves exactly every way.
TEST_F(IbVerbs, RelaxedOrderingAsNcclAsks) {
  ASSERT_TRUE(gReal->regMrIova2) << "this libibverbs has no ibv_reg_mr_iova2 (rdma-core 28 and later do)";
  struct Case {
    const char* mode;  // null: unset
    bool noIova2;
    bool relaxed;
  };
  for (Case c : {Case{nullptr, false, true}, Case{"1", false, true}, Case{"0", false, false},
                 Case{"2", true, false}}) {
    SCOPED_TRACE(std::string(c.mode ? c.mode : "unset") + (c.noIova2 ? ", no ibv_reg_mr_iova2" : ""));
    auto mode = envIf("NCCL_IB_PCI_RELAXED_ORDERING", c.mode);
    restart();
    gF.noIova2 = c.noIova2;
    faulty_ = faultyTable();
    make(true);
    ASSERT_NO_THROW(connect());
    const size_t data = (1 << 20) + 5;
    EXPECT_TRUE(transfer(data));
    std::vector<char> gpu(4096);
    auto gmr = recv_->regMr(gpu.data(), gpu.size(), loom::NetMemType::kCuda);
    int dataRegs = 0, fifoRegs = 0;
    for (const Faults::Reg& r : gF.regs) {
      const bool isData = r.bytes == data || r.bytes == gpu.size();
      dataRegs += isData;
      fifoRegs += !isData;
      const bool relaxed = isData && c.relaxed;
      EXPECT_EQ(r.iova2, relaxed) << r.bytes << " bytes";
      EXPECT_EQ((r.access & (1u << 20)) != 0, relaxed) << r.bytes << " bytes, access " << std::hex << r.access;
      EXPECT_TRUE(r.access & IBV_ACCESS_REMOTE_WRITE) << std::hex << r.access;
    }
    EXPECT_EQ(dataRegs, 3) << "the sent and received buffers and the GPU one";
    EXPECT_GE(fifoRegs, 2) << "the sender's FIFO and the receiver's clear-to-send records";
  }
}

// NCCL_IB_SPLIT_DATA_ON_QPS with 3 QPs: unset (0, NCCL's default), each message is one
// write on one QP, the QPs in turn; 1, each message is a write on every QP. The sender's
// setting holds: a receiver set otherwise follows it. Every message arrives exactly.
TEST_F(IbVerbs, SplitDataOnQpsAsNcclAsks) {
  Env q("NCCL_IB_QPS_PER_CONNECTION", "3");
  for (bool split : {false, true}) {
    SCOPED_TRACE(split ? "split" : "whole");
    restart();
    {
      Env s("NCCL_IB_SPLIT_DATA_ON_QPS", split ? "1" : "0");
      a_ = backend(0, &faulty_);  // the sender
    }
    {
      Env s("NCCL_IB_SPLIT_DATA_ON_QPS", split ? "0" : "1");  // the receiver differs
      b_ = backend(1, &faulty_);
    }
    ASSERT_NO_THROW(connect());
    for (size_t bytes : {size_t{1} << 20, size_t{4099}, size_t{3} << 16})
      EXPECT_TRUE(transfer(bytes)) << bytes;
    const std::vector<uint32_t>& w = gF.dataWrites;
    if (split) {
      ASSERT_EQ(w.size(), 9u) << "three writes a message";
      for (size_t m = 0; m < 3; ++m)
        EXPECT_EQ(std::set<uint32_t>(w.begin() + 3 * m, w.begin() + 3 * m + 3).size(), 3u) << "message " << m;
    } else {
      ASSERT_EQ(w.size(), 3u) << "one write a message";
      EXPECT_EQ(std::set<uint32_t>(w.begin(), w.end()).size(), 3u) << "the QPs in turn";
    }
  }
}

// NCCL_IB_ADAPTIVE_ROUTING and NCCL_IB_AR_THRESHOLD, as NCCL sends: with adaptive routing
// on, a message over the threshold is an unsignaled RDMA WRITE of its part on each QP it
// takes, chained in the same post to a signaled zero-byte WRITE WITH IMMEDIATE (its size);
// at or under the threshold, and with it off (rxe is RoCE: off unless set), one WRITE
// WITH IMMEDIATE carries the data. Split across 3 QPs, a QP whose part is empty gets the
// immediate alone. Every message arrives exactly.
TEST_F(IbVerbs, AdaptiveRoutingAsNcclAsks) {
  using W = Faults::Posted;
  auto pairs = [](const std::vector<W>& w, size_t from, size_t n) {  // (write, immediate) pairs
    std::vector<uint32_t> parts;
    for (size_t i = from; i < from + 2 * n; i += 2) {
      if (i + 1 >= w.size()) {
        ADD_FAILURE() << "no write pair at " << i;
        break;
      }
      EXPECT_EQ(w[i].opcode, IBV_WR_RDMA_WRITE) << i;
      EXPECT_FALSE(w[i].signaled || w[i].chained) << i;
      EXPECT_EQ(w[i + 1].opcode, IBV_WR_RDMA_WRITE_WITH_IMM) << i;
      EXPECT_TRUE(w[i + 1].signaled && w[i + 1].chained) << i;
      EXPECT_EQ(w[i + 1].bytes, 0u) << i;
      EXPECT_EQ(w[i].qp, w[i + 1].qp) << i;
      parts.push_back(w[i].bytes);
    }
    return parts;
  };
  struct Case {
    const char* ar;         // null: unset
    const char* threshold;  // null: unset (8192)
    bool on;
  };
  for (Case c : {Case{nullptr, "0", false}, Case{"0", "0", false}, Case{"1", nullptr, true}}) {
    SCOPED_TRACE(std::string("adaptive routing ") + (c.ar ? c.ar : "unset") + ", threshold " +
                 (c.threshold ? c.threshold : "unset"));
    restart();
    auto ar = envIf("NCCL_IB_ADAPTIVE_ROUTING", c.ar), th = envIf("NCCL_IB_AR_THRESHOLD", c.threshold);
    make();
    ASSERT_NO_THROW(connect());
    for (size_t bytes : {size_t{8192}, size_t{8193}, size_t{1} << 20}) EXPECT_TRUE(transfer(bytes)) << bytes;
    const std::vector<W>& w = gF.writes;
    if (!c.on) {
      ASSERT_EQ(w.size(), 3u) << "one write a message";
      for (const W& x : w) EXPECT_TRUE(x.opcode == IBV_WR_RDMA_WRITE_WITH_IMM && x.signaled && !x.chained);
      EXPECT_EQ(w[2].bytes, 1u << 20);
      continue;
    }
    ASSERT_EQ(w.size(), 5u) << "8192 bytes in one write; 8193 and 1 MiB each a write, then its immediate";
    EXPECT_TRUE(w[0].opcode == IBV_WR_RDMA_WRITE_WITH_IMM && w[0].bytes == 8192 && w[0].signaled);
    EXPECT_EQ(pairs(w, 1, 2), (std::vector<uint32_t>{8193, 1u << 20}));
  }
  // Split across 3 QPs, threshold 0: every QP's part a write and an immediate; 100 bytes
  // leave two QPs without data (one 128-byte-aligned part holds them), which get the
  // immediate alone.
  restart();
  Env ar("NCCL_IB_ADAPTIVE_ROUTING", "1"), th("NCCL_IB_AR_THRESHOLD", "0"), q("NCCL_IB_QPS_PER_CONNECTION", "3"),
      s("NCCL_IB_SPLIT_DATA_ON_QPS", "1");
  make();
  ASSERT_NO_THROW(connect());
  EXPECT_TRUE(transfer(4099));
  const std::vector<W>& w = gF.writes;
  ASSERT_EQ(w.size(), 6u);
  EXPECT_EQ(pairs(w, 0, 3), (std::vector<uint32_t>{1408, 1408, 1283}));
  EXPECT_EQ(std::set<uint32_t>({w[0].qp, w[2].qp, w[4].qp}).size(), 3u) << "one pair on each QP";
  EXPECT_TRUE(transfer(100));
  ASSERT_EQ(w.size(), 10u) << "a write and its immediate, then two immediates alone";
  EXPECT_EQ(pairs(w, 6, 1), (std::vector<uint32_t>{100}));
  for (size_t i = 8; i < 10; ++i)
    EXPECT_TRUE(w[i].opcode == IBV_WR_RDMA_WRITE_WITH_IMM && w[i].bytes == 0 && w[i].signaled && !w[i].chained) << i;
}

// NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE and NCCL_IB_ROCE_VERSION_NUM choose the GID both
// ends' QPs use (rxe_ib_suite.sh gives rxenet0 10.78.0.1/24 and fd77::1/64 beside its
// 10.77.0.1/24); data moves exactly over each. A range no GID lies in is refused, naming
// the GIDs there are.
TEST_F(IbVerbs, GidChoiceAsNcclAsks) {
  // The index of `addr` at RoCE version `v` in rxe0's table (-1: none).
  auto indexOf = [](const std::string& addr, int v) {
    ibv_context* ctx = nullptr;
    int n = 0;
    ibv_device** list = gReal->getDeviceList(&n);
    for (int i = 0; i < n && !ctx; ++i)
      if (std::string(gReal->getDeviceName(list[i])) == "rxe0") ctx = gReal->openDevice(list[i]);
    gReal->freeDeviceList(list);
    int found = -1;
    for (int i = 0; ctx && i < 64 && found < 0; ++i) {
      ibv_gid g{};
      if (gReal->queryGid(ctx, 1, i, &g) != 0) break;
      std::array<uint8_t, 16> raw;
      memcpy(raw.data(), g.raw, 16);
      std::ifstream t("/sys/class/infiniband/rxe0/ports/1/gid_attrs/types/" + std::to_string(i));
      std::string type;
      std::getline(t, type);
      if (loom::ibnet::gidText(raw) == addr && type == (v == 2 ? "RoCE v2" : "IB/RoCE v1")) found = i;
    }
    if (ctx) gReal->closeDevice(ctx);
    return found;
  };
  if (indexOf("fd77::1", 2) < 0 || indexOf("10.78.0.1", 2) < 0)
    GTEST_SKIP() << "rxenet0 lacks 10.78.0.1 or fd77::1 (rxe_ib_suite.sh adds them)";
  struct Case {
    const char* family;
    const char* range;
    const char* version;
    const char* addr;
    int v;
  };
  Env hca("NCCL_IB_HCA", "=rxe0");
  // rxe makes RoCE v2 GIDs only: asked for v1, the family and range still choose (as NCCL).
  for (Case c : {Case{nullptr, nullptr, nullptr, "10.77.0.1", 2}, Case{nullptr, nullptr, "1", "10.77.0.1", 2},
                 Case{"AF_INET6", nullptr, nullptr, "fd77::1", 2}, Case{"AF_INET6", "fd77::/16", "1", "fd77::1", 2},
                 Case{nullptr, "10.78.0.0/16", nullptr, "10.78.0.1", 2}}) {
    SCOPED_TRACE(std::string(c.family ? c.family : "-") + " " + (c.range ? c.range : "-") + " " +
                 (c.version ? c.version : "-"));
    restart();
    auto f = envIf("NCCL_IB_ADDR_FAMILY", c.family), r = envIf("NCCL_IB_ADDR_RANGE", c.range),
         v = envIf("NCCL_IB_ROCE_VERSION_NUM", c.version);
    make(true);
    ASSERT_NO_THROW(connect());
    EXPECT_TRUE(transfer(100003));
    const int want = indexOf(c.addr, c.v);
    ASSERT_GE(want, 0) << c.addr << " v" << c.v;
    int rtr = 0;
    for (const ibv_qp_attr& a : gF.rts) {
      if (a.qp_state != IBV_QPS_RTR) continue;
      ++rtr;
      std::array<uint8_t, 16> dgid;
      memcpy(dgid.data(), a.ah_attr.grh.dgid.raw, 16);
      EXPECT_EQ(a.ah_attr.grh.sgid_index, want);
      EXPECT_EQ(loom::ibnet::gidText(dgid), c.addr);
    }
    EXPECT_EQ(rtr, 2) << "both ends' QP";
  }
  restart();
  Env r("NCCL_IB_ADDR_RANGE", "10.99.0.0/16");
  make();
  NetHandle h;
  Code c{};
  std::string e = errorOf([&] { b_->listen(0, &h); }, &c);
  EXPECT_EQ(c, Code::kInvalidArgument) << e;
  EXPECT_TRUE(has(e, "IPv4 in 10.99.0.0/16") && has(e, "10.78.0.1 (RoCE v2)") && has(e, "fd77::1")) << e;
}

// Fatal asynchronous events (handed out by the table before the device's own) fail the
// connection they name, as NCCL (NCCL_IB_RETURN_ASYNC_EVENTS=1): a QP error its QP's, a CQ
// error its CQ's, a device error every one, with kSystemError naming the event; an event
// about another QP leaves the connection working, and with NCCL_IB_RETURN_ASYNC_EVENTS=0
// none fails it.
TEST_F(IbVerbs, FatalAsyncEventsFailWhatTheyName) {
  ibv_qp other{};
  other.qp_num = 0xfffff0;
  struct Case {
    ibv_event_type type;
    const char* id;
    bool ours;    // about the connection's QP or CQ (else another QP)
    bool report;  // NCCL_IB_RETURN_ASYNC_EVENTS
  };
  for (Case c : {Case{IBV_EVENT_QP_FATAL, "QP_FATAL", true, true},
                 Case{IBV_EVENT_QP_ACCESS_ERR, "QP_ACCESS_ERR", true, true},
                 Case{IBV_EVENT_QP_REQ_ERR, "QP_REQ_ERR", true, true}, Case{IBV_EVENT_CQ_ERR, "CQ_ERR", true, true},
                 Case{IBV_EVENT_DEVICE_FATAL, "DEVICE_FATAL", true, true},
                 Case{IBV_EVENT_QP_FATAL, "QP_FATAL", false, true},
                 Case{IBV_EVENT_QP_FATAL, "QP_FATAL", true, false}}) {
    SCOPED_TRACE(std::string(c.id) + (c.ours ? " on the connection" : " on another QP") +
                 (c.report ? "" : ", NCCL_IB_RETURN_ASYNC_EVENTS=0"));
    restart();
    auto quiet = envIf("NCCL_IB_RETURN_ASYNC_EVENTS", c.report ? nullptr : "0");
    make();
    ASSERT_NO_THROW(connect());
    ASSERT_TRUE(transfer(4096));
    ASSERT_EQ(gF.qps.size(), 1u) << "the sender's QP";
    ibv_async_event e{};
    e.event_type = c.type;
    if (c.type == IBV_EVENT_CQ_ERR) e.element.cq = gF.qps[0]->send_cq;
    else if (c.type != IBV_EVENT_DEVICE_FATAL) e.element.qp = c.ours ? gF.qps[0] : &other;
    gF.events.push_back(e);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // pending events are read every 10 ms
    // A write whose completion is taken in the same poll that reads the event still
    // completes (its data is in): the connection fails at the next at the latest.
    Code code{};
    int moved = 0;
    std::string err = errorOf([&] {
      for (int i = 0; i < 2; ++i) moved += transfer(1 << 16);
    }, &code);
    EXPECT_EQ(gF.eventsUnacked, 0) << "every event acknowledged";
    if (c.ours && c.report) {
      EXPECT_EQ(code, Code::kSystemError) << err;
      EXPECT_TRUE(has(err, std::string("IBV_EVENT_") + c.id) && has(err, "reported")) << err;
      if (c.type != IBV_EVENT_CQ_ERR && c.type != IBV_EVENT_DEVICE_FATAL) {
        EXPECT_TRUE(has(err, "on QP " + std::to_string(gF.qps[0]->qp_num))) << err;
      }
      EXPECT_LE(moved, 1);
    } else {
      EXPECT_EQ(err, "");
      EXPECT_EQ(moved, 2);
    }
  }
}

// The port going down (a real IBV_EVENT_PORT_ERR: rxenet1 set down under rxe1) is named in
// the error of the writes that then fail, so that a local link is told from a dead peer.
// The link is set up again after.
TEST_F(IbVerbs, PortDownIsNamedWhenWritesFail) {
  auto setUp = [](bool up) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    ifreq ifr{};
    strncpy(ifr.ifr_name, "rxenet1", IFNAMSIZ - 1);
    bool ok = fd >= 0 && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
    ifr.ifr_flags = static_cast<short>(up ? ifr.ifr_flags | IFF_UP : ifr.ifr_flags & ~IFF_UP);
    ok = ok && ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
    if (fd >= 0) close(fd);
    return ok;
  };
  std::string why;
  Env hca("NCCL_IB_HCA", "=rxe1"), t("NCCL_IB_TIMEOUT", "8"), r("NCCL_IB_RETRY_CNT", "1");
  make();
  try {
    connect();
  } catch (const loom::Error& e) {
    GTEST_SKIP() << "no second port rxe1 (LOOM_RXE_PORTS=2 makes it): " << e.what();
  }
  ASSERT_TRUE(transfer(4096));
  ASSERT_TRUE(setUp(false)) << "rxenet1 down: " << strerror(errno);
  Code code{};
  auto start = Clock::now();
  std::string err = errorOf([&] { transfer(1 << 20); }, &code);
  double took = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_TRUE(setUp(true)) << "rxenet1 up: " << strerror(errno);
  EXPECT_NE(err, "") << "a transfer over a port that is down succeeded";
  EXPECT_TRUE(has(err, "reported its port down") && has(err, "IBV_EVENT_PORT_ERR")) << err;
  std::cerr << "rxenet1 down: " << err << " (after " << took << " s)\n";
  EXPECT_LT(took, 10) << err;
  // The port comes back (later cases use rxe1).
  restart();
  bool back = false;
  for (auto until = Clock::now() + std::chrono::seconds(10); !back && Clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    try {
      make();
      connect(2);
      back = transfer(4096);
    } catch (const loom::Error&) {
    }
    restart();
  }
  EXPECT_TRUE(back) << "rxe1 did not carry data again after rxenet1 came back up";
}

TEST_F(IbVerbs, GidIndexOutsideTheTableIsInvalidArgument) {
  Env g("NCCL_IB_GID_INDEX", "200");  // rxe's table has 16 entries
  make();
  NetHandle h;
  Code c{};
  std::string e = errorOf([&] { b_->listen(0, &h); }, &c);
  EXPECT_EQ(c, Code::kInvalidArgument) << e;
  EXPECT_TRUE(has(e, "NCCL_IB_GID_INDEX=200")) << e;
}

#endif  // LOOM_VERBS_HEADERS

// These need no device: bad knobs and NCCL_IB_DISABLE are refused before any is looked for.
TEST(IbKnobs, OutOfRangeValuesAreInvalidArgument) {
  loom::NetInterface lo{"lo", loom::SocketAddr::parse("127.0.0.1:0", "ib test")};
  for (auto [k, v] : {std::pair{"NCCL_IB_QPS_PER_CONNECTION", "17"}, {"NCCL_IB_TIMEOUT", "0"},
                      {"NCCL_IB_RETRY_CNT", "8"}, {"NCCL_IB_SL", "16"}, {"NCCL_IB_TC", "-1"},
                      {"NCCL_IB_GID_INDEX", "256"}, {"NCCL_IB_PCI_RELAXED_ORDERING", "3"},
                      {"NCCL_IB_SPLIT_DATA_ON_QPS", "2"}, {"NCCL_IB_AR_THRESHOLD", "-1"}, {"NCCL_IB_ADDR_FAMILY", "AF_UNIX"},
                      {"NCCL_IB_ADDR_RANGE", "10.0.0.0/40"}, {"NCCL_IB_ROCE_VERSION_NUM", "3"},
                      {"NCCL_IB_PKEY", "65536"}}) {
    Env e(k, v);
    try {
      loom::makeIbNetBackend({loom::JobId{}, 0, 2, lo});
      ADD_FAILURE() << k << "=" << v << " accepted";
    } catch (const loom::Error& err) {
      if (!loom::verbsBuiltIn()) continue;  // refused for the missing headers instead
      EXPECT_EQ(err.code(), Code::kInvalidArgument) << err.what();
      EXPECT_TRUE(has(err.what(), std::string(k).substr(5))) << err.what();
    }
  }
}

TEST(IbKnobs, DisableTurnsVerbsOffEvenWhenNamed) {
  Env d("NCCL_IB_DISABLE", "1");
  std::string why;
  EXPECT_FALSE(loom::ibIsDefault(&why));
  if (!loom::verbsBuiltIn()) return;
  EXPECT_EQ(why, "NCCL_IB_DISABLE=1");
  loom::NetInterface lo{"lo", loom::SocketAddr::parse("127.0.0.1:0", "ib test")};
  Code c{};
  std::string e = errorOf([&] { loom::makeIbNetBackend({loom::JobId{}, 0, 2, lo}); }, &c);
  EXPECT_EQ(c, Code::kInvalidUsage) << e;
  EXPECT_TRUE(has(e, "NCCL_IB_DISABLE=1")) << e;
}

#ifdef LOOM_VERBS_HEADERS
// NCCL_IB_ADAPTIVE_ROUTING as NCCL reads it: unset (-2) on for InfiniBand ports, off for
// RoCE; 0 off; any other value on.
TEST(IbKnobs, AdaptiveRoutingDefaultsAsNccl) {
  EXPECT_TRUE(loom::ibnet::adaptiveRoutingOn(-2, false));
  EXPECT_FALSE(loom::ibnet::adaptiveRoutingOn(-2, true));
  for (bool roce : {false, true}) {
    EXPECT_FALSE(loom::ibnet::adaptiveRoutingOn(0, roce));
    EXPECT_TRUE(loom::ibnet::adaptiveRoutingOn(1, roce));
    EXPECT_TRUE(loom::ibnet::adaptiveRoutingOn(2, roce));
  }
}
#endif

// With NCCL_NET unset, verbs are the default where a port is active; a malformed NCCL_IB_*
// value then fails the start (ncclInvalidArgument) rather than giving way to sockets.
TEST(IbKnobs, AMalformedKnobFailsTheDefaultPathToo) {
  std::string why;
  if (!loom::ibIsDefault(&why)) GTEST_SKIP() << "verbs are not the default here (" << why << ")";
  loom::NetInterface lo{"lo", loom::SocketAddr::parse("127.0.0.1:0", "ib test")};
  Env range("NCCL_IB_ADDR_RANGE", "10.0.0.0");
  Code c{};
  std::string e = errorOf([&] { loom::startNetBackend({loom::JobId{}, 0, 2, lo}); }, &c);
  EXPECT_EQ(c, Code::kInvalidArgument) << e;
  EXPECT_TRUE(has(e, "NCCL_IB_ADDR_RANGE=10.0.0.0")) << e;
}

// Without an RDMA device NCCL_NET=IB says why (here: a kernel without RDMA, or no device).
TEST(IbKnobs, NoDeviceIsASystemErrorSayingWhy) {
  std::string why;
  if (loom::ibIsDefault(&why)) GTEST_SKIP() << "this machine has an active RDMA port";
  loom::NetInterface lo{"lo", loom::SocketAddr::parse("127.0.0.1:0", "ib test")};
  Code c{};
  std::string e = errorOf([&] { loom::makeIbNetBackend({loom::JobId{}, 0, 2, lo}); }, &c);
  EXPECT_EQ(c, Code::kSystemError) << e;
  EXPECT_TRUE(has(e, "NCCL_NET=IB: ") && has(e, why)) << e << " / " << why;
}

}  // namespace
}  // namespace loomtest
