// Internals the UCX backend's files share (ucx_backend.cc: tagged messages, the
// listener and the backend; ucx_rma.cc: RMA put): the worker, the request slots, the
// control stream every connection has beside its UCP endpoint.
#pragma once

#include "transports/net/ucx_api.h"

#ifdef LOOM_UCX_HEADERS
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/socket.h"
#include "base/time.h"
#include "transports/net/listener.h"
#include "transports/net/net_backend.h"
#include "transports/net/peer_control.h"

namespace loom::ucxnet {

constexpr uint16_t kKindUcx = 5;               // PeerHello kind of a UCX control stream
constexpr uint32_t kHandleMagic = 0x4c554358;  // "LUCX"
constexpr uint32_t kAddressMagic = 0x4c554341;
constexpr int kMaxRequests = 32;  // per comm, as NCCL_NET_MAX_REQUESTS
constexpr uint32_t kMaxAddressBytes = 64 << 10;
constexpr double kCloseSec = 2;   // a closing comm waits this long for its sends

struct UcxHandle {
  uint32_t magic;
  int32_t rank;  // the listening rank: hellos are addressed to it
  uint64_t connId;
  HandleAddr addr;  // the listener's
};
static_assert(sizeof(UcxHandle) <= kNetHandleBytes);

// On a control stream: the receiver's worker address first, the sender's goodbye last.
struct AddressHeader {
  uint32_t magic;
  uint32_t bytes;
};

// One backend's UCP context and worker, shared by its comms. UCP calls are serialised
// by `mu` (the worker is UCS_THREAD_MODE_SERIALIZED): the proxy thread pumps comms
// while the init thread may be accepting others.
struct Worker {
  explicit Worker(const UcxApi& a) : api(a) {}
  ~Worker() {
    // Endpoints still closing get a bounded while to finish, then are forced.
    Deadline d = Deadline::in(kCloseSec);
    while (!closing.empty() && !d.expired()) progress();
    // (A close that did not end in time is freed once: a flush that did not is freed, then
    // its endpoint closed and that request freed.)
    for (Closing& c : closing) {
      if (UCS_PTR_IS_PTR(c.req)) api.requestFree(c.req);
      c.req = nullptr;
      if (c.flushing) c.req = close(c.ep, c.peerMode);
      if (UCS_PTR_IS_PTR(c.req)) api.requestFree(c.req);
    }
    if (worker) api.workerDestroy(worker);
    if (context) api.cleanup(context);
  }
  void progress() {
    while (api.workerProgress(worker) != 0) {
    }
    advanceClosing();
  }
  // Takes over a send comm's endpoint: flushed first where `flush` (what was sent has
  // reached the receiver; that needs the receiver's worker, so it is not waited for),
  // then closed.
  void retire(ucp_ep_h ep, bool flush, bool peerMode) {
    ucp_request_param_t p{};
    if (flush)
      closing.push_back({ep, api.epFlushNbx(ep, &p), true, peerMode});
    else
      closing.push_back({ep, close(ep, peerMode), false, peerMode});
    advanceClosing();
  }

  const UcxApi& api;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<uint8_t> address;
  std::mutex mu;
  // Endpoints' error states: kept for the worker's life, since UCP may report an
  // endpoint's error while it closes.
  std::vector<std::unique_ptr<std::pair<bool, ucs_status_t>>> epErrors;

 private:
  struct Closing {
    ucp_ep_h ep;
    ucs_status_ptr_t req;  // the flush, then the close, in progress
    bool flushing;
    bool peerMode;
  };
  // Forced in error mode "peer" (a flushing close would wait for the receiver's worker);
  // UCP allows that only there.
  ucs_status_ptr_t close(ucp_ep_h ep, bool peerMode) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = peerMode ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    return api.epCloseNbx(ep, &p);
  }
  void advanceClosing() {
    for (size_t i = 0; i < closing.size();) {
      Closing& c = closing[i];
      if (UCS_PTR_IS_PTR(c.req)) {
        if (api.requestCheckStatus(c.req) == UCS_INPROGRESS) {
          ++i;
          continue;
        }
        api.requestFree(c.req);
      }
      if (c.flushing) {
        c.flushing = false;
        c.req = close(c.ep, c.peerMode);
        continue;  // look at the close at once
      }
      closing.erase(closing.begin() + static_cast<long>(i));
    }
  }
  std::vector<Closing> closing;
};

struct UcxRequest : NetRequest {
  void* ucx = nullptr;   // UCP's request; null once complete
  void* ucx2 = nullptr;  // RMA: the put of the completion flag
  bool busy = false;     // handed out and not yet reported complete
  uint64_t seq = 0;
  size_t bytes = 0;
  ucp_tag_recv_info_t info{};
  uint64_t flag = 0;                // RMA: what the flag put writes
  uint64_t region = UINT64_MAX;     // RMA: a region mapped for this receive alone
};

// What both directions share: the worker, the control stream, the request slots.
class UcxComm : protected PeerControl {
 protected:
  UcxComm(std::shared_ptr<Worker> w, Socket control, uint64_t tag, std::string who)
      : PeerControl(std::move(control), std::move(who)), w_(std::move(w)), api_(w_->api),
        tag_(tag) {}

  UcxRequest* slot() {
    for (UcxRequest& r : reqs_)
      if (!r.busy) return &r;
    return nullptr;
  }
  UcxRequest* check(NetRequest* req) {
    auto* r = static_cast<UcxRequest*>(req);
    if (r < reqs_ || r >= reqs_ + kMaxRequests || !r->busy)
      LOOM_THROW(kInternalError, "%s: tested a request that is not in flight on this comm",
                 who_.c_str());
    return r;
  }
  bool pending() const {
    for (const UcxRequest& r : reqs_)
      if (r.ucx || r.ucx2) return true;
    return false;
  }

  std::shared_ptr<Worker> w_;
  const UcxApi& api_;
  uint64_t tag_;
  UcxRequest reqs_[kMaxRequests];
  uint64_t posted_ = 0;
};

class UcxMr : public NetMr {};

inline void requireHost(NetMemType type, const std::string& who) {
  if (type != NetMemType::kHost)
    LOOM_THROW(kInvalidUsage, "%s: the UCX backend moves host memory only (CUDA memory needs "
               "the CUDA executor, not built yet)", who.c_str());
}

inline std::unique_ptr<NetMr> hostOnly(NetMemType type, const std::string& who) {
  requireHost(type, who);
  return std::make_unique<UcxMr>();
}

using EpError = std::pair<bool, ucs_status_t>;

// The sending side both protocols share (ucx_comm.cc): the endpoint, reaping requests
// (a data operation in `ucx`, RMA's flag put in `ucx2`), failure checks, and the close.
class UcxSender : public NetSendComm, protected UcxComm {
 public:
  UcxSender(std::shared_ptr<Worker> w, ucp_ep_h ep, bool peerMode, EpError* err,
            Socket control, uint64_t tag, std::string who)
      : UcxComm(std::move(w), std::move(control), tag, std::move(who)), ep_(ep),
        peerMode_(peerMode), err_(err) {}
  std::unique_ptr<NetMr> regMr(void*, size_t, NetMemType type) override {
    return hostOnly(type, who_);
  }
  bool test(NetRequest* req, size_t* bytes) override;

 protected:
  // Reads what the receiver wrote on the control stream; true once the stream ended.
  virtual bool controlEnded() = 0;
  // What must go before the endpoint does (RMA's unpacked rkeys); `clean`: no operation
  // of UCP's is still in flight.
  virtual void releaseRemote(bool) {}
  // Derived destructors call this first: sends in flight may finish while the receiver
  // is there (bounded); the worker then flushes and closes the endpoint in its own time
  // (a close never waits on the receiver's worker); the goodbye goes last. Without error
  // mode "peer" the close cannot cancel what UCP still reads from the caller's buffers,
  // so those sends get longer.
  void close();
  // True once `r` is complete; throws if it failed.
  bool reap(UcxRequest& r);
  // A send in flight fails once the endpoint failed, or `grace` seconds after the
  // receiver's control stream ended (its completion acknowledgement may trail the end).
  void failIfBroken(double grace);

  ucp_ep_h ep_;
  bool peerMode_;
  EpError* err_;            // owned by the worker
  uint64_t completed_ = 0;  // sends UCP reported complete
};

// A new connection's comms with RMA put (ucx_rma.cc).
std::unique_ptr<NetSendComm> makeRmaSendComm(std::shared_ptr<Worker> w, ucp_ep_h ep,
                                             bool peerMode, EpError* err, Socket control,
                                             std::string who);
std::unique_ptr<NetRecvComm> makeRmaRecvComm(std::shared_ptr<Worker> w, Socket control,
                                             std::string who);

}  // namespace loom::ucxnet
#endif
