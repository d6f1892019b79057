#include "engine/device_fifos.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "bootstrap/bootstrap.h"
#include "engine/device_net.h"
#include "kernels/fifo_sync.h"

namespace loom {
namespace {

// Bootstrap tags (below Bootstrap::kUserTagLimit, apart from the host transports' and the
// split's): a receiver's end (control block and slots), a sender's end (its head).
constexpr uint32_t kTagRecvEnd = 0x40000000u;
constexpr uint32_t kTagSendEnd = 0x48000000u;
// LL connections are others than Simple's (their slots hold flagged lines, which a Simple
// payload left in a slot could imitate): keyed and tagged apart, by this offset.
constexpr int kLLConns = 256;  // plan connection indices are below (uint8)
constexpr size_t kZeroBytes = 64 << 10;  // pinned zeros; larger spans are zeroed in turns
constexpr uint32_t kEndMagic = 0x64656e64;  // "dend"

// A receiver's allocation: control block | its step counter | slots.
constexpr size_t kRecvStepAt = (sizeof(FifoCtrl) + 127) / 128 * 128;
constexpr size_t kRecvSlotsAt = kRecvStepAt + 256;
// A sender's allocation: head | its step counter.
constexpr size_t kSendStepAt = 128;
constexpr size_t kSendBytes = 256;

void* at(cuda::CuDevicePtr p, size_t off) { return reinterpret_cast<void*>(p + off); }

}  // namespace

// How a peer reaches an end: a plain pointer in this process, else an IPC handle.
struct DeviceFifos::Msg {
  uint32_t magic = kEndMagic;
  uint32_t ipc = 0;
  uint64_t ptr = 0;     // the plain pointer (ipc == 0)
  uint64_t offset = 0;  // from the allocation's start (ipc == 1)
  uint64_t slotBytes = 0;
  uint32_t depth = 0;
  uint32_t pad = 0;
  cuda::CuIpcHandle handle{};
};

DeviceFifos::DeviceFifos(Bootstrap& bs, const cuda::Driver& drv, int device, FifoShape shape,
                         std::vector<bool> sameProcess, cuda::CuStream setup, DeviceNet* net,
                         std::vector<bool> remote)
    : bs_(bs), drv_(drv), device_(device), shape_(shape), sameProcess_(std::move(sameProcess)),
      setup_(setup), net_(net), remote_(std::move(remote)) {
  remote_.resize(sameProcess_.size(), false);
  check(drv_.streams.memHostAlloc(&zeros_, kZeroBytes, cuda::kMemHostAllocPortable), "cuMemHostAlloc");
  memset(zeros_, 0, kZeroBytes);
}

DeviceFifos::~DeviceFifos() {
  for (auto& [key, e] : ends_) {
    if (e.mapped) drv_.ipc.ipcCloseMemHandle(e.mapped);
    if (e.own) drv_.api.memFree(e.own);
  }
  if (zeros_) drv_.streams.memFreeHost(zeros_);
}

void DeviceFifos::check(cuda::CuResult r, const char* what) const {
  if (r != cuda::kCudaSuccess)
    LOOM_THROW(kUnhandledCudaError, "rank %d: the device executor's FIFOs on device %d: %s failed: %s",
               bs_.rank(), device_, what, drv_.errorText(r).c_str());
}

// Device memory whose first zeroBytes are zero once this returns (a peer may write there as
// soon as it learns the address, so the zeroing is waited for on the executor's stream).
cuda::CuDevicePtr DeviceFifos::alloc(size_t bytes, size_t zeroBytes) {
  cuda::CuDevicePtr p = 0;
  check(drv_.api.memAlloc(&p, bytes), "cuMemAlloc");
  cuda::CuResult r = cuda::kCudaSuccess;
  for (size_t off = 0; off < zeroBytes && r == cuda::kCudaSuccess; off += kZeroBytes)
    r = drv_.streams.memcpyAsync(p + off, reinterpret_cast<cuda::CuDevicePtr>(zeros_),
                                 std::min(kZeroBytes, zeroBytes - off), setup_);
  if (r == cuda::kCudaSuccess) r = drv_.kernel.streamSynchronize(setup_);
  if (r != cuda::kCudaSuccess) {
    drv_.api.memFree(p);
    check(r, "zeroing a FIFO's control block");
  }
  return p;
}

DeviceFifos::Msg DeviceFifos::describe(int peer, cuda::CuDevicePtr p) const {
  Msg m;
  m.slotBytes = shape_.slotBytes;
  m.depth = static_cast<uint32_t>(shape_.depth);
  if (sameProcess_[static_cast<size_t>(peer)]) {
    m.ptr = p;
    return m;
  }
  m.ipc = 1;
  cuda::CuDevicePtr base = 0;
  size_t size = 0;
  check(drv_.ipc.memGetAddressRange(&base, &size, p), "cuMemGetAddressRange");
  check(drv_.ipc.ipcGetMemHandle(&m.handle, base), "cuIpcGetMemHandle");
  m.offset = p - base;
  return m;
}

// The peer's memory a message names, mapped here (the mapping is kept in e).
cuda::CuDevicePtr DeviceFifos::open(int peer, const Msg& m, End* e) {
  if (m.magic != kEndMagic || m.slotBytes != shape_.slotBytes || m.depth != static_cast<uint32_t>(shape_.depth) ||
      m.ipc != (sameProcess_[static_cast<size_t>(peer)] ? 0u : 1u))
    LOOM_THROW(kInvalidUsage,
               "rank %d: rank %d described a device FIFO this rank cannot use (slots of %llu bytes x %u, "
               "ours %zu x %d): do all ranks set LOOM_SLOT_BYTES and LOOM_FIFO_DEPTH alike?",
               bs_.rank(), peer, static_cast<unsigned long long>(m.slotBytes), m.depth, shape_.slotBytes,
               shape_.depth);
  if (!m.ipc) return m.ptr;
  cuda::CuDevicePtr base = 0;
  check(drv_.ipc.ipcOpenMemHandle(&base, m.handle, cuda::kIpcMemLazyEnablePeerAccess), "cuIpcOpenMemHandle");
  e->mapped = base;
  return base + m.offset;
}

void DeviceFifos::connect(std::vector<ConnKey> sends, std::vector<ConnKey> recvs, bool ll) {
  const int off = ll ? kLLConns : 0;  // ends_ and the tags take the offset; the table does not
  auto missing = [&](std::vector<ConnKey>& keys, int send) {
    std::sort(keys.begin(), keys.end());  // both ends of a pair walk them in one order
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::erase_if(keys, [&](ConnKey k) { return ends_.count({k.first, k.second + off, send}) > 0; });
  };
  missing(sends, 1);
  missing(recvs, 0);
  // Peers on other hosts: through the network (device_net.h), in its phases below.
  std::vector<ConnKey> netSends, netRecvs;
  auto byNet = [&](std::vector<ConnKey>& keys, std::vector<ConnKey>& net) {
    for (ConnKey k : keys)
      if (remote_[static_cast<size_t>(k.first)]) net.push_back(k);
    std::erase_if(keys, [&](ConnKey k) { return remote_[static_cast<size_t>(k.first)]; });
  };
  byNet(sends, netSends);
  byNet(recvs, netRecvs);
  if ((!netSends.empty() || !netRecvs.empty()) && (!net_ || ll))
    LOOM_THROW(kInternalError, "rank %d: a device FIFO to another host %s", bs_.rank(),
               net_ ? "for the LL protocol (the executor runs Simple across hosts)" : "and no network");
  const size_t slots = shape_.slotBytes * static_cast<size_t>(shape_.depth);
  // 1. Every end this rank owns is made and described to its peer (sends never block).
  std::map<std::tuple<int, int, int>, End> made;
  try {
    for (ConnKey k : recvs) {
      End& e = made[{k.first, k.second + off, 0}];
      // LL polls the slots' lines: they start zeroed (kernels/ll.h); Simple's need not.
      e.own = alloc(kRecvSlotsAt + slots, ll ? kRecvSlotsAt + slots : kRecvSlotsAt);
      e.fifo = {k.first, k.second, 0, shape_.depth, at(e.own, 0), at(e.own, kRecvSlotsAt), shape_.slotBytes,
                static_cast<uint64_t*>(at(e.own, kRecvStepAt)), nullptr};
      Msg m = describe(k.first, e.own);
      bs_.send(k.first, kTagRecvEnd + static_cast<uint32_t>(k.second + off), &m, sizeof(m));
    }
    for (ConnKey k : sends) {
      End& e = made[{k.first, k.second + off, 1}];
      e.own = alloc(kSendBytes, kSendBytes);
      e.fifo = {k.first, k.second, 1, shape_.depth, nullptr, nullptr, shape_.slotBytes,
                static_cast<uint64_t*>(at(e.own, kSendStepAt)), static_cast<uint64_t*>(at(e.own, 0))};
      Msg m = describe(k.first, e.own);
      bs_.send(k.first, kTagSendEnd + static_cast<uint32_t>(k.second + off), &m, sizeof(m));
    }
    // The network's first phase (listen; sends never block), before any wait here.
    std::vector<loomCudaFifo> netEnds;
    if (!netRecvs.empty()) netEnds = net_->listen(netRecvs, off);
    // 2. The peers' halves: a sender maps the receiver's control block and slots, a
    // receiver the sender's head.
    for (ConnKey k : sends) {
      Msg m;
      bs_.recv(k.first, kTagRecvEnd + static_cast<uint32_t>(k.second + off), &m, sizeof(m));
      End& e = made[{k.first, k.second + off, 1}];
      const cuda::CuDevicePtr p = open(k.first, m, &e);
      e.fifo.ctrl = at(p, 0);
      e.fifo.slots = at(p, kRecvSlotsAt);
    }
    for (ConnKey k : recvs) {
      Msg m;
      bs_.recv(k.first, kTagSendEnd + static_cast<uint32_t>(k.second + off), &m, sizeof(m));
      End& e = made[{k.first, k.second + off, 0}];
      e.fifo.headAt = static_cast<uint64_t*>(at(open(k.first, m, &e), 0));
    }
    // The network's other phases: connect every send, then accept every receive.
    if (!netSends.empty()) {
      std::vector<loomCudaFifo> s = net_->connectSends(netSends, off);
      netEnds.insert(netEnds.end(), s.begin(), s.end());
    }
    if (!netRecvs.empty() || !netSends.empty()) net_->accept();
    for (const loomCudaFifo& f : netEnds) made[{f.peer, f.conn + off, f.send}].fifo = f;  // own, mapped: 0
  } catch (...) {
    for (auto& [key, e] : made) {
      if (e.mapped) drv_.ipc.ipcCloseMemHandle(e.mapped);
      if (e.own) drv_.api.memFree(e.own);
    }
    throw;
  }
  for (auto& [key, e] : made) {
    if (remote_[static_cast<size_t>(std::get<0>(key))]) {  // DeviceNet logged it
      ends_.emplace(key, e);
      continue;
    }
    LOOM_INFO(kLogInit, "rank %d: device FIFO %s rank %d (#%d%s) on device %d%s", bs_.rank(),
              std::get<2>(key) ? "to" : "from", std::get<0>(key), std::get<1>(key) - off, ll ? ", LL" : "", device_,
              sameProcess_[static_cast<size_t>(std::get<0>(key))] ? "" : " (mapped by CUDA IPC)");
    ends_.emplace(key, e);
  }
}

loomCudaFifo DeviceFifos::end(int peer, int conn, bool send, bool ll) const {
  auto it = ends_.find({peer, conn + (ll ? kLLConns : 0), send ? 1 : 0});
  if (it == ends_.end())
    LOOM_THROW(kInternalError, "rank %d: no device FIFO %s rank %d (#%d)", bs_.rank(), send ? "to" : "from",
               peer, conn);
  return it->second.fifo;
}

}  // namespace loom
