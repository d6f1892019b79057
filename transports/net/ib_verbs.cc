#include "transports/net/ib_verbs.h"

#ifdef LOOM_VERBS_HEADERS
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <array>
#include <fstream>
#include <algorithm>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"

namespace loom::ibnet {
namespace {

IntKnob kQps("LOOM_IB_QPS_PER_CONNECTION", "NCCL_IB_QPS_PER_CONNECTION", 1,
             "Queue pairs per verbs connection; messages take them in turn, or each is split across them "
             "(NCCL_IB_SPLIT_DATA_ON_QPS) (1-16)");
IntKnob kTimeout("LOOM_IB_TIMEOUT", "NCCL_IB_TIMEOUT", 20,
                 "Verbs ACK timeout exponent: 4.096 us * 2^value per retry (1-31)");
IntKnob kRetry("LOOM_IB_RETRY_CNT", "NCCL_IB_RETRY_CNT", 7,
               "Verbs transport retries before a send fails with retry-exceeded (0-7)");
IntKnob kTc("LOOM_IB_TC", "NCCL_IB_TC", 0, "Verbs traffic class (GRH; RoCE DSCP << 2) (0-255)");
IntKnob kSl("LOOM_IB_SL", "NCCL_IB_SL", 0, "InfiniBand service level of verbs QPs (0-15)");
IntKnob kGid("LOOM_IB_GID_INDEX", "NCCL_IB_GID_INDEX", -1,
             "GID index of verbs connections; -1: the first RoCE v2 GID with an IPv4 address, "
             "else the first that is set");
IntKnob kRelaxed("LOOM_IB_PCI_RELAXED_ORDERING", "NCCL_IB_PCI_RELAXED_ORDERING", 2,
                 "Register verbs memory with PCIe relaxed ordering (IBV_ACCESS_RELAXED_ORDERING): 0 no; 1 or 2 "
                 "where libibverbs has ibv_reg_mr_iova2, as NCCL (devices that cannot ignore it)");
IntKnob kSplit("LOOM_IB_SPLIT_DATA_ON_QPS", "NCCL_IB_SPLIT_DATA_ON_QPS", 0,
               "With several QPs per connection: 0 each message goes whole on one QP, the QPs in turn; 1 each "
               "message is split across all of them (the sender's setting holds for the connection)");
IntKnob kAr("LOOM_IB_ADAPTIVE_ROUTING", "NCCL_IB_ADAPTIVE_ROUTING", -2,
            "Adaptive routing: messages over NCCL_IB_AR_THRESHOLD are written first, their immediate after in "
            "a write of its own, so that no part of a message arrives after its completion. -2 (default): on "
            "for InfiniBand ports, off for RoCE, as NCCL; 0 off; any other value on");
IntKnob kArThreshold("LOOM_IB_AR_THRESHOLD", "NCCL_IB_AR_THRESHOLD", 8192,
                     "With adaptive routing on, messages larger than this many bytes take the write, then "
                     "its immediate (default 8192, as NCCL)");
IntKnob kAsyncEvents("LOOM_IB_RETURN_ASYNC_EVENTS", "NCCL_IB_RETURN_ASYNC_EVENTS", 1,
                     "Non-zero: a fatal asynchronous event of a verbs device (device, QP or CQ error) fails the "
                     "connections it names, as NCCL; 0: it is only logged");
IntKnob kPkey("LOOM_IB_PKEY", "NCCL_IB_PKEY", 0,
              "Partition-key index of verbs QPs (an index into the port's P_Key table, as NCCL)");
BoolKnob kDisable("LOOM_IB_DISABLE", "NCCL_IB_DISABLE", false,
                  "1: never use the verbs (InfiniBand/RoCE) network backend");

int ranged(const IntKnob& k, int64_t lo, int64_t hi) {
  int64_t v = k.get();
  if (v < lo || v > hi)
    LOOM_THROW(kInvalidArgument, "%s=%lld is out of range (%lld..%lld)", k.name(),
               static_cast<long long>(v), static_cast<long long>(lo), static_cast<long long>(hi));
  return static_cast<int>(v);
}

std::string gidType(const std::string& dev, int port, int index) {
  std::ifstream f("/sys/class/infiniband/" + dev + "/ports/" + std::to_string(port) +
                  "/gid_attrs/types/" + std::to_string(index));
  std::string t;
  std::getline(f, t);
  return t;
}

std::array<uint8_t, 16> gidBytes(const ibv_gid& g) {
  std::array<uint8_t, 16> b;
  memcpy(b.data(), g.raw, b.size());
  return b;
}

// The port's set GIDs with their RoCE versions (sysfs); *typed: some version was readable.
std::vector<GidEntry> gidTable(const IbvApi& api, ibv_context* ctx, const std::string& dev, int port, int len,
                               bool* typed) {
  std::vector<GidEntry> table;
  for (int i = 0; i < len && i < 256; ++i) {
    ibv_gid g{};
    if (api.queryGid(ctx, static_cast<uint8_t>(port), i, &g) != 0 || !gidSet(gidBytes(g))) continue;
    std::string type = gidType(dev, port, i);
    *typed |= !type.empty();
    table.push_back({i, gidBytes(g), type == "RoCE v2" ? 2 : type.find("v1") != std::string::npos ? 1 : 0});
  }
  return table;
}

}  // namespace

IbOptions IbOptions::fromKnobs() {
  IbOptions o;
  o.qps = ranged(kQps, 1, kMaxQps);
  o.timeout = ranged(kTimeout, 1, 31);
  o.retryCnt = ranged(kRetry, 0, 7);
  o.tc = ranged(kTc, 0, 255);
  o.sl = ranged(kSl, 0, 15);
  o.gidIndex = ranged(kGid, -1, 255);  // a GRH's sgid_index is 8 bits
  o.relaxedOrdering = ranged(kRelaxed, 0, 2);
  o.splitData = ranged(kSplit, 0, 1) == 1;
  const int64_t ar = kAr.get();
  o.adaptiveRouting = ar == -2 ? -2 : ar != 0;  // as NCCL: -2 by link layer, 0 off, anything else on
  int64_t threshold = kArThreshold.get();
  if (threshold < 0)
    LOOM_THROW(kInvalidArgument, "%s=%lld: a threshold in bytes must not be negative", kArThreshold.name(),
               static_cast<long long>(threshold));
  o.arThreshold = static_cast<size_t>(threshold);
  o.gid = GidPolicy::fromKnobs();
  o.asyncEvents = kAsyncEvents.get() != 0;
  o.pkeyIndex = ranged(kPkey, 0, 65535);
  return o;
}

bool ibDisabled() { return kDisable.get(); }

bool adaptiveRoutingOn(int knob, bool roce) { return knob == -2 ? !roce : knob != 0; }

size_t maxMessageBytes(const IbDevice& dev, int qps) {
  uint64_t perQp = dev.attr.max_msg_sz ? dev.attr.max_msg_sz : (1ull << 30);
  return static_cast<size_t>(std::min<uint64_t>(kOversized - 1, perQp * static_cast<uint64_t>(qps)));
}

void verbsFailed(const std::string& who, const char* call, int err, const char* hint) {
  LOOM_THROW(kSystemError, "%s: %s failed: %s%s", who.c_str(), call,
             err ? strerror(err) : "no reason given", hint);
}

IbDevice::IbDevice(const IbvApi& a, const IbPort& p, const IbOptions& o)
    : api(a), name(p.device), port(p.port) {
  std::string who = "verbs device " + label();
  int n = 0;
  ibv_device** list = api.getDeviceList(&n);
  if (!list) verbsFailed(who, "ibv_get_device_list", errno);
  for (int i = 0; i < n && !ctx; ++i) {
    const char* nm = api.getDeviceName(list[i]);
    if (nm && name == nm) {
      ctx = api.openDevice(list[i]);
      if (!ctx) {
        int e = errno;
        api.freeDeviceList(list);
        verbsFailed(who, "ibv_open_device", e);
      }
    }
  }
  api.freeDeviceList(list);
  if (!ctx) LOOM_THROW(kSystemError, "%s: the device is gone", who.c_str());
  try {
    events = std::make_unique<IbEvents>(api, ctx, port, label(), o.asyncEvents);
    if (api.queryPort(ctx, static_cast<uint8_t>(port), &attr) != 0)
      verbsFailed(who, "ibv_query_port", errno);
    if (attr.state != IBV_PORT_ACTIVE)
      LOOM_THROW(kSystemError, "%s: the port is not active", who.c_str());
    if (o.pkeyIndex >= static_cast<int>(attr.pkey_tbl_len))
      LOOM_THROW(kInvalidArgument, "%s: NCCL_IB_PKEY=%d is outside the port's partition-key table (%d entries; "
                 "the knob is an index into it, as in NCCL)", who.c_str(), o.pkeyIndex, attr.pkey_tbl_len);
    pkeyIndex = o.pkeyIndex;
    pd = api.allocPd(ctx);
    if (!pd) verbsFailed(who, "ibv_alloc_pd", errno);
    bool typed = false;
    if (o.gidIndex >= 0) {
      gidIndex = o.gidIndex;  // NOLINT: range-checked by IbOptions
      if (gidIndex >= attr.gid_tbl_len || api.queryGid(ctx, static_cast<uint8_t>(port), gidIndex, &gid) != 0 ||
          (roce() && !gidSet(gidBytes(gid)))) {
        std::string set = describeGids(gidTable(api, ctx, name, port, attr.gid_tbl_len, &typed));
        LOOM_THROW(kInvalidArgument, "%s: NCCL_IB_GID_INDEX=%d is not a set GID of the port "
                   "(its table has %d entries; set: %s)", who.c_str(), gidIndex,
                   attr.gid_tbl_len, set.empty() ? "none" : set.c_str());
      }
    } else if (roce()) {
      std::string note;
      gidIndex = chooseGid(gidTable(api, ctx, name, port, attr.gid_tbl_len, &typed), o.gid, who, &note);
      if (gidIndex < 0) LOOM_THROW(kSystemError, "%s: no GID is set (is the netdev up with an "
                                   "address?)", who.c_str());
      api.queryGid(ctx, static_cast<uint8_t>(port), gidIndex, &gid);
      if (!note.empty()) LOOM_WARN("%s: %s", who.c_str(), note.c_str());
      if (!typed)
        LOOM_WARN("%s: GID types are not readable (sysfs gid_attrs/types); using GID index %d. "
                  "Hosts that choose differently cannot connect: set NCCL_IB_GID_INDEX",
                  who.c_str(), gidIndex);
    } else {
      api.queryGid(ctx, static_cast<uint8_t>(port), 0, &gid);  // IB: the LID routes
    }
  } catch (...) {
    if (pd) api.deallocPd(pd);
    api.closeDevice(ctx);
    throw;
  }
  // GPU memory: the peer-memory module (as NCCL looks for it), DMA-BUF as the driver
  // answers a registration of no descriptor (EBADF: it would take one).
  for (const char* f : {"/sys/kernel/mm/memory_peers/nv_mem/version", "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
                        "/sys/module/nvidia_peermem/version"})
    if (access(f, F_OK) == 0) ptrSupport |= kNetPtrCuda;
  if (api.regDmabufMr) {
    errno = 0;
    ibv_mr* probe = api.regDmabufMr(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE);
    if (probe) api.deregMr(probe);
    else if (errno == EBADF) ptrSupport |= kNetPtrDmaBuf;
  }
  relaxedOrdering = o.relaxedOrdering != 0 && api.regMrIova2 != nullptr;
  adaptiveRouting = adaptiveRoutingOn(o.adaptiveRouting, roce());
  arThreshold = o.arThreshold;
  std::string ar = adaptiveRouting ? "on (over " + std::to_string(o.arThreshold) + " bytes)" : "off";
  LOOM_INFO(kLogNet | kLogInit,
            "NET/IB: %s opened (%s, GID index %d: %s, MTU %d; relaxed ordering %s; adaptive routing %s; "
            "GPU memory: %s)",
            label().c_str(), roce() ? "RoCE" : "InfiniBand", gidIndex, gidText(gidBytes(gid)).c_str(),
            128 << attr.active_mtu,
            relaxedOrdering ? "on" : o.relaxedOrdering ? "off (libibverbs has no ibv_reg_mr_iova2)" : "off",
            ar.c_str(),
            ptrSupport == kNetPtrHost ? "no (no peer-memory module, no DMA-BUF)"
            : ptrSupport & kNetPtrDmaBuf ? (ptrSupport & kNetPtrCuda ? "peer memory, DMA-BUF" : "DMA-BUF")
                                         : "peer memory");
}

IbDevice::~IbDevice() {
  if (pd) api.deallocPd(pd);
  if (ctx) api.closeDevice(ctx);
}

IbMr::~IbMr() {
  if (mr) dev->api.deregMr(mr);
}

namespace {

// IBV_ACCESS_RELAXED_ORDERING (IBV_ACCESS_OPTIONAL_FIRST), which headers before rdma-core
// 28 lack.
constexpr unsigned kAccessRelaxedOrdering = 1u << 20;
constexpr const char* kRelaxedHint = " (NCCL_IB_PCI_RELAXED_ORDERING=0 registers without relaxed ordering)";

// ibv_reg_mr of `data`, or with relaxed ordering ibv_reg_mr_iova2, as NCCL registers; `*call`
// names the call made.
ibv_mr* plainOrRelaxed(const IbDevice& dev, void* data, size_t bytes, bool relaxed, const char** call) {
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  *call = "ibv_reg_mr";
  if (!relaxed || !dev.relaxedOrdering) return dev.api.regMr(dev.pd, data, bytes, access);
  *call = "ibv_reg_mr_iova2";
  return dev.api.regMrIova2(dev.pd, data, bytes, reinterpret_cast<uintptr_t>(data),
                            static_cast<unsigned>(access) | kAccessRelaxedOrdering);
}

}  // namespace

std::unique_ptr<IbMr> registerMr(const std::shared_ptr<IbDevice>& dev, void* data, size_t bytes,
                                 const std::string& who, bool relaxed) {
  auto m = std::make_unique<IbMr>();
  m->dev = dev;
  m->base = static_cast<const char*>(data);
  m->bytes = bytes;
  if (bytes == 0) return m;
  const char* call = nullptr;
  m->mr = plainOrRelaxed(*dev, data, bytes, relaxed, &call);
  if (!m->mr) {
    int e = errno;
    verbsFailed(who, strprintf("%s(%zu bytes)", call, bytes).c_str(), e,
                e == ENOMEM || e == EPERM ? " (the locked-memory limit? ulimit -l must be unlimited for RDMA)"
                : strcmp(call, "ibv_reg_mr_iova2") == 0 ? kRelaxedHint : "");
  }
  return m;
}

std::unique_ptr<IbMr> registerGpuMr(const std::shared_ptr<IbDevice>& dev, void* data, size_t bytes, int fd,
                                    uint64_t offset, const std::string& who) {
  auto m = std::make_unique<IbMr>();
  m->dev = dev;
  m->base = static_cast<const char*>(data);
  m->bytes = bytes;
  m->gpu = true;
  if (bytes == 0) return m;
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                     static_cast<int>(dev->relaxedOrdering ? kAccessRelaxedOrdering : 0);
  if (fd >= 0) {
    if (!dev->api.regDmabufMr)
      LOOM_THROW(kInvalidUsage, "%s: this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later "
                 "registers GPU memory by DMA-BUF)", who.c_str());
    m->mr = dev->api.regDmabufMr(dev->pd, offset, bytes, reinterpret_cast<uintptr_t>(data), fd, access);
    if (!m->mr)
      verbsFailed(who, strprintf("ibv_reg_dmabuf_mr(%zu bytes of GPU memory)", bytes).c_str(), errno,
                  " (does the NIC's driver take DMA-BUF, and the GPU driver export it?)");
    return m;
  }
  const char* call = nullptr;
  m->mr = plainOrRelaxed(*dev, data, bytes, true, &call);
  if (!m->mr)
    verbsFailed(who, strprintf("%s(%zu bytes of GPU memory)", call, bytes).c_str(), errno,
                " (GPU memory over verbs needs the peer-memory module: modprobe nvidia-peermem)");
  return m;
}

IbQps::IbQps(std::shared_ptr<IbDevice> dev, int n, const std::string& who)
    : dev_(std::move(dev)), api_(dev_->api), who_(who) {
  // Each QP's send queue: per send in flight a write and (adaptive routing) its zero-byte
  // immediate, or per receive in flight a clear-to-send write. Completions: one per send
  // (the unsignaled write has none), receive and clear-to-send write.
  static_assert(2 * kMaxRequests <= 64, "send queue depth: two work requests per request in flight");
  int cqe = n * 3 * kMaxRequests + 16;
  try {
    cq_ = api_.createCq(dev_->ctx, cqe, nullptr, nullptr, 0);
    if (!cq_) verbsFailed(who_, "ibv_create_cq", errno);
    for (int i = 0; i < n; ++i) {
      ibv_qp_init_attr init{};
      init.send_cq = cq_;
      init.recv_cq = cq_;
      init.qp_type = IBV_QPT_RC;
      init.cap.max_send_wr = 2 * kMaxRequests;
      init.cap.max_recv_wr = kMaxRequests;
      init.cap.max_send_sge = 1;
      init.cap.max_recv_sge = 1;
      ibv_qp* qp = api_.createQp(dev_->pd, &init);
      if (!qp) verbsFailed(who_, "ibv_create_qp", errno);
      qps_.push_back(qp);
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_INIT;
      a.pkey_index = static_cast<uint16_t>(dev_->pkeyIndex);
      a.port_num = static_cast<uint8_t>(dev_->port);
      a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
      modify(qp, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
    }
  } catch (...) {
    release();
    throw;
  }
}

void IbQps::release() {
  // Under the events' lock, so that no event about them is taken between the forgetting
  // and the destruction (their QP numbers and CQ address may be reused).
  dev_->events->forget(qps_.data(), size(), cq_, [&] {
    for (ibv_qp* qp : qps_) api_.destroyQp(qp);
    qps_.clear();
    if (cq_) api_.destroyCq(cq_);
    cq_ = nullptr;
  });
}

IbQps::~IbQps() { release(); }

void IbQps::modify(ibv_qp* qp, ibv_qp_attr& a, int mask, const char* to) {
  int rc = api_.modifyQp(qp, &a, mask);
  if (rc != 0)
    verbsFailed(who_, strprintf("ibv_modify_qp(QP %u to %s)", qp->qp_num, to).c_str(),
                rc > 0 ? rc : errno,
                strcmp(to, "INIT") == 0 ? ""
                                        : " (check NCCL_IB_GID_INDEX, NCCL_IB_TC/SL and that "
                                          "both hosts' ports can reach each other)");
}

void IbQps::describe(IbConnInfo* info) const {
  info->magic = kInfoMagic;
  info->nqps = static_cast<uint32_t>(qps_.size());
  for (size_t i = 0; i < qps_.size(); ++i) info->qpn[i] = qps_[i]->qp_num;
  info->lid = dev_->attr.lid;
  info->roce = dev_->roce();
  info->mtu = static_cast<uint8_t>(dev_->attr.active_mtu);
  memcpy(info->gid, dev_->gid.raw, sizeof(info->gid));
}

void IbQps::connect(const IbConnInfo& peer, const IbOptions& o) {
  if (peer.magic != kInfoMagic || peer.nqps != qps_.size() || peer.mtu < IBV_MTU_256 ||
      peer.mtu > IBV_MTU_4096 || peer.roce != dev_->roce())
    LOOM_THROW(kRemoteError, "%s: the peer's queue-pair description does not match ours "
               "(%u QPs, %s; ours %zu, %s)", who_.c_str(), peer.nqps,
               peer.roce ? "RoCE" : "InfiniBand", qps_.size(), dev_->roce() ? "RoCE" : "InfiniBand");
  for (size_t i = 0; i < qps_.size(); ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = static_cast<ibv_mtu>(std::min<int>(peer.mtu, dev_->attr.active_mtu));
    a.dest_qp_num = peer.qpn[i];
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = static_cast<uint8_t>(dev_->port);
    a.ah_attr.sl = static_cast<uint8_t>(o.sl);
    if (dev_->roce()) {
      a.ah_attr.is_global = 1;
      memcpy(a.ah_attr.grh.dgid.raw, peer.gid, sizeof(peer.gid));
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(dev_->gidIndex);
      a.ah_attr.grh.hop_limit = 255;
      a.ah_attr.grh.traffic_class = static_cast<uint8_t>(o.tc);
    } else {
      a.ah_attr.dlid = peer.lid;
    }
    modify(qps_[i], a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER, "RTR");
    ibv_qp_attr s{};
    s.qp_state = IBV_QPS_RTS;
    s.timeout = static_cast<uint8_t>(o.timeout);
    s.retry_cnt = static_cast<uint8_t>(o.retryCnt);
    s.rnr_retry = 7;
    s.sq_psn = 0;
    s.max_rd_atomic = 1;
    modify(qps_[i], s, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC, "RTS");
  }
}

}  // namespace loom::ibnet
#endif
