#include "transports/net/ib_backend.h"

#include "base/error.h"
#include "transports/net/ib_verbs.h"

#ifdef LOOM_VERBS_HEADERS
#include <climits>
#include <cstring>
#include <mutex>

#include "base/log.h"
#include "base/time.h"
#include "bootstrap/wire.h"
#include "transports/net/ib_devices.h"
#include "transports/net/listener.h"
#include "transports/socket/hello_stream.h"
#include "transports/socket/stream_acceptor.h"

namespace loom {
namespace {

using namespace ibnet;  // NOLINT: this file is the verbs backend

constexpr double kSetupSec = 60;

struct IbHandle {
  uint32_t magic;
  int32_t rank;  // the listening rank: hellos are addressed to it
  uint64_t connId;
  HandleAddr addr;  // the listener's control acceptor
};
static_assert(sizeof(IbHandle) <= kNetHandleBytes);

// Reads into `into` (of `size` bytes, `*got` read so far) what the stream holds; true once
// it is full. Throws kRemoteError when the peer closes it first.
bool readSome(Socket& s, void* into, size_t size, size_t* got, const std::string& who) {
  while (*got < size) {
    bool eof = false;
    size_t n = s.tryRecv(static_cast<char*>(into) + *got, size - *got, who.c_str(), &eof);
    if (eof) LOOM_THROW(kRemoteError, "%s: the peer closed the connection during set-up", who.c_str());
    if (n == 0) return false;
    *got += n;
  }
  return true;
}

void sendSmall(Socket& s, const void* p, size_t n, const std::string& who) {
  s.setNonBlocking(false);
  s.sendAll(p, n, Deadline::in(10), who.c_str());
  s.setNonBlocking(true);
}

struct IbAcceptStage : NetStage {
  Socket sock;
  std::string who;
  IbConnInfo peer{};
  size_t got = 0;
  std::unique_ptr<IbQps> qps;
  char ready = 0;
  size_t gotReady = 0;
  Deadline deadline = Deadline::in(kSetupSec);
};

class IbListenComm : public NetListenComm {
 public:
  IbListenComm(std::shared_ptr<IbDevice> dev, const IbOptions& o, StreamAcceptor& acceptor,
               uint64_t connId, std::string who)
      : dev_(std::move(dev)), o_(o), acceptor_(acceptor), connId_(connId), who_(std::move(who)) {}

  // The sender's QPs and FIFO arrive; ours go to RTS and are described back; the sender's
  // "ready" (its QPs are in RTR) lets clear-to-send writes go.
  std::unique_ptr<NetRecvComm> accept(std::unique_ptr<NetStage>& stage) override {
    try {
      return acceptStep(stage);
    } catch (...) {
      stage.reset();  // this connection is lost; a call after the failure takes the next
      throw;
    }
  }
  bool mayStillArrive() const override { return acceptor_.busy(); }

 private:
  std::unique_ptr<NetRecvComm> acceptStep(std::unique_ptr<NetStage>& stage) {
    if (!stage) {
      auto got = acceptor_.tryTake(-1, connId_, 1, 0);
      if (!got) return nullptr;
      auto st = std::make_unique<IbAcceptStage>();
      st->sock = std::move((*got)[0]);
      st->sock.setNonBlocking(true);
      st->who = strprintf("%s from %s", who_.c_str(), st->sock.peer().str().c_str());
      stage = std::move(st);
    }
    auto& st = static_cast<IbAcceptStage&>(*stage);
    if (!st.qps) {
      if (!readSome(st.sock, &st.peer, sizeof(st.peer), &st.got, st.who)) return timedOut(st);
      if (st.peer.magic != kInfoMagic || st.peer.nqps < 1 || st.peer.nqps > kMaxQps)
        LOOM_THROW(kRemoteError, "%s: malformed queue-pair description", st.who.c_str());
      st.qps = std::make_unique<IbQps>(dev_, static_cast<int>(st.peer.nqps), st.who);
      st.qps->connect(st.peer, o_);
      IbConnInfo mine{};
      st.qps->describe(&mine);
      mine.flags = st.peer.flags & kInfoWholeMessages;  // the sender's way, echoed
      sendSmall(st.sock, &mine, sizeof(mine), st.who);
    }
    if (!readSome(st.sock, &st.ready, 1, &st.gotReady, st.who)) return timedOut(st);
    if (st.ready != 'R') LOOM_THROW(kRemoteError, "%s: malformed set-up", st.who.c_str());
    auto comm = makeIbRecvComm(std::move(st.qps), st.peer, std::move(st.sock), st.who);
    stage.reset();
    return comm;
  }

  static std::unique_ptr<NetRecvComm> timedOut(const IbAcceptStage& st) {
    if (st.deadline.expired())
      LOOM_THROW(kRemoteError, "%s: set-up not done after %.0f s", st.who.c_str(), kSetupSec);
    return nullptr;
  }

  std::shared_ptr<IbDevice> dev_;
  IbOptions o_;
  StreamAcceptor& acceptor_;
  uint64_t connId_;
  std::string who_;
};

struct IbConnectStage : NetStage {
  explicit IbConnectStage(HelloStream s) : stream(std::move(s)) {}
  HelloStream stream;
  bool helloSent = false;
  Socket sock;
  std::unique_ptr<IbQps> qps;
  std::unique_ptr<Cts[]> fifo;
  std::unique_ptr<IbMr> fifoMr;
  IbConnInfo peer{};
  size_t got = 0;
  Deadline deadline = Deadline::in(kSetupSec);
};

int laneGbps(int speed) {
  switch (speed) {
    case 1: return 2;     // SDR 2.5
    case 2: return 5;     // DDR
    case 4: case 8: return 10;  // QDR, FDR10
    case 16: return 14;   // FDR
    case 32: return 25;   // EDR
    case 64: return 50;   // HDR
    case 128: return 100; // NDR (XDR reports in active_speed_ex)
    default: return 10;
  }
}

int lanes(int width) {
  switch (width) {
    case 1: return 1;
    case 2: return 4;
    case 4: return 8;
    case 8: return 12;
    case 16: return 2;
    default: return 1;
  }
}

class IbBackend : public BootstrapIfaceBackend {
 public:
  IbBackend(const NetContext& ctx, const IbvApi& api, std::vector<IbPort> ports, IbOptions o)
      : BootstrapIfaceBackend(ctx, "IB", kKindIb, "verbs control listener"), api_(api),
        ports_(std::move(ports)), o_(o), devs_(ports_.size()) {}

  int devices() override { return static_cast<int>(ports_.size()); }

  NetProperties properties(int dev) override {
    std::shared_ptr<IbDevice> d = device(dev);
    NetProperties p;
    p.name = d->name;
    p.port = d->port;
    char real[PATH_MAX];
    std::string sys = "/sys/class/infiniband/" + d->name + "/device";
    if (realpath(sys.c_str(), real)) p.pciPath = real;
    p.ptrSupport = d->ptrSupport;
    p.speedMbps = laneGbps(d->attr.active_speed) * lanes(d->attr.active_width) * 1000;
    p.latencyUs = 0;
    p.maxRecvs = 1;
    p.maxMessageBytes = maxMessageBytes(*d, o_.splitData ? o_.qps : 1);  // whole messages: one QP's
    return p;
  }

  std::unique_ptr<NetListenComm> listen(int dev, NetHandle* handle) override {
    std::shared_ptr<IbDevice> d = device(dev);
    IbHandle h{};
    h.magic = kHandleMagic;
    h.rank = ctx_.rank;
    h.connId = nextConnId();
    h.addr.set(acceptor().addr(), ctx_.rank);
    memset(handle->bytes, 0, sizeof(handle->bytes));
    memcpy(handle->bytes, &h, sizeof(h));
    return std::make_unique<IbListenComm>(
        d, o_, acceptor(), h.connId,
        strprintf("rank %d IB net connection #%llu on %s", ctx_.rank,
                  static_cast<unsigned long long>(h.connId), d->label().c_str()));
  }

  // Hello, then our QPs (INIT) and FIFO out; the listener's QPs back; ours to RTR and
  // RTS; "ready" out.
  std::unique_ptr<NetSendComm> connect(int dev, const NetHandle& handle,
                                       std::unique_ptr<NetStage>& stage) override {
    try {
      return connectStep(dev, handle, stage);
    } catch (...) {
      stage.reset();  // a call after a failure starts afresh
      throw;
    }
  }

 private:
  std::unique_ptr<NetSendComm> connectStep(int dev, const NetHandle& handle,
                                           std::unique_ptr<NetStage>& stage) {
    std::shared_ptr<IbDevice> d = device(dev);
    IbHandle h;
    memcpy(&h, handle.bytes, sizeof(h));
    SocketAddr a;
    bool ok = h.magic == kHandleMagic && h.rank >= 0 && h.rank < ctx_.nranks && h.addr.get(&a);
    if (!ok) LOOM_THROW(kRemoteError, "rank %d: malformed IB net handle", ctx_.rank);
    std::string who = strprintf("rank %d IB net connection #%llu on %s to rank %d at %s",
                                ctx_.rank, static_cast<unsigned long long>(h.connId),
                                d->label().c_str(), h.rank, a.str().c_str());
    if (!stage)
      stage = std::make_unique<IbConnectStage>(HelloStream(
          a, makePeerHello(ctx_.job, kKindIb, ctx_.rank, h.rank, StreamAcceptor::streamId(h.connId, 0)),
          who));
    auto& st = static_cast<IbConnectStage&>(*stage);
    if (!st.helloSent) {
      if (!st.stream.advance()) return timedOut(st, who);
      st.helloSent = true;
      st.sock = st.stream.take();
      st.sock.setNonBlocking(true);
      st.qps = std::make_unique<IbQps>(d, o_.qps, who);
      st.fifo.reset(new Cts[kMaxRequests]());
      st.fifoMr = registerMr(d, st.fifo.get(), sizeof(Cts) * kMaxRequests, who, false);
      IbConnInfo mine{};
      st.qps->describe(&mine);
      mine.fifoAddr = reinterpret_cast<uintptr_t>(st.fifo.get());
      mine.fifoRkey = st.fifoMr->mr->rkey;
      mine.flags = o_.splitData ? 0 : kInfoWholeMessages;
      sendSmall(st.sock, &mine, sizeof(mine), who);
    }
    if (!readSome(st.sock, &st.peer, sizeof(st.peer), &st.got, who)) return timedOut(st, who);
    st.qps->connect(st.peer, o_);
    char ready = 'R';
    sendSmall(st.sock, &ready, 1, who);
    auto comm = makeIbSendComm(std::move(st.qps), std::move(st.fifoMr), std::move(st.fifo),
                               st.peer, std::move(st.sock), who);
    stage.reset();
    return comm;
  }

  static std::unique_ptr<NetSendComm> timedOut(const IbConnectStage& st, const std::string& who) {
    if (st.deadline.expired())
      LOOM_THROW(kRemoteError, "%s: set-up not done after %.0f s", who.c_str(), kSetupSec);
    return nullptr;
  }

  // Device `dev`, opened at first use (listen/connect run on the init thread, properties
  // anywhere).
  std::shared_ptr<IbDevice> device(int dev) {
    if (dev < 0 || dev >= devices())
      LOOM_THROW(kInvalidArgument, "IB net backend: device %d does not exist (it has %d)", dev,
                 devices());
    std::lock_guard<std::mutex> lk(mu_);
    if (!devs_[dev]) devs_[dev] = std::make_shared<IbDevice>(api_, ports_[dev], o_);
    return devs_[dev];
  }

  const IbvApi& api_;
  std::vector<IbPort> ports_;
  IbOptions o_;
  std::mutex mu_;
  std::vector<std::shared_ptr<IbDevice>> devs_;
};

// The active ports NCCL_IB_HCA selects; empty with `*why` set when there are none.
std::vector<IbPort> selectedPorts(std::string* why) {
  std::vector<IbPort> all = listIbPorts(why);
  if (all.empty()) return all;
  std::vector<IbPort> sel = selectIbPorts(all, ibHcaSpec());
  if (sel.empty()) *why = "no RDMA port is active";
  return sel;
}

}  // namespace

std::unique_ptr<NetBackend> makeIbNetBackend(const NetContext& ctx, const IbvApi* api) {
  if (ibDisabled())
    LOOM_THROW(kInvalidUsage, "rank %d: NCCL_NET=IB, but NCCL_IB_DISABLE=1 turns verbs off",
               ctx.rank);
  IbOptions o = IbOptions::fromKnobs();
  std::string why;
  if (!api) api = ibvApi(&why);
  if (!api) LOOM_THROW(kSystemError, "rank %d: NCCL_NET=IB: %s", ctx.rank, why.c_str());
  std::vector<IbPort> ports = selectedPorts(&why);
  if (ports.empty()) LOOM_THROW(kSystemError, "rank %d: NCCL_NET=IB: %s", ctx.rank, why.c_str());
  LOOM_INFO(kLogNet | kLogInit, "rank %d: NET/IB: %zu port(s), first %s", ctx.rank, ports.size(),
            describe(ports[0]).c_str());
  return std::make_unique<IbBackend>(ctx, *api, std::move(ports), o);
}

bool ibIsDefault(std::string* why) {
  if (ibDisabled()) {
    *why = "NCCL_IB_DISABLE=1";
    return false;
  }
  try {
    return !selectedPorts(why).empty();
  } catch (const Error& e) {
    *why = e.what();
    return false;
  }
}

}  // namespace loom

#else

namespace loom {
std::unique_ptr<NetBackend> makeIbNetBackend(const NetContext& ctx) {
  LOOM_THROW(kSystemError, "rank %d: NCCL_NET=IB: %s", ctx.rank, verbsUnavailable().c_str());
}
bool ibIsDefault(std::string* why) {
  *why = verbsUnavailable();
  return false;
}
}  // namespace loom

#endif
