#include "engine/device_net.h"

#include <unistd.h>

#include <chrono>
#include <cstring>

#include "base/config.h"
#include "base/log.h"
#include "bootstrap/bootstrap.h"
#include "topo/load.h"
#include "transports/net/net_transport.h"

namespace loom {
namespace {

StringKnob kGdrLevel("LOOM_NET_GDR_LEVEL", "NCCL_NET_GDR_LEVEL", "PXB",
                     "The farthest GPU-NIC path over which the device executor lets the NIC reach GPU memory "
                     "(GPUDirect RDMA): LOC, PIX, PXB, PHB or SYS (or NCCL's numbers 0-4); a NIC the topology "
                     "does not place counts as SYS. Needs a network device that takes CUDA pointers");
IntKnob kGdrRead("LOOM_NET_GDR_READ", "NCCL_NET_GDR_READ", 0,
                 "1: with GPUDirect RDMA, the device executor's sends leave from GPU memory too (the NIC "
                 "reads it); 0: they leave from pinned host memory the kernel writes");

constexpr uint32_t kTagNetHandle = 0x50000000u;  // + connection (+ offset): a receiver's handle
constexpr size_t kStepAt = (sizeof(FifoCtrl) + 127) / 128 * 128;  // ctrl | step | slots
constexpr size_t kSlotsAt = kStepAt + 128;
constexpr double kReceiveGraceSec = 2.0;  // failure(): a receiving end's

int parseGdrLevel(const std::string& v) {
  if (v.size() == 1 && v[0] >= '0' && v[0] <= '4') {  // NCCL's legacy numbers
    static const topo::PathType kByNumber[] = {topo::PathType::kLoc, topo::PathType::kPix, topo::PathType::kPxb,
                                               topo::PathType::kPhb, topo::PathType::kSys};
    return static_cast<int>(kByNumber[v[0] - '0']);
  }
  return static_cast<int>(topo::parsePathType(v));  // throws kInvalidArgument naming it
}

}  // namespace

struct DeviceNet::End {
  void* host = nullptr;              // pinned, mapped: ctrl | step | slots (when in host memory)
  cuda::CuDevicePtr hostDev = 0;     // the same, as the GPU addresses it
  cuda::CuDevicePtr gpuSlots = 0;    // GPUDirect RDMA: the slots in GPU memory
  int dmabuf = -1;                   // ... and their DMA-BUF, where registered so
  NetFifoMemory memory;
  loomCudaFifo fifo{};
  bool send = false;
  uint64_t wanted = 0;  // receiving: steps the launches queued outside captures take
  std::unique_ptr<NetConnection> conn;
  std::optional<std::chrono::steady_clock::time_point> failingSince;
};

struct DeviceNet::Listening {
  End* end;
  int peer;
  std::unique_ptr<NetListenComm> listen;
};

DeviceNet::DeviceNet(Bootstrap& bs, const cuda::Driver& drv, const std::vector<PeerInfo>& peers, int device,
                     FifoShape shape)
    : bs_(bs), drv_(drv), peers_(peers), rank_(bs.rank()), device_(device), shape_(shape) {
  for (const PeerInfo& p : peers_) {
    if (p.hostHash != peers_[rank_].hostHash) continue;
    if (p.rank < rank_) ++localRank_;
    if (p.rank != rank_) ++localRanks_;
  }
  gdrLevel_ = parseGdrLevel(kGdrLevel.get());
  gdrRead_ = kGdrRead.get() != 0;
  const NetContext ctx{bs.job(), rank_, bs.nranks(), bs.iface()};
  StartedNet n = startNetBackend(ctx);  // NCCL_NET's, a plugin, or verbs
  if (!n.backend) n = {findNetBackend("Socket").make(ctx), "Socket"};
  name_ = "net/" + n.name;
  backend_ = std::shared_ptr<NetBackend>(std::move(n.backend));
  // The topology once: this GPU's path to each of the backend's devices (by name; SYS where
  // it places either not), and its rail.
  const topo::System sys = topo::loadLocalSystem();
  int gpu = -1;
  for (int g = 0; g < sys.gpuCount(); ++g)
    if (sys.gpu(g).dev == device_) gpu = g;
  distance_.assign(static_cast<size_t>(backend_->devices()), static_cast<int>(topo::PathType::kSys));
  for (int d = 0; d < backend_->devices() && gpu >= 0; ++d) {
    const std::string name = backend_->properties(d).name;
    for (int i = 0; i < sys.netCount(); ++i) {
      if (sys.net(i).netName != name) continue;
      distance_[static_cast<size_t>(d)] = static_cast<int>(sys.gpuToNet(gpu, i).type);
      if (i == sys.railOf(gpu)) gpuRail_ = d;
    }
  }
}

int DeviceNet::rail(int conn) const {
  const int devices = backend_->devices();
  if (gpuRail_ < 0 || devices < 2) return netRail(localRank_, localRanks_, conn, devices);
  return netGpuRail(gpuRail_, localRanks_, conn, devices);
}

DeviceNet::~DeviceNet() {
  proxy_.stop();
  listening_.clear();
  for (auto& e : ends_) {
    e->conn.reset();  // deregisters, then closes: what the peer notices
    if (e->dmabuf >= 0) ::close(e->dmabuf);
    if (e->gpuSlots) drv_.api.memFree(e->gpuSlots);
    if (e->host) drv_.streams.memFreeHost(e->host);
  }
}

void DeviceNet::check(cuda::CuResult r, const char* what) const {
  if (r != cuda::kCudaSuccess)
    LOOM_THROW(kUnhandledCudaError, "rank %d: the device executor's network FIFOs on device %d: %s failed: %s", rank_,
               device_, what, drv_.errorText(r).c_str());
}

// Whether the NIC `dev` reaches this GPU's memory for this end (GPUDirect RDMA).
bool DeviceNet::gdr(int dev, bool send) const {
  if (send && !gdrRead_) return false;
  if (!(backend_->properties(dev).ptrSupport & (kNetPtrCuda | kNetPtrDmaBuf))) return false;
  return distance_[static_cast<size_t>(dev)] <= gdrLevel_;
}

DeviceNet::End& DeviceNet::make(int peer, int conn, bool send, int dev) {
  // Made whole before the watchdog may see it (failure() reads every end).
  auto e = std::make_unique<End>();
  End& r = *e;
  struct Undo {  // frees what a failure below leaves
    const cuda::Driver& drv;
    End* e;
    ~Undo() {
      if (!e) return;
      if (e->dmabuf >= 0) ::close(e->dmabuf);
      if (e->gpuSlots) drv.api.memFree(e->gpuSlots);
      if (e->host) drv.streams.memFreeHost(e->host);
    }
  } undo{drv_, &r};
  r.send = send;
  const size_t slots = shape_.slotBytes * static_cast<size_t>(shape_.depth);
  const bool onGpu = gdr(dev, send);
  check(drv_.streams.memHostAlloc(&r.host, kSlotsAt + (onGpu ? 0 : slots),
                                  cuda::kMemHostAllocPortable | cuda::kMemHostAllocDeviceMap),
        "cuMemHostAlloc");
  memset(r.host, 0, kSlotsAt);
  check(drv_.streams.memHostGetDevicePointer(&r.hostDev, r.host, 0), "cuMemHostGetDevicePointer");
  r.memory.ctrl = static_cast<FifoCtrl*>(r.host);
  r.memory.slots = static_cast<char*>(r.host) + kSlotsAt;
  cuda::CuDevicePtr kernelSlots = r.hostDev + kSlotsAt;
  if (onGpu) {
    // A DMA-BUF covers a page-aligned range: whole 2 MiB, which cuMemAlloc aligns so.
    const size_t bytes = (slots + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    check(drv_.api.memAlloc(&r.gpuSlots, bytes), "cuMemAlloc (network FIFO slots)");
    r.memory.slots = reinterpret_cast<char*>(r.gpuSlots);
    r.memory.type = NetMemType::kCuda;
    kernelSlots = r.gpuSlots;
    int fd = -1;
    if ((backend_->properties(dev).ptrSupport & kNetPtrDmaBuf) && drv_.kernel.memGetHandleForAddressRange &&
        r.gpuSlots % 4096 == 0 &&
        drv_.kernel.memGetHandleForAddressRange(&fd, r.gpuSlots, bytes, cuda::kMemRangeHandleTypeDmaBufFd, 0) ==
            cuda::kCudaSuccess &&
        fd >= 0) {
      r.dmabuf = fd;
      r.memory.dmabufFd = fd;
    }
  }
  r.fifo = {peer, conn, send ? 1 : 0, shape_.depth, reinterpret_cast<void*>(r.hostDev),
            reinterpret_cast<void*>(kernelSlots), shape_.slotBytes, reinterpret_cast<uint64_t*>(r.hostDev + kStepAt),
            nullptr};
  LOOM_INFO(kLogInit | kLogNet, "rank %d: device FIFO %s rank %d (#%d) through %s on %s, slots in %s%s", rank_,
            send ? "to" : "from", peer, conn, name_.c_str(), backend_->properties(dev).name.c_str(),
            onGpu ? "GPU memory (GPUDirect RDMA" : "pinned host memory",
            onGpu ? (r.dmabuf >= 0 ? ", DMA-BUF)" : ")") : "");
  undo.e = nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  ends_.push_back(std::move(e));
  return r;
}

// The receiver's blob: the backend's handle, then the rail (as the host engine's).
std::vector<loomCudaFifo> DeviceNet::listen(const std::vector<ConnKey>& recvs, int tagOffset) {
  listening_.clear();  // a failed connect's, never to be accepted
  std::vector<loomCudaFifo> out;
  for (auto [peer, conn] : recvs) {
    const int32_t rail = this->rail(conn);
    End& e = make(peer, conn, false, rail);
    uint8_t blob[kNetHandleBytes + sizeof(rail)];
    NetHandle h;
    auto l = backend_->listen(rail, &h);
    memcpy(blob, h.bytes, kNetHandleBytes);
    memcpy(blob + kNetHandleBytes, &rail, sizeof(rail));
    bs_.send(peer, kTagNetHandle + static_cast<uint32_t>(conn + tagOffset), blob, sizeof(blob));
    listening_.push_back({&e, peer, std::move(l)});
    out.push_back(e.fifo);
  }
  return out;
}

std::vector<loomCudaFifo> DeviceNet::connectSends(const std::vector<ConnKey>& sends, int tagOffset) {
  std::vector<loomCudaFifo> out;
  for (auto [peer, conn] : sends) {
    uint8_t blob[kNetHandleBytes + sizeof(int32_t)];
    bs_.recv(peer, kTagNetHandle + static_cast<uint32_t>(conn + tagOffset), blob, sizeof(blob));
    NetHandle h;
    int32_t rail;
    memcpy(h.bytes, blob, kNetHandleBytes);
    memcpy(&rail, blob + kNetHandleBytes, sizeof(rail));
    if (rail < 0) LOOM_THROW(kRemoteError, "rank %d: rank %d sent rail %d", rank_, peer, rail);
    const int dev = rail % backend_->devices();
    End& e = make(peer, conn, true, dev);
    std::unique_ptr<NetStage> stage;
    const std::string where = peers_[peer].hostname;
    std::unique_ptr<NetConnection> c;
    if (auto comm = backend_->connect(dev, h, stage))
      c = std::make_unique<NetConnection>(peer, peers_[peer], shape_, name_, std::move(comm), nullptr, where,
                                          &e.memory);
    else  // the proxy thread finishes it
      c = std::make_unique<NetConnection>(peer, peers_[peer], shape_, name_, backend_, dev, h, std::move(stage),
                                          netConnectTimeoutSec(), where, &e.memory);
    proxy_.add(c.get());
    std::lock_guard<std::mutex> lock(mu_);
    e.conn = std::move(c);
    out.push_back(e.fifo);
  }
  return out;
}

void DeviceNet::accept() {
  std::vector<Listening> pending;
  pending.swap(listening_);
  for (Listening& l : pending) {
    auto c = std::make_unique<NetConnection>(l.peer, peers_[l.peer], shape_, name_, nullptr,
                                             netAccept(bs_, l.peer, "network accept (device executor)", *l.listen),
                                             peers_[l.peer].hostname, &l.end->memory);
    proxy_.add(c.get());
    std::lock_guard<std::mutex> lock(mu_);
    l.end->conn = std::move(c);
  }
  // Every sending end connected (the proxy finished those the backend left pending): a
  // connection that fails to is an error of the init, not of a kernel later.
  std::vector<NetConnection*> sends;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& e : ends_)
      if (e->send && e->conn) sends.push_back(e->conn.get());
  }
  for (NetConnection* c : sends) c->awaitConnected();
}

void DeviceNet::expect(int peer, int conn, uint64_t steps) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& e : ends_)
    if (!e->send && e->fifo.peer == peer && e->fifo.conn == conn) e->wanted += steps;
}

void DeviceNet::checkCounts() const {
  if (captured_.load(std::memory_order_acquire)) return;
  for (const auto& e : ends_) {
    const uint64_t took = HostAtomics::load(e->memory.ctrl->head);
    if (!e->send && took != e->wanted)
      LOOM_WARN("rank %d: the device executor counted %llu steps from rank %d (#%d) and its kernels took %llu",
                rank_, static_cast<unsigned long long>(e->wanted), e->fifo.peer, e->fifo.conn,
                static_cast<unsigned long long>(took));
  }
}

std::optional<Error> DeviceNet::failure(bool inFlight) {
  const auto now = std::chrono::steady_clock::now();
  const bool counted = !captured_.load(std::memory_order_acquire);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& e : ends_) {
    std::optional<Error> err = e->conn ? e->conn->failure() : std::nullopt;
    if (!err) continue;
    if (e->send) return err;
    const uint64_t tail = HostAtomics::load(e->memory.ctrl->tail);
    if (counted) {
      if (e->wanted > tail) return err;
      continue;
    }
    if (!inFlight || HostAtomics::load(e->memory.ctrl->head) < tail) {
      e->failingSince.reset();
      continue;
    }
    if (!e->failingSince) e->failingSince = now;
    if (std::chrono::duration<double>(now - *e->failingSince).count() >= kReceiveGraceSec) return err;
  }
  return std::nullopt;
}

}  // namespace loom
