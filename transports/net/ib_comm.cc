// The verbs data path. Receiver-driven: irecv() posts a receive on each QP the message
// takes and writes a clear-to-send record (where, how much, which rkey) into the sender's
// FIFO with RDMA WRITE; isend() waits for its record, then writes the message straight
// into the receive buffer with RDMA WRITE WITH IMMEDIATE, the immediate carrying the
// message's size: whole on one QP, the connection's QPs taken in turn (as NCCL by
// default), or split across all of them (NCCL_IB_SPLIT_DATA_ON_QPS=1; the sender's setting,
// which the receiver echoes at set-up). With adaptive routing (NCCL_IB_ADAPTIVE_ROUTING),
// messages over NCCL_IB_AR_THRESHOLD go as a plain RDMA WRITE followed by a zero-byte
// WRITE WITH IMMEDIATE, as NCCL sends them. Each QP's receive completion says its part is
// in (RC completes a QP's writes in order). The control stream beside the QPs carries the
// sender's goodbye and tells either side when the other's process is gone. Receives into
// GPU memory (registered through the peer-memory module or a DMA-BUF) are flushed as
// NCCL flushes them: an RDMA READ of one byte of it, on a queue pair connected to itself,
// completes only after every earlier write of the NIC into that memory is visible.
#include "transports/net/ib_verbs.h"

#ifdef LOOM_VERBS_HEADERS
#include <arpa/inet.h>

#include <atomic>
#include <cstring>

#include "base/error.h"
#include "transports/net/peer_control.h"

namespace loom::ibnet {
namespace {

constexpr double kCloseSec = 2;  // a closing sender waits this long for its writes
enum : uint64_t { kWrData = 1, kWrCts = 2, kWrRecv = 3, kWrFlush = 4 };

uint64_t wrId(uint64_t kind, size_t slot) { return kind << 32 | slot; }

const char* kindName(uint64_t kind) {
  return kind == kWrData ? "message write" : kind == kWrCts ? "clear-to-send write"
         : kind == kWrFlush ? "flush (RDMA READ)" : "receive";
}

struct IbRequest : NetRequest {
  bool busy = false;
  int left = 0;          // completions still due: the sender's writes, the receiver's receives
  bool ctsLeft = false;  // the receiver's clear-to-send write
  bool oversized = false;
  bool flush = false;    // a receiver's flush: one RDMA READ on the flush QP
  bool doomed = false;   // a receive posted after the comm failed, or whose posting failed
  uint64_t seq = 0;
  size_t bytes = 0;  // sent; for a receive its capacity, then what arrived
};

class IbComm : protected PeerControl {
 protected:
  IbComm(std::unique_ptr<IbQps> qps, IbConnInfo peer, Socket control, std::string who)
      : PeerControl(std::move(control), std::move(who)), qps_(std::move(qps)),
        api_(qps_->dev()->api), peer_(peer), whole_((peer.flags & kInfoWholeMessages) != 0) {}

  IbRequest* slot() {
    for (IbRequest& r : reqs_)
      if (!r.busy) return &r;
    return nullptr;
  }
  size_t index(const IbRequest* r) const { return static_cast<size_t>(r - reqs_); }
  IbRequest* check(NetRequest* req) {
    auto* r = static_cast<IbRequest*>(req);
    if (r < reqs_ || r >= reqs_ + kMaxRequests || !r->busy)
      LOOM_THROW(kInternalError, "%s: tested a request that is not in flight on this comm",
                 who_.c_str());
    return r;
  }
  void failIfBroken() const {
    if (!broken_.empty()) throw Error(brokenCode_, broken_);
  }
  // The comm fails for good: `code` kRemoteError where the peer is to blame, else
  // kSystemError (this side's verbs call or completion failed).
  void breakWith(Code code, std::string why) {
    if (!broken_.empty()) return;
    brokenCode_ = code;
    broken_ = std::move(why);
  }

  // Takes every completion the CQ (the connection's; else `cq`) holds, the successful ones
  // after a failed one included. The first that failed breaks the comm for good (those
  // after it are the QP's flushed work), and is thrown once all are taken.
  void poll(ibv_cq* cq = nullptr) {
    ibv_wc wc[16];
    bool failed = false;
    for (;;) {
      int n = api_.pollCq(cq ? cq : qps_->cq(), 16, wc);
      if (n < 0) {
        breakWith(Code::kSystemError, who_ + ": ibv_poll_cq failed");
        failIfBroken();
      }
      for (int i = 0; i < n; ++i) failed |= !take(wc[i]);
      if (n < 16) break;
    }
    if (failed) failIfBroken();
    if (!cq) checkEvents();
  }
  // A fatal asynchronous event naming the device, one of the connection's QPs or its CQ
  // breaks the connection (ib_events.h).
  void checkEvents() {
    std::string f = qps_->dev()->events->fatalFor(qps_->all(), qps_->size(), qps_->cq());
    if (f.empty()) return;
    breakWith(Code::kSystemError, who_ + ": " + f);
    failIfBroken();
  }
  // Polls (as poll) for `r`: a failure fails the call only while r still waits. A request
  // whose last completion came in the same batch as a later request's failure is done (a
  // receiver posts receives ahead, and a sender that has sent its last message may close
  // while their clear-to-send writes are in flight): the later request's test reports it.
  void pollFor(const IbRequest& r, ibv_cq* cq = nullptr) {
    try {
      poll(cq);
    } catch (const Error&) {
      if (r.left || r.ctsLeft) throw;
    }
  }

  void post(int qp, ibv_send_wr& wr) {
    ibv_send_wr* bad = nullptr;
    int rc = api_.postSend(qps_->qp(qp), &wr, &bad);
    if (rc != 0) {
      breakWith(Code::kSystemError, strprintf("%s: ibv_post_send failed: %s", who_.c_str(),
                                        strerror(rc > 0 ? rc : errno)));
      failIfBroken();
    }
  }

  // Host memory, or GPU memory as a device pointer (the peer-memory module resolves it).
  std::unique_ptr<NetMr> registerAny(void* data, size_t bytes, NetMemType type) {
    if (type == NetMemType::kCuda) return registerGpuMr(qps_->dev(), data, bytes, -1, 0, who_);
    return registerMr(qps_->dev(), data, bytes, who_);
  }

  // GPU memory by its DMA-BUF (a descriptor is required: -1 would mean peer memory below).
  std::unique_ptr<NetMr> registerDmaBuf(void* data, size_t bytes, int fd, uint64_t offset) {
    if (fd < 0)
      LOOM_THROW(kInvalidArgument, "%s: regMrDmaBuf with descriptor %d, which is no DMA-BUF", who_.c_str(), fd);
    return registerGpuMr(qps_->dev(), data, bytes, fd, offset, who_);
  }

  virtual void completed(uint64_t kind, IbRequest& r, const ibv_wc& wc) = 0;

  // The QPs message `seq` goes on: [first, first + count). Whole messages take the QPs in
  // turn; split ones take them all.
  int firstQp(uint64_t seq) const {
    return whole_ ? static_cast<int>(seq % static_cast<uint64_t>(qps_->size())) : 0;
  }
  int qpsPerMessage() const { return whole_ ? 1 : qps_->size(); }

  std::unique_ptr<IbQps> qps_;
  const IbvApi& api_;
  IbConnInfo peer_;
  bool whole_;  // NCCL_IB_SPLIT_DATA_ON_QPS=0 (the sender's, for both ends)
  IbRequest reqs_[kMaxRequests];
  uint64_t posted_ = 0;
  std::string broken_;  // why the comm failed; empty while it works
  Code brokenCode_ = Code::kRemoteError;

 private:
  // False where the completion failed (the comm is then broken).
  bool take(const ibv_wc& wc) {
    uint64_t kind = wc.wr_id >> 32;
    size_t i = wc.wr_id & 0xffffffffu;
    if (wc.status != IBV_WC_SUCCESS) {
      // The peer's fault (its QP gone, unreachable, or refusing the access), or ours.
      bool remote = wc.status == IBV_WC_RETRY_EXC_ERR || wc.status == IBV_WC_RNR_RETRY_EXC_ERR ||
                    wc.status == IBV_WC_REM_ACCESS_ERR || wc.status == IBV_WC_REM_OP_ERR ||
                    wc.status == IBV_WC_REM_INV_REQ_ERR;
      breakWith(remote ? Code::kRemoteError : Code::kSystemError,
                strprintf("%s: a %s failed: %s (status %d, vendor error 0x%x)%s", who_.c_str(),
                          kindName(kind), api_.wcStatusStr(wc.status), wc.status, wc.vendor_err,
                          remote ? ": the peer's queue pair is gone, unreachable or refused "
                                   "the access (its process exited, or the path between the "
                                   "ports is down; NCCL_IB_TIMEOUT and NCCL_IB_RETRY_CNT bound "
                                   "how long this takes to show)"
                                 : "") + qps_->dev()->events->portNote());
      return false;
    }
    if (i >= kMaxRequests || kind < kWrData || kind > kWrFlush) {
      breakWith(Code::kInternalError, who_ + ": a completion for no request of this comm");
      return false;
    }
    completed(kind, reqs_[i], wc);
    return true;
  }
};

class IbSendComm : public NetSendComm, IbComm {
 public:
  IbSendComm(std::unique_ptr<IbQps> qps, std::unique_ptr<IbMr> fifoMr, std::unique_ptr<Cts[]> fifo,
             IbConnInfo peer, Socket control, std::string who)
      : IbComm(std::move(qps), peer, std::move(control), std::move(who)),
        fifo_(std::move(fifo)), fifoMr_(std::move(fifoMr)) {}

  // Writes in flight get a bounded while to finish; the goodbye then tells the receiver
  // how many messages are in (a receive past them fails at once).
  ~IbSendComm() override {
    Deadline d = Deadline::in(kCloseSec);
    try {
      while (inFlight() && broken_.empty() && !pollControl(nullptr, nullptr) && !d.expired())
        poll();
    } catch (const Error&) {
    }
    uint64_t sent = posted_;
    for (const IbRequest& r : reqs_)
      if (r.busy && r.left && r.seq < sent) sent = r.seq;
    sayGoodbye(sent);
    // The QPs go before the FIFO's registration: a clear-to-send the receiver posted ahead
    // and still writes then finds no QP (dropped, its receive failing at the goodbye) rather
    // than a live QP without the memory (a remote access error on the receiver's side).
    qps_.reset();
  }

  std::unique_ptr<NetMr> regMr(void* data, size_t bytes, NetMemType type) override {
    return registerAny(data, bytes, type);
  }
  std::unique_ptr<NetMr> regMrDmaBuf(void* data, size_t bytes, int fd, uint64_t offset) override {
    return registerDmaBuf(data, bytes, fd, offset);
  }

  NetRequest* isend(const void* data, size_t bytes, int, NetMr* mr) override {
    failIfBroken();
    IbRequest* r = slot();
    if (!r) return nullptr;
    auto* m = static_cast<IbMr*>(mr);
    if (!m || !m->covers(data, bytes))
      LOOM_THROW(kInvalidUsage, "%s: a %zu-byte send at %p is not inside memory registered "
                 "with this comm", who_.c_str(), bytes, data);
    const int lanes = qpsPerMessage();
    size_t most = maxMessageBytes(*qps_->dev(), lanes);
    if (bytes > most)
      LOOM_THROW(kInvalidUsage, "%s: a %zu-byte message exceeds the %zu bytes one verbs "
                 "message may carry here (the port's largest write%s, under 4 GiB)",
                 who_.c_str(), bytes, most, lanes > 1 ? " times the QPs it is split across" : "");
    // The receiver's clear-to-send for this message, once both its ends are written.
    const volatile Cts& v = fifo_[posted_ % kMaxRequests];
    uint64_t want = posted_ + 1;
    if (v.seq != want || v.seqEnd != want) {
      poll();
      if (pollControl(nullptr, nullptr) && endedFor(kGraceSec))
        LOOM_THROW(kRemoteError, "%s: the receiver closed the connection (process exited?)",
                   who_.c_str());
      return nullptr;
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    uint64_t addr = v.addr, capacity = v.capacity;
    uint32_t rkey = v.rkey;
    bool over = bytes > capacity;
    size_t chunk = over ? 0 : ((bytes + lanes - 1) / lanes + 127) / 128 * 128;
    size_t idx = index(r);
    const int first = firstQp(posted_);
    const IbDevice& dev = *qps_->dev();
    const bool ar = dev.adaptiveRouting && bytes > dev.arThreshold;
    for (int i = 0; i < lanes; ++i) {
      size_t off = std::min(bytes, i * chunk), len = std::min(chunk, bytes - off);
      ibv_sge sge{reinterpret_cast<uintptr_t>(data) + off, static_cast<uint32_t>(len),
                  m->mr ? m->mr->lkey : 0};
      // The data, then (adaptive routing) the immediate in a zero-byte write of its own: RC
      // completes a QP's writes in order, so the receive completes after all of the data.
      ibv_send_wr wr[2]{};
      for (ibv_send_wr& w : wr) {
        w.wr_id = wrId(kWrData, idx);
        w.wr.rdma.remote_addr = addr + off;
        w.wr.rdma.rkey = rkey;
      }
      ibv_send_wr& imm = wr[ar && len ? 1 : 0];
      if (&imm != &wr[0]) {
        wr[0].opcode = IBV_WR_RDMA_WRITE;  // unsignaled: the immediate's completion covers it
        wr[0].next = &imm;
      }
      wr[0].sg_list = len ? &sge : nullptr;
      wr[0].num_sge = len ? 1 : 0;
      imm.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      imm.send_flags = IBV_SEND_SIGNALED;
      imm.imm_data = htonl(over ? kOversized : static_cast<uint32_t>(bytes));
      post(first + i, wr[0]);
    }
    r->busy = true;
    r->left = lanes;
    r->seq = posted_++;
    r->bytes = bytes;
    return r;
  }

  bool test(NetRequest* req, size_t* bytes) override {
    IbRequest* r = check(req);
    if (r->left) pollFor(*r);
    if (r->left) {
      failIfBroken();  // what it waits for will not come
      // A write's acknowledgement may trail the end of the receiver's stream a little.
      if (pollControl(nullptr, nullptr) && endedFor(kGraceSec))
        LOOM_THROW(kRemoteError, "%s: the receiver closed the connection with message %llu "
                   "in flight (process exited?)", who_.c_str(),
                   static_cast<unsigned long long>(r->seq));
      return false;
    }
    r->busy = false;
    *bytes = r->bytes;
    return true;
  }

 private:
  bool inFlight() const {
    for (const IbRequest& r : reqs_)
      if (r.busy && r.left) return true;
    return false;
  }
  void completed(uint64_t kind, IbRequest& r, const ibv_wc&) override {
    if (kind == kWrData && r.left > 0) --r.left;
  }

  std::unique_ptr<Cts[]> fifo_;
  std::unique_ptr<IbMr> fifoMr_;
};

class IbRecvComm : public NetRecvComm, IbComm {
 public:
  IbRecvComm(std::unique_ptr<IbQps> qps, IbConnInfo peer, Socket control, std::string who)
      : IbComm(std::move(qps), peer, std::move(control), std::move(who)),
        cts_(new Cts[kMaxRequests]()),
        ctsMr_(registerMr(qps_->dev(), cts_.get(), sizeof(Cts) * kMaxRequests, who_, false)) {}

  std::unique_ptr<NetMr> regMr(void* data, size_t bytes, NetMemType type) override {
    return registerAny(data, bytes, type);
  }
  std::unique_ptr<NetMr> regMrDmaBuf(void* data, size_t bytes, int fd, uint64_t offset) override {
    return registerDmaBuf(data, bytes, fd, offset);
  }

  // Receives after a failure are handed out (a pump keeps several posted); testing one
  // reports the failure.
  NetRequest* irecv(void* data, size_t capacity, int, NetMr* mr) override {
    IbRequest* r = slot();
    if (!r) return nullptr;
    auto* m = static_cast<IbMr*>(mr);
    if (!m || !m->covers(data, capacity))
      LOOM_THROW(kInvalidUsage, "%s: a %zu-byte receive at %p is not inside memory registered "
                 "with this comm", who_.c_str(), capacity, data);
    size_t idx = index(r);
    r->busy = true;
    r->seq = posted_++;
    r->bytes = capacity;
    r->oversized = false;
    r->left = 0;
    r->ctsLeft = false;
    r->doomed = !broken_.empty();
    if (r->doomed) return r;
    try {
      for (int i = 0, first = firstQp(r->seq); i < qpsPerMessage(); ++i) {
        ibv_recv_wr wr{};
        wr.wr_id = wrId(kWrRecv, idx);
        ibv_recv_wr* bad = nullptr;
        int rc = api_.postRecv(qps_->qp(first + i), &wr, &bad);
        if (rc != 0) {
          breakWith(Code::kSystemError, strprintf("%s: ibv_post_recv failed: %s", who_.c_str(),
                                            strerror(rc > 0 ? rc : errno)));
          r->doomed = true;
          return r;
        }
        ++r->left;
      }
      Cts& c = cts_[idx];
      c.seq = c.seqEnd = r->seq + 1;
      c.addr = reinterpret_cast<uintptr_t>(data);
      c.capacity = capacity;
      c.rkey = m->mr ? m->mr->rkey : 0;
      ibv_sge sge{reinterpret_cast<uintptr_t>(&c), sizeof(Cts), ctsMr_->mr->lkey};
      ibv_send_wr wr{};
      wr.wr_id = wrId(kWrCts, idx);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = peer_.fifoAddr + (r->seq % kMaxRequests) * sizeof(Cts);
      wr.wr.rdma.rkey = peer_.fifoRkey;
      post(0, wr);
      r->ctsLeft = true;
    } catch (const Error&) {
      r->doomed = true;  // broken_ says why; test() reports it
    }
    return r;
  }

  // Host memory the NIC wrote: nothing to flush. GPU memory: an RDMA READ of its first byte
  // into host memory, on the flush QP (made at the first flush), completes once every
  // earlier write of the NIC there is visible to the GPU.
  NetRequest* iflush(void* data, size_t bytes, NetMr* mr) override {
    auto* m = static_cast<IbMr*>(mr);
    if (!m || !m->gpu || !m->mr || bytes == 0) return nullptr;
    if (!m->covers(data, 1))
      LOOM_THROW(kInvalidUsage, "%s: a flush at %p is not inside memory registered with this comm", who_.c_str(),
                 data);
    // Not failed by a broken connection: the message it flushes is in (a later request's
    // failure may have broken the connection since), and the flush QP is its own.
    IbRequest* r = slot();
    if (!r)
      LOOM_THROW(kInternalError, "%s: a flush with %d requests in flight", who_.c_str(), kMaxRequests);
    if (!flushQps_) {
      auto qps = std::make_unique<IbQps>(qps_->dev(), 1, who_ + " (flush)");
      IbConnInfo self{};
      qps->describe(&self);
      qps->connect(self, IbOptions::fromKnobs());
      flushMr_ = registerMr(qps_->dev(), &flushBuf_, sizeof(flushBuf_), who_ + " (flush)", false);
      flushQps_ = std::move(qps);
    }
    ibv_sge sge{reinterpret_cast<uintptr_t>(&flushBuf_), 1, flushMr_->mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wrId(kWrFlush, index(r));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(data);
    wr.wr.rdma.rkey = m->mr->rkey;
    ibv_send_wr* bad = nullptr;
    if (int rc = api_.postSend(flushQps_->qp(0), &wr, &bad); rc != 0)
      LOOM_THROW(kSystemError, "%s: ibv_post_send of a flush (RDMA READ) failed: %s", who_.c_str(),
                 strerror(rc > 0 ? rc : errno));
    r->busy = true;
    r->flush = true;
    r->doomed = false;
    r->left = 1;
    r->ctsLeft = false;
    r->bytes = 0;
    return r;
  }

  bool test(NetRequest* req, size_t* bytes) override {
    IbRequest* r = check(req);
    if (r->flush) {
      if (r->left) pollFor(*r, flushQps_->cq());  // fails only if its own READ failed
      if (r->left) return false;
      r->busy = r->flush = false;
      *bytes = 0;
      return true;
    }
    // A receive posted after the comm failed, or whose posting failed, fails.
    if (r->doomed) failIfBroken();
    if (r->left || r->ctsLeft) pollFor(*r);
    if (r->left || r->ctsLeft) {
      failIfBroken();  // what it waits for will not come
      checkSender(r->seq);
      return false;
    }
    r->busy = false;
    if (r->oversized)
      LOOM_THROW(kRemoteError, "%s: a message larger than its %zu-byte receive arrived",
                 who_.c_str(), r->bytes);
    *bytes = r->bytes;
    return true;
  }

 private:
  void completed(uint64_t kind, IbRequest& r, const ibv_wc& wc) override {
    if (kind == kWrFlush && r.left > 0) {
      --r.left;
    } else if (kind == kWrCts) {
      r.ctsLeft = false;
    } else if (kind == kWrRecv && r.left > 0) {
      uint32_t size = ntohl(wc.imm_data);
      if (size == kOversized) r.oversized = true;
      else r.bytes = size;
      --r.left;
    }
  }

  std::unique_ptr<Cts[]> cts_;  // what the clear-to-send writes send, one per request
  std::unique_ptr<IbMr> ctsMr_;
  std::unique_ptr<IbQps> flushQps_;  // connected to itself; made at the first flush
  uint64_t flushBuf_ = 0;            // where a flush's byte lands
  std::unique_ptr<IbMr> flushMr_;
};

}  // namespace

std::unique_ptr<NetSendComm> makeIbSendComm(std::unique_ptr<IbQps> qps, std::unique_ptr<IbMr> fifoMr,
                                            std::unique_ptr<Cts[]> fifo, IbConnInfo peer,
                                            Socket control, std::string who) {
  return std::make_unique<IbSendComm>(std::move(qps), std::move(fifoMr), std::move(fifo), peer,
                                      std::move(control), std::move(who));
}

std::unique_ptr<NetRecvComm> makeIbRecvComm(std::unique_ptr<IbQps> qps, IbConnInfo peer,
                                            Socket control, std::string who) {
  return std::make_unique<IbRecvComm>(std::move(qps), peer, std::move(control), std::move(who));
}

}  // namespace loom::ibnet
#endif
