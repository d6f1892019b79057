#include "transports/net/ucx_backend.h"

#include "transports/net/ucx_comm.h"

#include "base/error.h"

#ifdef LOOM_UCX_HEADERS
#include <netinet/in.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "base/time.h"
#include "bootstrap/wire.h"
#include "transports/net/listener.h"
#include "transports/socket/hello_stream.h"
#include "transports/socket/stream_acceptor.h"

namespace loom {
namespace {

using namespace ucxnet;  // NOLINT: this file is the UCX backend

class UcxSendComm : public UcxSender {
 public:
  using UcxSender::UcxSender;
  ~UcxSendComm() override { close(); }

  NetRequest* isend(const void* data, size_t bytes, int, NetMr*) override {
    std::lock_guard<std::mutex> lk(w_->mu);
    failIfBroken(0);
    UcxRequest* r = slot();
    if (!r) return nullptr;
    ucp_request_param_t p{};  // contiguous bytes, no callback: test() polls
    ucs_status_ptr_t s = api_.tagSendNbx(ep_, data, bytes, tag_, &p);
    if (UCS_PTR_IS_ERR(s))
      LOOM_THROW(kRemoteError, "%s: ucp_tag_send_nbx failed: %s", who_.c_str(),
                 api_.statusText(UCS_PTR_STATUS(s)).c_str());
    r->ucx = s;  // null: already complete
    if (!s) ++completed_;
    r->busy = true;
    r->seq = posted_++;
    r->bytes = bytes;
    return r;
  }

 private:
  // The receiver never writes on a tagged connection's stream: its end means it is gone.
  bool controlEnded() override { return pollControl(nullptr, nullptr); }
};

class UcxRecvComm : public NetRecvComm, UcxComm {
 public:
  UcxRecvComm(std::shared_ptr<Worker> w, Socket control, uint64_t tag, std::string who)
      : UcxComm(std::move(w), std::move(control), tag, std::move(who)) {}

  ~UcxRecvComm() override {
    std::lock_guard<std::mutex> lk(w_->mu);
    // Receives still posted are cancelled; UCP must be done with their buffers before
    // the caller frees them.
    // A receive UCP has matched already (a rendezvous, a message in fragments) is not
    // cancelled: it ends when its data is in, or fails once the sender is gone.
    for (UcxRequest& r : reqs_)
      if (r.ucx) api_.requestCancel(w_->worker, r.ucx);
    Deadline d = Deadline::in(kDrainSec);
    for (UcxRequest& r : reqs_) {
      if (!r.ucx) continue;
      while (api_.requestCheckStatus(r.ucx) == UCS_INPROGRESS && !d.expired()) w_->progress();
      api_.requestFree(r.ucx);
    }
  }

  std::unique_ptr<NetMr> regMr(void*, size_t, NetMemType type) override {
    return hostOnly(type, who_);
  }

  NetRequest* irecv(void* data, size_t capacity, int, NetMr*) override {
    std::lock_guard<std::mutex> lk(w_->mu);
    UcxRequest* r = slot();
    if (!r) return nullptr;
    r->info = {};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // always a request, tested for its size
    ucs_status_ptr_t s = api_.tagRecvNbx(w_->worker, data, capacity, tag_, ~ucp_tag_t{0}, &p);
    if (UCS_PTR_IS_ERR(s))
      LOOM_THROW(kInternalError, "%s: ucp_tag_recv_nbx failed: %s", who_.c_str(),
                 api_.statusText(UCS_PTR_STATUS(s)).c_str());
    r->ucx = s;
    r->busy = true;
    r->seq = posted_++;
    r->bytes = capacity;
    return r;
  }

  // Host memory that UCP wrote: nothing to flush.
  NetRequest* iflush(void*, size_t, NetMr*) override { return nullptr; }

  bool test(NetRequest* req, size_t* bytes) override {
    std::lock_guard<std::mutex> lk(w_->mu);
    UcxRequest* r = check(req);
    if (r->ucx) {
      w_->progress();
      ucs_status_t s = api_.tagRecvRequestTest(r->ucx, &r->info);
      if (s == UCS_INPROGRESS) {
        checkSender(r->seq);
        return false;
      }
      api_.requestFree(r->ucx);
      r->ucx = nullptr;
      if (s == UCS_ERR_MESSAGE_TRUNCATED)
        LOOM_THROW(kRemoteError, "%s: a message larger than its %zu-byte receive arrived",
                   who_.c_str(), r->bytes);
      if (s != UCS_OK)
        LOOM_THROW(kRemoteError, "%s: a receive failed: %s", who_.c_str(),
                   api_.statusText(s).c_str());
    }
    r->busy = false;
    *bytes = r->info.length;
    return true;
  }

 private:
};

class UcxListenComm : public NetListenComm {
 public:
  UcxListenComm(std::shared_ptr<Worker> w, StreamAcceptor& acceptor, uint64_t connId, bool rma,
                std::string who)
      : w_(std::move(w)), acceptor_(acceptor), connId_(connId), rma_(rma), who_(std::move(who)) {}

  std::unique_ptr<NetRecvComm> accept(std::unique_ptr<NetStage>&) override {
    auto got = acceptor_.tryTake(-1, connId_, 1, 0);
    if (!got) return nullptr;
    Socket s = std::move((*got)[0]);
    std::string who = strprintf("%s from %s", who_.c_str(), s.peer().str().c_str());
    // The worker's address, for the sender's endpoint: small enough for a fresh
    // socket's buffer, so this does not wait on the peer.
    AddressHeader h{kAddressMagic, static_cast<uint32_t>(w_->address.size())};
    s.setNonBlocking(false);
    s.sendAll(&h, sizeof(h), Deadline::in(10), who.c_str());
    s.sendAll(w_->address.data(), w_->address.size(), Deadline::in(10), who.c_str());
    if (rma_) return makeRmaRecvComm(w_, std::move(s), who);
    return std::make_unique<UcxRecvComm>(w_, std::move(s), connId_, who);
  }
  bool mayStillArrive() const override { return acceptor_.busy(); }

 private:
  std::shared_ptr<Worker> w_;
  StreamAcceptor& acceptor_;
  uint64_t connId_;
  bool rma_;
  std::string who_;
};

// A connect in progress: the control stream's hello, then the listener's worker address.
struct UcxConnectStage : NetStage {
  explicit UcxConnectStage(HelloStream s) : stream(std::move(s)) {}
  HelloStream stream;
  bool helloSent = false;
  Socket sock;
  AddressHeader header{};
  size_t got = 0;  // bytes of header + address read
  std::vector<uint8_t> address;
  Deadline deadline = Deadline::in(60);
};

void onEpError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* e = static_cast<std::pair<bool, ucs_status_t>*>(arg);
  e->first = true;
  e->second = status;
}

// A UCX setting as this backend sees it: its override, else UCX_<name>, else "(unset)".
std::string setting(const UcxConfig& config, const char* name) {
  for (const auto& [k, v] : config)
    if (k == name) return v;
  const char* e = getenv((std::string("UCX_") + name).c_str());
  return std::string(e ? e : "(unset)");
}

class UcxBackend : public BootstrapIfaceBackend {
 public:
  UcxBackend(const NetContext& ctx, const UcxApi& api, const UcxConfig& config, bool rma)
      : BootstrapIfaceBackend(ctx, "UCX", kKindUcx, "UCX control listener"),
        w_(std::make_shared<Worker>(api)), rma_(rma) {
    ucp_config_t* cfg = nullptr;
    check(api.configRead(nullptr, nullptr, &cfg), "ucp_config_read");
    for (const auto& [name, value] : config) {
      ucs_status_t s = api.configModify(cfg, name.c_str(), value.c_str());
      if (s != UCS_OK) {
        api.configRelease(cfg);
        LOOM_THROW(kInvalidArgument, "rank %d: UCX: UCX_%s=%s is not accepted: %s", ctx_.rank,
                   name.c_str(), value.c_str(), api.statusText(s).c_str());
      }
    }
    if (rma) {
      // UCX 1.13 emulates puts over tcp with active messages and aborts the receiving
      // process (ucp_put_handler: "Fatal: unexpected error") when the sender dies
      // mid-put; a dead peer must be an error, never a crash, so tcp is refused here.
      std::string tls = setting(config, "TLS");
      if (tls == "(unset)" || tls == "all" || tls.find("tcp") != std::string::npos) {
        api.configRelease(cfg);
        LOOM_THROW(kInvalidUsage, "rank %d: NCCL_NET=UCX_RMA needs UCX transports with "
                   "native RMA (UCX_TLS=%s; e.g. rc, dc or posix,cma): over tcp UCX 1.13 "
                   "emulates puts and aborts the receiving process when a sender dies; use "
                   "NCCL_NET=UCX there", ctx_.rank, tls.c_str());
      }
    }
    if (rma) {
      // UCX 1.13's fence orders puts on one lane only: the flag must follow its data there,
      // so puts get one bandwidth lane (1.13 sizes RMA bandwidth lanes by this setting).
      ucs_status_t m = api.configModify(cfg, "MAX_RNDV_RAILS", "1");
      if (m != UCS_OK) {
        api.configRelease(cfg);
        check(m, "ucp_config_modify(MAX_RNDV_RAILS)");
      }
    }
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = rma ? UCP_FEATURE_RMA : UCP_FEATURE_TAG;
    ucs_status_t s = api.initVersion(UCP_API_MAJOR, UCP_API_MINOR, &p, cfg, &w_->context);
    api.configRelease(cfg);
    if (s != UCS_OK) {
      // Most often no transport or device is left once UCX_TLS / UCX_NET_DEVICES apply.
      LOOM_THROW(kSystemError, "rank %d: UCX %s: ucp_init failed: %s (UCX_TLS=%s, "
                 "UCX_NET_DEVICES=%s: is there a device those allow?)", ctx_.rank,
                 api.version.c_str(), api.statusText(s).c_str(), setting(config, "TLS").c_str(),
                 setting(config, "NET_DEVICES").c_str());
    }
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    check(api.workerCreate(w_->context, &wp, &w_->worker), "ucp_worker_create");
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    check(api.workerGetAddress(w_->worker, &addr, &len), "ucp_worker_get_address");
    w_->address.assign(reinterpret_cast<uint8_t*>(addr), reinterpret_cast<uint8_t*>(addr) + len);
    api.workerReleaseAddress(w_->worker, addr);
  }

  std::unique_ptr<NetListenComm> listen(int dev, NetHandle* handle) override {
    checkDev(dev);
    UcxHandle h{};
    h.magic = kHandleMagic;
    h.rank = ctx_.rank;
    h.connId = nextConnId();
    h.addr.set(acceptor().addr(), ctx_.rank);
    memset(handle->bytes, 0, sizeof(handle->bytes));
    memcpy(handle->bytes, &h, sizeof(h));
    return std::make_unique<UcxListenComm>(
        w_, acceptor(), h.connId, rma_,
        strprintf("rank %d UCX net connection #%llu", ctx_.rank,
                  static_cast<unsigned long long>(h.connId)));
  }

  std::unique_ptr<NetSendComm> connect(int dev, const NetHandle& handle,
                                       std::unique_ptr<NetStage>& stage) override {
    checkDev(dev);
    UcxHandle h;
    memcpy(&h, handle.bytes, sizeof(h));
    SocketAddr a;
    bool ok = h.magic == kHandleMagic && h.rank >= 0 && h.rank < ctx_.nranks && h.addr.get(&a);
    if (!ok) LOOM_THROW(kRemoteError, "rank %d: malformed UCX net handle", ctx_.rank);
    std::string who = strprintf("rank %d UCX net connection #%llu to rank %d at %s", ctx_.rank,
                                static_cast<unsigned long long>(h.connId), h.rank,
                                a.str().c_str());
    if (!stage)
      stage = std::make_unique<UcxConnectStage>(HelloStream(
          a, makePeerHello(ctx_.job, kKindUcx, ctx_.rank, h.rank, StreamAcceptor::streamId(h.connId, 0)),
          who));
    auto& st = static_cast<UcxConnectStage&>(*stage);
    if (!readAddress(st, who)) {
      if (st.deadline.expired()) LOOM_THROW(kRemoteError, "%s: connect timed out", who.c_str());
      return nullptr;
    }
    std::lock_guard<std::mutex> lk(w_->mu);
    w_->epErrors.push_back(std::make_unique<std::pair<bool, ucs_status_t>>(false, UCS_OK));
    auto* err = w_->epErrors.back().get();
    // Error mode "peer" where the transports support it (tcp, verbs); shared memory in
    // UCX 1.13 has no peer failure handler, and the control stream tells of a dead peer
    // there instead.
    ucp_ep_h e = nullptr;
    ucs_status_t s = UCS_ERR_UNREACHABLE;
    bool peerMode = false;
    for (ucp_err_handling_mode_t mode : {UCP_ERR_HANDLING_MODE_PEER, UCP_ERR_HANDLING_MODE_NONE}) {
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(st.address.data());
      ep.err_mode = mode;
      ep.err_handler.cb = onEpError;
      ep.err_handler.arg = err;
      peerMode = mode == UCP_ERR_HANDLING_MODE_PEER;
      if (peerMode)  // may well be unreachable: not worth UCX's ERROR line
        w_->api.quietly([&] { s = w_->api.epCreate(w_->worker, &ep, &e); });
      else
        s = w_->api.epCreate(w_->worker, &ep, &e);
      if (s != UCS_ERR_UNREACHABLE) break;
    }
    if (s != UCS_OK) w_->epErrors.pop_back();
    if (s != UCS_OK)
      LOOM_THROW(kRemoteError, "%s: ucp_ep_create failed: %s (no UCX transport reaches the "
                 "peer? check UCX_TLS and UCX_NET_DEVICES)", who.c_str(),
                 w_->api.statusText(s).c_str());
    Socket sock = std::move(st.sock);
    stage.reset();
    if (rma_) return makeRmaSendComm(w_, e, peerMode, err, std::move(sock), who);
    return std::make_unique<UcxSendComm>(w_, e, peerMode, err, std::move(sock), h.connId, who);
  }

 private:
  void check(ucs_status_t s, const char* call) {
    if (s != UCS_OK)
      LOOM_THROW(kSystemError, "rank %d: UCX %s: %s failed: %s", ctx_.rank,
                 w_->api.version.c_str(), call, w_->api.statusText(s).c_str());
  }

  // One step of reading the listener's worker address; true once it is all here.
  bool readAddress(UcxConnectStage& st, const std::string& who) {
    if (!st.helloSent) {
      if (!st.stream.advance()) return false;
      st.helloSent = true;
      st.sock = st.stream.take();
    }
    constexpr size_t hb = sizeof(AddressHeader);
    while (st.got < hb) {
      size_t n = st.sock.tryRecv(reinterpret_cast<char*>(&st.header) + st.got, hb - st.got,
                                 who.c_str());
      if (n == 0) return false;
      st.got += n;
      if (st.got == hb) {
        if (st.header.magic != kAddressMagic || st.header.bytes == 0 ||
            st.header.bytes > kMaxAddressBytes)
          LOOM_THROW(kRemoteError, "%s: the listener sent no valid UCX worker address",
                     who.c_str());
        st.address.resize(st.header.bytes);
      }
    }
    while (st.got < hb + st.address.size()) {
      size_t n = st.sock.tryRecv(st.address.data() + (st.got - hb),
                                 st.address.size() - (st.got - hb), who.c_str());
      if (n == 0) return false;
      st.got += n;
    }
    return true;
  }

  std::shared_ptr<Worker> w_;
  bool rma_;  // RMA put (UCX_RMA) rather than tagged messages (UCX)
};

}  // namespace

std::unique_ptr<NetBackend> makeUcxNetBackend(const NetContext& ctx, const UcxConfig& config,
                                              bool rma) {
  std::string why;
  const UcxApi* api = ucxApi(&why);
  if (!api) LOOM_THROW(kSystemError, "rank %d: NCCL_NET=UCX: %s", ctx.rank, why.c_str());
  return std::make_unique<UcxBackend>(ctx, *api, config, rma);
}

}  // namespace loom

#else

namespace loom {
std::unique_ptr<NetBackend> makeUcxNetBackend(const NetContext& ctx, const UcxConfig&, bool) {
  LOOM_THROW(kSystemError, "rank %d: NCCL_NET=UCX: %s", ctx.rank, ucxUnavailable().c_str());
}
}  // namespace loom

#endif
