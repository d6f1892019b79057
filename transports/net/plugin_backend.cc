#include "transports/net/plugin_backend.h"

#include <climits>
#include <cstring>

#include "base/error.h"
#include "base/hmac.h"
#include "base/log.h"

namespace loom {
namespace {

using netabi::kOk;
using R = netabi::Result;
constexpr size_t kAuthBytes = sizeof(Digest);

Code codeFor(R r) {
  switch (r) {
    case netabi::kSystemError: return Code::kSystemError;
    case netabi::kInvalidArgument: return Code::kInvalidArgument;
    case netabi::kInvalidUsage: return Code::kInvalidUsage;
    case netabi::kRemoteError: return Code::kRemoteError;
    default: return Code::kInternalError;
  }
}

// One plugin initialised for one communicator; comms keep it alive so that a v11 plugin's
// context is finalised only after every comm made with it is closed.
struct Session {
  std::shared_ptr<PluginApi> api;
  void* ctx = nullptr;
  int rank = 0;
  JobId job;
  ~Session() { api->finalize(ctx); }

  void check(R r, const char* call, Code code) const {
    if (r != kOk)
      throwError(code, "rank %d: NET/Plugin %s: %s returned %s", rank, api->describe().c_str(),
                 call, netResultName(r));
  }
  void check(R r, const char* call) const { check(r, call, codeFor(r)); }
  Digest authTag(const NetHandle& h) const {
    std::string msg = "loom-net-plugin-auth";
    msg.append(reinterpret_cast<const char*>(h.bytes), sizeof(h.bytes));
    return hmacSha256(job.secret, sizeof(job.secret), msg.data(), msg.size());
  }
};
using SessionPtr = std::shared_ptr<Session>;

class PluginMr : public NetMr {
 public:
  PluginMr(SessionPtr s, void* comm, void* mh, NetMemType type)
      : s_(std::move(s)), comm_(comm), mh_(mh), type_(type) {}
  ~PluginMr() override { s_->api->deregMr(comm_, mh_); }
  void* handle() const { return mh_; }
  NetMemType type() const { return type_; }

 private:
  SessionPtr s_;
  void* comm_;
  void* mh_;
  NetMemType type_;
};

void* mhOf(NetMr* mr) { return mr ? static_cast<PluginMr*>(mr)->handle() : nullptr; }

// A comm's requests: a fixed pool of NCCL_NET_MAX_REQUESTS, no allocation per call.
struct Req : NetRequest {
  void* req = nullptr;
  size_t capacity = 0;
  bool used = false;
};
struct ReqPool {
  Req reqs[netabi::kMaxRequests];
  int used = 0;
  Req* take(void* r, size_t capacity) {
    for (Req& q : reqs)
      if (!q.used) {
        q.req = r;
        q.capacity = capacity;
        q.used = true;
        ++used;
        return &q;
      }
    return nullptr;
  }
  void give(Req* q) {
    q->used = false;
    --used;
  }
};

// Polls `req` once; true when done. A failed test means the connection is unusable:
// the peer is gone as far as this rank can tell.
bool testOnce(const Session& s, void* req, int* bytes, const char* what) {
  int done = 0;
  s.check(s.api->test(req, &done, bytes), what, Code::kRemoteError);
  return done != 0;
}

std::unique_ptr<NetMr> registerMr(const SessionPtr& s, void* comm, void* data, size_t bytes,
                                  NetMemType type) {
  void* mh = nullptr;
  s->check(s->api->regMr(comm, data, bytes,
                         type == NetMemType::kCuda ? netabi::kPtrCuda : netabi::kPtrHost, &mh),
           "regMr");
  return std::make_unique<PluginMr>(s, comm, mh, type);
}

std::unique_ptr<NetMr> registerDmaBuf(const SessionPtr& s, void* comm, void* data, size_t bytes, int fd,
                                      uint64_t offset) {
  void* mh = nullptr;
  s->check(s->api->regMrDmaBuf(comm, data, bytes, netabi::kPtrCuda, offset, fd, &mh), "regMrDmaBuf");
  return std::make_unique<PluginMr>(s, comm, mh, NetMemType::kCuda);
}

class PluginSendComm : public NetSendComm {
 public:
  PluginSendComm(SessionPtr s, void* comm, const NetHandle& h)
      : s_(std::move(s)), comm_(comm), auth_(s_->authTag(h)) {
    try {
      authMr_ = registerMr(s_, comm_, auth_.data(), auth_.size(), NetMemType::kHost);
    } catch (const Error&) {
      s_->api->closeSend(comm_);  // the destructor will not run
      throw;
    }
  }
  ~PluginSendComm() override {
    authMr_.reset();
    s_->api->closeSend(comm_);
  }
  // The authentication message, posted before anything else; false: call again.
  bool postAuth() {
    if (authPosted_) return true;
    void* r = nullptr;
    s_->check(s_->api->isend(comm_, auth_.data(), auth_.size(), 0, mhOf(authMr_.get()), &r),
              "isend");
    authReq_ = r;
    authPosted_ = r != nullptr;
    return authPosted_;
  }
  bool authSent() {
    progressAuth();
    return authPosted_ && !authReq_;
  }
  std::unique_ptr<NetMr> regMr(void* data, size_t bytes, NetMemType type) override {
    return registerMr(s_, comm_, data, bytes, type);
  }
  std::unique_ptr<NetMr> regMrDmaBuf(void* data, size_t bytes, int fd, uint64_t offset) override {
    return registerDmaBuf(s_, comm_, data, bytes, fd, offset);
  }
  NetRequest* isend(const void* data, size_t bytes, int tag, NetMr* mr) override {
    progressAuth();
    // The authentication message holds a request until it completes.
    if (pool_.used + (authReq_ ? 1 : 0) >= netabi::kMaxRequests) return nullptr;
    void* r = nullptr;
    s_->check(s_->api->isend(comm_, const_cast<void*>(data), bytes, tag, mhOf(mr), &r), "isend");
    return r ? pool_.take(r, bytes) : nullptr;
  }
  bool test(NetRequest* req, size_t* bytes) override {
    progressAuth();
    auto* q = static_cast<Req*>(req);
    int n = 0;
    if (!testOnce(*s_, q->req, &n, "test (send)")) return false;
    *bytes = static_cast<size_t>(n);
    pool_.give(q);
    return true;
  }

 private:
  void progressAuth() {
    int n = 0;
    if (authReq_ && testOnce(*s_, authReq_, &n, "test (authentication send)")) authReq_ = nullptr;
  }

  SessionPtr s_;
  void* comm_;
  Digest auth_;
  std::unique_ptr<NetMr> authMr_;
  void* authReq_ = nullptr;
  bool authPosted_ = false;
  ReqPool pool_;
};

class PluginRecvComm : public NetRecvComm {
 public:
  PluginRecvComm(SessionPtr s, void* comm) : s_(std::move(s)), comm_(comm) {}
  ~PluginRecvComm() override { s_->api->closeRecv(comm_); }
  std::unique_ptr<NetMr> regMr(void* data, size_t bytes, NetMemType type) override {
    return registerMr(s_, comm_, data, bytes, type);
  }
  std::unique_ptr<NetMr> regMrDmaBuf(void* data, size_t bytes, int fd, uint64_t offset) override {
    return registerDmaBuf(s_, comm_, data, bytes, fd, offset);
  }
  NetRequest* irecv(void* data, size_t capacity, int tag, NetMr* mr) override {
    if (pool_.used >= netabi::kMaxRequests) return nullptr;
    void* r = nullptr;
    s_->check(s_->api->irecv(comm_, data, capacity, tag, mhOf(mr), &r), "irecv");
    return r ? pool_.take(r, capacity) : nullptr;
  }
  NetRequest* iflush(void* data, size_t bytes, NetMr* mr) override {
    if (bytes == 0 || !mr || static_cast<PluginMr*>(mr)->type() != NetMemType::kCuda)
      return nullptr;  // host memory needs no flush
    if (bytes > INT_MAX || pool_.used >= netabi::kMaxRequests)
      LOOM_THROW(kInternalError, "rank %d: NET/Plugin %s: a flush of %zu bytes with %d requests "
                 "outstanding exceeds the plugin interface", s_->rank, s_->api->describe().c_str(),
                 bytes, pool_.used);
    void* r = nullptr;
    s_->check(s_->api->iflush(comm_, data, static_cast<int>(bytes), mhOf(mr), &r), "iflush");
    // No request: nothing to flush (NCCL's reading too: a NIC that writes in order, or a
    // plugin that flushes otherwise).
    return r ? pool_.take(r, bytes) : nullptr;
  }
  bool test(NetRequest* req, size_t* bytes) override {
    auto* q = static_cast<Req*>(req);
    int n = 0;
    if (!testOnce(*s_, q->req, &n, "test (receive)")) return false;
    pool_.give(q);
    if (n < 0 || static_cast<size_t>(n) > q->capacity)
      LOOM_THROW(kInternalError,
                 "rank %d: NET/Plugin %s reported a %d-byte receive into a %zu-byte buffer",
                 s_->rank, s_->api->describe().c_str(), n, q->capacity);
    *bytes = static_cast<size_t>(n);
    return true;
  }

 private:
  SessionPtr s_;
  void* comm_;
  ReqPool pool_;
};

// A connection accepted by the plugin, until its first message proves it is this job's.
class AcceptStage : public NetStage {
 public:
  AcceptStage(SessionPtr s, void* comm) : s_(std::move(s)), comm_(comm) {
    try {
      mr_ = registerMr(s_, comm_, buf_, sizeof(buf_), NetMemType::kHost);
    } catch (const Error&) {
      s_->api->closeRecv(comm_);  // the destructor will not run
      throw;
    }
  }
  ~AcceptStage() override {
    mr_.reset();
    if (comm_) s_->api->closeRecv(comm_);
  }
  // True once the tag arrived; `ok` says whether it checks.
  bool poll(const Digest& want, bool* ok) {
    if (!req_) {
      s_->check(s_->api->irecv(comm_, buf_, sizeof(buf_), 0, mhOf(mr_.get()), &req_), "irecv");
      if (!req_) return false;
    }
    int n = 0;
    if (!testOnce(*s_, req_, &n, "test (authentication receive)")) return false;
    Digest got;
    memcpy(got.data(), buf_, got.size());
    *ok = n == static_cast<int>(kAuthBytes) && digestEqual(got, want);
    return true;
  }
  void* release() {
    mr_.reset();
    void* c = comm_;
    comm_ = nullptr;
    return c;
  }

 private:
  SessionPtr s_;
  void* comm_;
  uint8_t buf_[kAuthBytes] = {};
  std::unique_ptr<NetMr> mr_;
  void* req_ = nullptr;
};

class PluginListenComm : public NetListenComm {
 public:
  PluginListenComm(SessionPtr s, void* comm, const NetHandle& h)
      : s_(std::move(s)), comm_(comm), want_(s_->authTag(h)) {}
  ~PluginListenComm() override { s_->api->closeListen(comm_); }
  std::unique_ptr<NetRecvComm> accept(std::unique_ptr<NetStage>& stage) override {
    if (!stage) {
      void* c = nullptr;
      s_->check(s_->api->accept(comm_, &c), "accept");
      if (!c) return nullptr;
      stage = std::make_unique<AcceptStage>(s_, c);
    }
    auto* st = static_cast<AcceptStage*>(stage.get());
    bool ok = false;
    try {
      if (!st->poll(want_, &ok)) return nullptr;
    } catch (const Error& e) {
      LOOM_INFO(kLogNet, "rank %d: NET/Plugin: dropped a connection before it authenticated: %s",
                s_->rank, e.what());
      stage.reset();
      return nullptr;
    }
    if (!ok) {
      LOOM_WARN("rank %d: NET/Plugin %s: refused a connection without this job's secret",
                s_->rank, s_->api->describe().c_str());
      stage.reset();  // closes it; the next connection may be the right one
      return nullptr;
    }
    void* c = st->release();
    stage.reset();
    return std::make_unique<PluginRecvComm>(s_, c);
  }

 private:
  SessionPtr s_;
  void* comm_;
  Digest want_;
};

class ConnectStage : public NetStage {
 public:
  explicit ConnectStage(const NetHandle& h) : handle(h) {}
  NetHandle handle;  // plugins keep their connect progress in it (NCCL passes one buffer)
  std::unique_ptr<PluginSendComm> comm;
};

class PluginBackend : public NetBackend {
 public:
  explicit PluginBackend(SessionPtr s) : s_(std::move(s)) {}
  int devices() override {
    int n = 0;
    s_->check(s_->api->devices(&n), "devices");
    return n;
  }
  NetProperties properties(int dev) override {
    NetProperties p;
    s_->check(s_->api->properties(dev, &p), "getProperties");
    return p;
  }
  std::unique_ptr<NetListenComm> listen(int dev, NetHandle* handle) override {
    memset(handle->bytes, 0, sizeof(handle->bytes));
    void* c = nullptr;
    s_->check(s_->api->listen(s_->ctx, dev, handle->bytes, &c), "listen");
    if (!c)
      LOOM_THROW(kInternalError, "rank %d: NET/Plugin %s: listen succeeded without a comm",
                 s_->rank, s_->api->describe().c_str());
    return std::make_unique<PluginListenComm>(s_, c, *handle);
  }
  std::unique_ptr<NetSendComm> connect(int dev, const NetHandle& handle,
                                       std::unique_ptr<NetStage>& stage) override {
    if (!stage) stage = std::make_unique<ConnectStage>(handle);
    auto* st = static_cast<ConnectStage*>(stage.get());
    if (!st->comm) {
      void* c = nullptr;
      s_->check(s_->api->connect(s_->ctx, dev, st->handle.bytes, &c), "connect");
      if (!c) return nullptr;
      st->comm = std::make_unique<PluginSendComm>(s_, c, handle);
    }
    // The connection is handed over once its authentication message is out: Loom makes
    // every connection before it accepts any, so this must not wait for the peer.
    if (!st->comm->postAuth() || !st->comm->authSent()) return nullptr;
    std::unique_ptr<NetSendComm> out = std::move(st->comm);
    stage.reset();
    return out;
  }

 private:
  SessionPtr s_;
};

}  // namespace

std::unique_ptr<NetBackend> makePluginNetBackend(std::shared_ptr<PluginApi> api,
                                                 const NetContext& ctx) {
  void* pctx = nullptr;
  R r = api->init(&pctx, ctx.job.jobTag);
  if (r != kOk)
    throwError(codeFor(r), "rank %d: NET/Plugin %s: init returned %s", ctx.rank,
               api->describe().c_str(), netResultName(r));
  auto s = std::make_shared<Session>();
  s->api = std::move(api);
  s->ctx = pctx;
  s->rank = ctx.rank;
  s->job = ctx.job;
  auto backend = std::make_unique<PluginBackend>(s);
  if (backend->devices() < 1)
    LOOM_THROW(kSystemError, "rank %d: NET/Plugin %s: the plugin reports no network device",
               ctx.rank, s->api->describe().c_str());
  // Loom's network FIFOs are host memory, and a slot is at most a few MiB; NCCL refuses a
  // message limit of 0 or over 1 TiB as well.
  NetProperties p = backend->properties(0);
  if (!(p.ptrSupport & kNetPtrHost))
    LOOM_THROW(kSystemError, "rank %d: NET/Plugin %s: device 0 (%s) cannot send host memory "
               "(ptrSupport %d)", ctx.rank, s->api->describe().c_str(), p.name.c_str(), p.ptrSupport);
  if (p.maxMessageBytes < (size_t(4) << 20) || p.maxMessageBytes > (size_t(1) << 40))
    LOOM_THROW(kSystemError, "rank %d: NET/Plugin %s: device 0 (%s) has a message limit of %zu "
               "bytes (Loom needs 4 MiB to 1 TiB)", ctx.rank, s->api->describe().c_str(),
               p.name.c_str(), p.maxMessageBytes);
  return backend;
}

}  // namespace loom
