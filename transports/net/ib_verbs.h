// What the verbs backend's files share (ib_backend.cc: devices, listen/connect/accept;
// ib_comm.cc: the data path): an opened RDMA port, registrations, a connection's queue
// pairs, what the two sides exchange at set-up, and the IB knobs.
#pragma once

#include "transports/net/ibv_api.h"

#ifdef LOOM_VERBS_HEADERS
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/socket.h"
#include "transports/net/ib_devices.h"
#include "transports/net/ib_events.h"
#include "transports/net/ib_gid.h"
#include "transports/net/net_backend.h"

namespace loom::ibnet {

constexpr int kMaxRequests = 32;  // per comm, as NCCL_NET_MAX_REQUESTS
constexpr int kMaxQps = 16;
constexpr uint16_t kKindIb = 6;  // PeerHello kind of a verbs control stream
constexpr uint32_t kHandleMagic = 0x4c494248;
constexpr uint32_t kInfoMagic = 0x4c494249;
// IbConnInfo::flags: each message goes whole on one QP, the QPs taken in turn
// (NCCL_IB_SPLIT_DATA_ON_QPS=0, NCCL's default); without it a message is split across all.
constexpr uint32_t kInfoWholeMessages = 1;
// The immediate of a write carries the message's size; this one says "larger than the
// receive" (nothing was written).
constexpr uint32_t kOversized = 0xffffffffu;

// NCCL_IB_* as read when a backend starts; throws kInvalidArgument on a value out of range.
struct IbOptions {
  int qps = 1;          // NCCL_IB_QPS_PER_CONNECTION
  int timeout = 20;     // NCCL_IB_TIMEOUT: 4.096 us * 2^timeout per retry
  int retryCnt = 7;     // NCCL_IB_RETRY_CNT
  int tc = 0;           // NCCL_IB_TC: traffic class (RoCE / GRH)
  int sl = 0;           // NCCL_IB_SL
  int gidIndex = -1;    // NCCL_IB_GID_INDEX; -1: chosen by `gid` (ib_gid.h), as NCCL
  int relaxedOrdering = 2;  // NCCL_IB_PCI_RELAXED_ORDERING: 0 off; 1, 2 where libibverbs can
  bool splitData = false;   // NCCL_IB_SPLIT_DATA_ON_QPS: split each message across the QPs
  int adaptiveRouting = -2;  // NCCL_IB_ADAPTIVE_ROUTING (adaptiveRoutingOn)
  size_t arThreshold = 8192;  // NCCL_IB_AR_THRESHOLD: larger messages take adaptive routing's way
  GidPolicy gid;  // NCCL_IB_ADDR_FAMILY, _ADDR_RANGE, _ROCE_VERSION_NUM (without NCCL_IB_GID_INDEX)
  bool asyncEvents = true;  // NCCL_IB_RETURN_ASYNC_EVENTS: fatal asynchronous events fail what they name
  int pkeyIndex = 0;  // NCCL_IB_PKEY: an index into the port's P_Key table
  static IbOptions fromKnobs();
};
bool ibDisabled();  // NCCL_IB_DISABLE=1

// One RDMA port opened by a backend: the device, a protection domain, the port's
// attributes and the GID its connections use. Throws kSystemError naming the failed call.
struct IbDevice {
  IbDevice(const IbvApi& api, const IbPort& port, const IbOptions& o);
  ~IbDevice();
  IbDevice(const IbDevice&) = delete;
  IbDevice& operator=(const IbDevice&) = delete;
  bool roce() const { return attr.link_layer == IBV_LINK_LAYER_ETHERNET; }
  std::string label() const { return name + ":" + std::to_string(port); }
  // NCCL_PTR_* this port takes: host memory; CUDA memory where the peer-memory module is
  // loaded (nvidia-peermem: ibv_reg_mr of a device pointer); DMA-BUF where libibverbs has
  // ibv_reg_dmabuf_mr and the kernel driver takes it.
  int ptrSupport = kNetPtrHost;

  const IbvApi& api;
  std::string name;
  int port;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_port_attr attr{};
  int gidIndex = 0;
  ibv_gid gid{};
  // Memory is registered with IBV_ACCESS_RELAXED_ORDERING (NCCL_IB_PCI_RELAXED_ORDERING,
  // where libibverbs has ibv_reg_mr_iova2; the driver ignores it where the device cannot).
  bool relaxedOrdering = false;
  // Adaptive routing may deliver a message's packets out of order, so a write's immediate
  // (its completion at the receiver) could overtake its data: with it on, messages over
  // NCCL_IB_AR_THRESHOLD are an RDMA WRITE, then a zero-byte RDMA WRITE WITH IMMEDIATE on
  // the same QP, as NCCL sends them (NCCL_IB_ADAPTIVE_ROUTING; default on for InfiniBand).
  bool adaptiveRouting = false;
  size_t arThreshold = 0;
  std::unique_ptr<IbEvents> events;  // the context's asynchronous events (ib_events.h)
  int pkeyIndex = 0;  // NCCL_IB_PKEY, checked against the port's table
};

// Memory registered with a device; keeps the device (its PD) alive. Zero bytes: no ibv_mr.
struct IbMr : NetMr {
  ~IbMr() override;
  bool covers(const void* p, size_t n) const {
    auto* c = static_cast<const char*>(p);
    return n == 0 || (mr && c >= base && c + n <= base + bytes);
  }
  std::shared_ptr<IbDevice> dev;
  ibv_mr* mr = nullptr;
  const char* base = nullptr;
  size_t bytes = 0;
  bool gpu = false;  // GPU memory: what the NIC writes there is flushed before it is read
};
// Host memory. `relaxed`: with PCIe relaxed ordering where the device has it on (data
// buffers, whose completions order them); false for memory a peer polls without a
// completion (clear-to-send FIFOs), as NCCL registers those.
std::unique_ptr<IbMr> registerMr(const std::shared_ptr<IbDevice>& dev, void* data, size_t bytes,
                                 const std::string& who, bool relaxed = true);
// GPU memory: by its DMA-BUF (`fd` >= 0, `offset` into it) or, fd -1, as a device pointer
// the peer-memory module resolves. Throws kSystemError naming the call and what to check.
std::unique_ptr<IbMr> registerGpuMr(const std::shared_ptr<IbDevice>& dev, void* data, size_t bytes, int fd,
                                    uint64_t offset, const std::string& who);

// What each side sends the other at set-up (the sender's FIFO for clear-to-send records
// that the receiver writes with RDMA WRITE).
struct IbConnInfo {
  uint32_t magic;
  uint32_t nqps;
  uint32_t qpn[kMaxQps];
  uint16_t lid;
  uint8_t roce;
  uint8_t mtu;
  uint32_t flags;  // kInfoWholeMessages: the sender's, echoed by the receiver
  uint8_t gid[16];
  uint64_t fifoAddr;
  uint32_t fifoRkey;
  uint32_t pad2;
};

// A clear-to-send record: where message `seq` goes. `seq` and `seqEnd` (both seq + 1)
// bracket it, so a record still being written is never taken.
struct alignas(64) Cts {  // one cache line: NICs write a line at once
  uint64_t seq;
  uint64_t addr;
  uint64_t capacity;
  uint32_t rkey;
  uint32_t pad;
  uint64_t seqEnd;
};

// A connection's queue pairs (RC) and the completion queue they share.
class IbQps {
 public:
  // Creates the CQ and `n` QPs, in INIT.
  IbQps(std::shared_ptr<IbDevice> dev, int n, const std::string& who);
  ~IbQps();
  IbQps(const IbQps&) = delete;
  IbQps& operator=(const IbQps&) = delete;
  void describe(IbConnInfo* info) const;  // qpns, lid, gid, mtu
  // RTR towards `peer`'s QPs, then RTS. Throws kSystemError (kRemoteError when `peer`
  // is malformed).
  void connect(const IbConnInfo& peer, const IbOptions& o);
  int size() const { return static_cast<int>(qps_.size()); }
  ibv_qp* qp(int i) const { return qps_[i]; }
  ibv_qp* const* all() const { return qps_.data(); }
  ibv_cq* cq() const { return cq_; }
  const std::shared_ptr<IbDevice>& dev() const { return dev_; }

 private:
  void modify(ibv_qp* qp, ibv_qp_attr& a, int mask, const char* to);
  void release();
  std::shared_ptr<IbDevice> dev_;
  const IbvApi& api_;
  std::string who_;
  ibv_cq* cq_ = nullptr;
  std::vector<ibv_qp*> qps_;
};

// NCCL_IB_ADAPTIVE_ROUTING's value on a port: -2 (unset) on for InfiniBand, off for RoCE;
// 0 off; anything else on, as NCCL reads it.
bool adaptiveRoutingOn(int knob, bool roce);

// The largest message a connection of `qps` queue pairs on `dev` carries: each QP writes
// its part with one work request (at most the port's max_msg_sz), and the size travels in
// 32 bits.
size_t maxMessageBytes(const IbDevice& dev, int qps);

// Throws kSystemError: "<who>: <call> failed: <errno text><hint>".
[[noreturn]] void verbsFailed(const std::string& who, const char* call, int err,
                              const char* hint = "");

// The data path (ib_comm.cc). Both take over the control stream and the connected QPs.
std::unique_ptr<NetSendComm> makeIbSendComm(std::unique_ptr<IbQps> qps, std::unique_ptr<IbMr> fifoMr,
                                            std::unique_ptr<Cts[]> fifo, IbConnInfo peer,
                                            Socket control, std::string who);
std::unique_ptr<NetRecvComm> makeIbRecvComm(std::unique_ptr<IbQps> qps, IbConnInfo peer,
                                            Socket control, std::string who);

}  // namespace loom::ibnet
#endif
