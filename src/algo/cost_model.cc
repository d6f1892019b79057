#include "algo/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "base/error.h"
#include "topo/search.h"

namespace loom::algo {
namespace {

using topo::PathType;
using topo::System;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kMaxChannels = 32;

// Tables are {LL, LL128, Simple}; Protocol's order is {Simple, LL, LL128}.
double pick(const double (&t)[3], Protocol p) {
  switch (p) {
    case Protocol::kLL: return t[0];
    case Protocol::kLL128: return t[1];
    default: return t[2];
  }
}

// Per-step latency (us) by link class, for pipelined (ring) and non-pipelined (tree,
// halving-doubling) steps. NVLink, PCIe and IB rows are NCCL's hwLatencies; the shared
// memory and socket rows are Loom's estimates (futex hand-off; loopback TCP round trip).
struct StepLatency {
  double ring[3];
  double tree[3];
};
const StepLatency kStep[static_cast<int>(LinkClass::kCount)] = {
    /* NVLink */ {{0.6, 1.9, 3.4}, {0.6, 1.25, 4.0}},
    /* PCIe   */ {{1.0, 2.5, 5.7}, {1.0, 1.9, 4.0}},
    /* shm    */ {{0.4, 0.4, 1.0}, {0.4, 0.4, 1.0}},
    /* IB     */ {{2.7, 4.0, 14.0}, {5.0, 8.5, 14.0}},
    /* socket */ {{15.0, 15.0, 20.0}, {15.0, 15.0, 20.0}},
};
// Launch / hand-off latency (us): NCCL's baseLatencies for a CUDA kernel; for the CPU
// executor, waking a worker thread (Loom estimate).
const double kBaseRing[3] = {6.6, 14.0, 8.4};
const double kBaseTree[3] = {6.8, 14.0, 8.4};
const double kBaseHost[3] = {2.5, 2.5, 3.0};
// Network proxy post overhead per inter-host ring step (NCCL_NET_OVERHEAD default, x3 for Simple).
constexpr double kNetOverheadUs = 1.0;
// A one-shot step polls one flag per peer.
constexpr double kPeerPollGpuUs = 0.15, kPeerPollHostUs = 0.3;
// Halving-doubling cannot overlap a step's reduction with the next exchange the way a
// ring pipeline does; 0.9 keeps it behind the ring at large sizes, as measured elsewhere.
constexpr double kHdEfficiency = 0.9;
// Tree all-reduce efficiency and per-channel caps (NCCL: busBw * .92; perChMaxTreeBws).
constexpr double kTreeEfficiency = 0.92;
// NDR measures 46-48 GB/s of 50 per NIC through NCCL (nccl-tests #290, #319): 0.94.
constexpr double kRdmaEfficiency = 0.94;
constexpr double kSocketEfficiency = 0.9;
// One CPU thread copying (and reducing) through shared memory (Loom estimate).
constexpr double kShmChannelBw = 6.0;
// CPU executor specifics, fitted to the crossovers measured with all_reduce_perf on 2-8
// ranks of one host (one-shot up to ~32 KiB, halving-doubling up to ~512 KiB, then the
// ring): a one-shot step copies its data into the FIFO and reduces it out again (a quarter
// more time per byte than a pipelined exchange), and a ring step that lets the peer read
// this rank's memory (process_vm_readv) costs a system call and a completion hand-off.
constexpr double kHostDirectPasses = 1.25;
constexpr double kHostShareStepUs = 10.0;

bool gpuExec(const NodeModel& m) { return !m.hostMemory; }

double base(const NodeModel& m, Algorithm a, Protocol p) {
  if (!gpuExec(m)) return pick(kBaseHost, p);
  return pick(a == Algorithm::kTree ? kBaseTree : kBaseRing, p);
}

double step(LinkClass c, bool pipelined, Protocol p) {
  const StepLatency& s = kStep[static_cast<int>(c)];
  return pick(pipelined ? s.ring : s.tree, p);
}

int ceilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

// Channels a message of this size keeps busy: below a few KiB per channel the extra
// channels only add synchronisation (NCCL's per-thread thresholds, times a block).
int channelsFor(const NodeModel& m, Protocol p, size_t bytes) {
  size_t minPerChannel = p == Protocol::kLL ? 4096 : p == Protocol::kLL128 ? 16384 : 65536;
  size_t c = std::max<size_t>(1, bytes / minPerChannel);
  return static_cast<int>(std::min<size_t>(c, static_cast<size_t>(std::max(1, m.maxChannels))));
}

// Effective bandwidth of `linkBw` (GB/s) under a protocol and channel count.
double protoBw(const NodeModel& m, Protocol p, double linkBw, int channels, int nnodes, bool tree) {
  double eff = 1.0, perCh = m.perChannelBw, cap = kInf;
  if (p == Protocol::kLL) {
    eff = tree ? 1.0 / 3.8 : 0.5;  // 8-byte lines carry 4 bytes of data; tree LL per NCCL
    perCh *= 0.5;
    if (gpuExec(m)) {
      // NCCL's llMaxBws: single host by GPU generation, multi-host by node count.
      bool hopper = m.sm >= 90, ampere = m.sm >= 80;
      cap = nnodes == 1 ? (hopper ? 141.0 : ampere ? 87.7 : 39.0)
                        : (nnodes == 2 ? (hopper ? 45.0 : 22.5) : (hopper ? 35.0 : 19.0));
    }
  } else if (p == Protocol::kLL128) {
    eff = tree ? (nnodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0) : 0.92;
    perCh = m.sm >= 90 ? 36.7 : 20.0;
  } else if (tree) {
    eff = kTreeEfficiency;
    perCh = gpuExec(m) ? (m.sm >= 90 ? 38.7 : m.sm >= 80 ? 24.0 : 20.0) : perCh;
  }
  return std::min({linkBw * eff, channels * perCh, cap});
}

size_t chunkFor(const NodeModel& m, Protocol p, size_t bytes, int channels, int nranks) {
  size_t slot = p == Protocol::kLL ? 16384 : p == Protocol::kLL128 ? 122880 : (gpuExec(m) ? 524288 : 262144);
  size_t per = bytes / static_cast<size_t>(std::max(1, channels) * std::max(1, nranks));
  per = (per + 127) / 128 * 128;
  return std::clamp<size_t>(per, 128, slot);
}

// LL128's 128-byte lines must land whole: NVLink between GPUs, GPUDirect RDMA across hosts.
bool ll128Unsupported(const NodeModel& m, int nnodes) {
  return m.hostMemory || m.intra != LinkClass::kNvLink || (nnodes > 1 && m.inter != LinkClass::kNetIb);
}
constexpr const char* kLl128Why =
    "LL128 relies on 128-byte stores arriving whole, which only NVLink-connected GPU memory "
    "(and GPUDirect RDMA) guarantee";

// The hierarchical all-reduce, broadcast and reduce on the CPU executor split large buffers
// over two channels (each on its own connections): while one half crosses the network the
// other is in its intra-host phases, so the three phases of one half overlap those of the
// other instead of running one after another.
constexpr size_t kHostTwoChannelBytes = 1 << 20;

double toUs(double bytes, double gbps) { return gbps > 0 ? bytes / (gbps * 1e3) : kInf; }

// ---- NodeModel helpers ----

LinkClass classOf(PathType t) { return t <= PathType::kNvb ? LinkClass::kNvLink : LinkClass::kPcie; }

// Per-rank bandwidth when each of `flows` (GPU index pairs) runs at once over its path.
double concurrentBw(const System& sys, const std::vector<std::pair<int, int>>& flows) {
  if (flows.empty()) return kInf;
  std::vector<double> cap(sys.nodes().size() * sys.nodes().size(), 0);
  std::vector<int> use(cap.size(), 0);
  size_t n = sys.nodes().size();
  for (size_t a = 0; a < n; ++a)
    for (const topo::Link& l : sys.node(static_cast<int>(a)).links)
      cap[a * n + static_cast<size_t>(l.peer)] = std::max(cap[a * n + static_cast<size_t>(l.peer)], l.bw);
  for (const auto& [a, b] : flows) {
    const topo::Path& p = sys.gpuToGpu(a, b);
    for (size_t i = 0; i + 1 < p.hops.size(); ++i) ++use[static_cast<size_t>(p.hops[i]) * n + static_cast<size_t>(p.hops[i + 1])];
  }
  double bw = kInf;
  for (size_t k = 0; k < cap.size(); ++k)
    if (use[k] > 0) bw = std::min(bw, cap[k] / use[k]);
  return bw;
}

double gpuPortBw(const System& sys, int g) {
  double nvl = 0;
  for (const topo::Link& l : sys.node(sys.gpuNodeId(g)).links)
    if (l.type == topo::LinkType::kNvl) nvl += l.bw;
  return nvl > 0 ? nvl : sys.gpu(g).pciLinkBw > 0 ? sys.gpu(g).pciLinkBw : 12.0;
}

void addNetwork(const System& sys, NodeModel& m, int gpusUsed) {
  std::set<int> rails;
  if (!m.hostMemory) {
    for (int g = 0; g < gpusUsed; ++g)
      if (sys.railOf(g) >= 0) rails.insert(sys.railOf(g));
  } else {
    // Host buffers: every RDMA port can carry a local rank's traffic, one per rank at most.
    for (int i = 0; i < sys.netCount() && static_cast<int>(rails.size()) < m.localRanks; ++i)
      if (sys.net(i).rdma) rails.insert(i);
  }
  bool rdma = !rails.empty();
  for (int r : rails) rdma = rdma && sys.net(r).rdma;
  if (rdma) {
    m.inter = LinkClass::kNetIb;
    for (int r : rails) m.netBw += sys.net(r).speedMbps / 8000.0 * kRdmaEfficiency;
    m.rails = static_cast<int>(rails.size());
    return;
  }
  // Sockets: Loom's socket transport uses one interface; take the fastest.
  m.inter = LinkClass::kNetSocket;
  double best = 0;
  for (int i = 0; i < sys.netCount(); ++i) best = std::max(best, sys.net(i).speedMbps);
  if (best <= 0) {
    best = 10000;
    m.notes += "no network port found: assuming 10 Gb/s TCP; ";
  }
  m.netBw = best / 8000.0 * kSocketEfficiency;
  m.rails = 1;
}

}  // namespace

const char* linkClassName(LinkClass c) {
  switch (c) {
    case LinkClass::kNvLink: return "NVLink";
    case LinkClass::kPcie: return "PCIe";
    case LinkClass::kShm: return "SHM";
    case LinkClass::kNetIb: return "IB";
    case LinkClass::kNetSocket: return "Socket";
    default: return "?";
  }
}

double busBwFactor(Collective coll, int nranks) {
  double n = std::max(1, nranks);
  switch (coll) {
    case Collective::kAllReduce: return 2 * (n - 1) / n;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAlltoAll:
    case Collective::kGather:
    case Collective::kScatter: return (n - 1) / n;
    default: return 1.0;
  }
}

NodeModel buildNodeModel(const System& sys, int localRanks, bool hostMemory) {
  LOOM_CHECK_ARG(localRanks >= 1, "cost model: %d local ranks", localRanks);
  NodeModel m;
  m.localRanks = localRanks;
  m.hostMemory = hostMemory || sys.gpuCount() == 0;
  if (!hostMemory && sys.gpuCount() == 0) m.notes += "no GPU: ranks use host memory; ";
  int gpusUsed = 0;
  if (!m.hostMemory) {
    gpusUsed = std::min(localRanks, sys.gpuCount());
    int share = (localRanks + gpusUsed - 1) / gpusUsed;
    if (share > 1) m.notes += strprintf("%d ranks share %d GPUs; ", localRanks, gpusUsed);
    std::vector<int> used;
    for (int g = 0; g < gpusUsed; ++g) used.push_back(g);
    m.sm = 0;
    for (int g : used) {
      int s = sys.gpu(g).sm;
      if (s > 0 && (m.sm == 0 || s < m.sm)) m.sm = s;
    }
    if (m.sm == 0) m.notes += "GPU generation unknown (no sm); ";
    m.portBw = kInf;
    for (int g : used) m.portBw = std::min(m.portBw, gpuPortBw(sys, g) / share);
    if (gpusUsed > 1) {
      topo::RingSet rings = topo::searchRings(sys, used);
      m.ringBw = rings.totalBw() / share;
      for (const topo::Ring& r : rings.rings) m.ringOrders.push_back(r.gpus);
      m.intra = classOf(rings.rings.front().worst);
      std::vector<std::pair<int, int>> all;
      for (int a : used)
        for (int b : used)
          if (a != b) all.emplace_back(a, b);
      m.allToAllBw = concurrentBw(sys, all) * (gpusUsed - 1) / share;
      for (int d = 1; d < gpusUsed; d *= 2) {
        std::vector<std::pair<int, int>> flows;
        for (int a = 0; a < gpusUsed; ++a)
          if ((a ^ d) < gpusUsed) flows.emplace_back(a, a ^ d);
        m.hdBw.push_back(std::min(concurrentBw(sys, flows), m.portBw) / share);
      }
    } else {
      m.ringBw = m.allToAllBw = topo::kLocalBw;
      m.ringOrders = {used};
      m.intra = LinkClass::kNvLink;
    }
    m.perChannelBw = m.intra == LinkClass::kNvLink ? (m.sm >= 90 ? 24.0 : m.sm >= 80 ? 20.0 : 16.0) : 12.0;
    m.maxChannels = std::clamp(static_cast<int>(std::ceil(std::min(m.ringBw, 1000.0) / m.perChannelBw)), 1,
                               kMaxChannels);
  } else {
    // The CPU executor runs one pipeline per rank: one channel, whatever the core count.
    m.intra = LinkClass::kShm;
    m.maxChannels = 1;
    m.perChannelBw = kShmChannelBw;
    m.ringBw = m.portBw = m.allToAllBw = m.maxChannels * kShmChannelBw;
    for (int d = 1; d < localRanks; d *= 2) m.hdBw.push_back(m.ringBw);
  }
  addNetwork(sys, m, gpusUsed);
  return m;
}

bool protocolRuns(const NodeModel& m, Protocol p, int nnodes, std::string* why) {
  const char* no = nullptr;
  if (m.hostMemory && p != Protocol::kSimple) no = "the CPU executor (host memory) moves data in Simple slots only";
  else if (p == Protocol::kLL128 && ll128Unsupported(m, nnodes)) no = kLl128Why;
  if (no && why) *why = no;
  return no == nullptr;
}

PlanShape planShape(const NodeModel& m, Collective coll, Algorithm algo, Protocol proto, size_t bytes,
                    int nranks) {
  PlanShape s;
  s.chunkBytes = bytes;
  if (nranks <= 1) return s;
  const bool rooted = coll == Collective::kBroadcast || coll == Collective::kReduce;
  if (m.hostMemory) {
    // Ring and halving-doubling exchanges send before they receive, so a step must fit in
    // half a FIFO for the two ends of a link never to wait on each other; a chain
    // (broadcast, reduce) and the one-shot send whole messages, which stream through the
    // FIFO slot by slot; the double binary tree pipelines two-slot chunks, one tree per
    // channel.
    const size_t half = m.fifoSlotBytes * static_cast<size_t>(m.fifoDepth) / 2;
    switch (algo) {
      case Algorithm::kRing: s.chunkBytes = rooted ? bytes : half; break;
      case Algorithm::kTree:
        s.channels = 2;
        s.chunkBytes = 2 * m.fifoSlotBytes;
        break;
      case Algorithm::kHalvingDoubling: s.chunkBytes = half; break;
      case Algorithm::kHierarchical: {
        const bool split = coll == Collective::kAllReduce || rooted;
        s.channels = split && bytes >= kHostTwoChannelBytes ? 2 : 1;
        s.chunkBytes = half;
        break;
      }
      default: break;  // Direct: one whole message per peer
    }
    return s;
  }
  s.channels = channelsFor(m, proto, bytes);
  s.chunkBytes = algo == Algorithm::kDirect ? (bytes + s.channels - 1) / s.channels
                                            : chunkFor(m, proto, bytes, s.channels, nranks);
  // The device executor's FIFOs have the host's shape, and its steps the host's rule: an
  // exchange's step fits half a FIFO, a tree's two slots (chains stream whole messages).
  // With the default FIFO (8 x 256 KiB) NCCL's chunks already do.
  if (m.fifoSlotBytes > 0 && algo != Algorithm::kDirect && !(rooted && algo == Algorithm::kRing)) {
    const size_t half = m.fifoSlotBytes * static_cast<size_t>(std::max(1, m.fifoDepth)) / 2;
    s.chunkBytes = std::min(s.chunkBytes, algo == Algorithm::kTree ? 2 * m.fifoSlotBytes : half);
  }
  return s;
}

size_t chunkCeiling(const NodeModel& m, Collective coll, Algorithm algo, Protocol proto, int nranks) {
  constexpr size_t kLargest = size_t{1} << 40;  // the largest size class
  return planShape(m, coll, algo, proto, kLargest, nranks).chunkBytes;
}

Estimate estimate(const NodeModel& m, Collective coll, Algorithm algo, Protocol proto, size_t bytes,
                  int nranks, int nnodes) {
  LOOM_CHECK_ARG(nranks >= 1 && nnodes >= 1 && nnodes <= nranks,
                 "cost model: %d ranks on %d hosts is not a valid layout", nranks, nnodes);
  Estimate e;
  auto no = [&](const char* why) {
    e.feasible = false;
    e.why = why;
    return e;
  };
  const int n = nranks, N = nnodes;
  const int G = (n + N - 1) / N;
  const double S = static_cast<double>(bytes);
  const bool ar = coll == Collective::kAllReduce, ag = coll == Collective::kAllGather,
             rs = coll == Collective::kReduceScatter, bc = coll == Collective::kBroadcast,
             rd = coll == Collective::kReduce;
  if (proto == Protocol::kLL128 && ll128Unsupported(m, N)) return no(kLl128Why);
  if (n == 1 && algo != Algorithm::kDirect) return no("one rank: only a local copy (Direct)");

  const PlanShape shape = planShape(m, coll, algo, proto, bytes, n);
  // Channels beyond what the executor drives at once add no bandwidth: the CPU executor
  // runs all of a rank's channels on one thread.
  const int ch = std::min(shape.channels, std::max(1, m.maxChannels));
  const double intraStep = step(m.intra, true, proto);
  const double intraTreeStep = step(m.intra, false, proto);
  const double netStep = step(m.inter, true, proto);
  const double netTreeStep = step(m.inter, false, proto);
  const double poll = m.hostMemory ? kPeerPollHostUs : kPeerPollGpuUs;
  double lat = base(m, algo, proto);
  double xfer = 0;  // bandwidth term, us

  switch (algo) {
    case Algorithm::kRing: {
      if (!(ar || ag || rs || bc || rd)) return no("Ring implements AllReduce, AllGather, ReduceScatter, Broadcast and Reduce");
      int steps = ar ? 2 * (n - 1) : n - 1;
      int inter = N == 1 ? 0 : (ar ? 2 * (N - 1) : N - 1);
      double intraLat = N > 1 ? std::max(intraStep, kNetOverheadUs * (proto == Protocol::kSimple ? 3 : 1)) : intraStep;
      lat += (steps - inter) * intraLat + inter * netStep;
      if (m.hostMemory && G > 1 && (ar || ag || bc)) lat += (G - 1) * kHostShareStepUs;
      double linkBw = N > 1 ? std::min(m.ringBw, m.netBw) : m.ringBw;
      double factor = (bc || rd) ? 1.0 : busBwFactor(coll, n);
      xfer = toUs(factor * S, protoBw(m, proto, linkBw, ch, N, false));
      break;
    }
    case Algorithm::kTree: {
      if (!(ar || bc || rd)) return no("Tree implements AllReduce, Broadcast and Reduce");
      if (m.hostMemory && N > 1)
        return no("the CPU executor's double binary tree spans ranks, not hosts (NCCL's trees chain "
                  "each host's GPUs under one tree node); across hosts Hierarchical does that job");
      int levels = ceilLog2(N);
      double intraBw = G > 1 ? m.ringBw : kInf;
      if (ar) {
        lat += 2 * ((G - 1) * intraTreeStep + levels * netTreeStep);
        // Every inner GPU sends each byte up and down (2S per port); across hosts a node
        // sends 2S except with two hosts, where each is a root and sends S.
        double interBw = N == 1 ? kInf : (N == 2 ? m.netBw : 0.5 * m.netBw);
        xfer = toUs(S, protoBw(m, proto, std::min(0.5 * intraBw, interBw), ch, N, true));
      } else {
        lat += (G - 1) * intraTreeStep + levels * netTreeStep;
        xfer = toUs(S, protoBw(m, proto, std::min(intraBw, N > 1 ? m.netBw : kInf), ch, N, true));
      }
      break;
    }
    case Algorithm::kHalvingDoubling: {
      if (!(ar || ag || rs)) return no("HalvingDoubling implements AllReduce, AllGather and ReduceScatter");
      int p = 1;
      while (p * 2 <= n) p *= 2;
      if (!ar && p != n) return no("HalvingDoubling AllGather/ReduceScatter needs a power-of-two rank count");
      int phases = ar ? 2 : 1;
      // Distance 1 first: the largest halves move between the closest ranks.
      for (int k = 0, d = 1; d < p; ++k, d *= 2) {
        bool crossHost = d >= G && N > 1;
        double bw = crossHost ? m.netBw / G
                              : (static_cast<size_t>(k) < m.hdBw.size() ? m.hdBw[static_cast<size_t>(k)] : m.portBw);
        double eff = protoBw(m, proto, bw, ch, N, false) * kHdEfficiency;
        lat += phases * (crossHost ? netTreeStep : intraTreeStep);
        xfer += phases * toUs(S / (2.0 * d), eff);
      }
      if (p != n) {  // fold the extra ranks in before and out after
        lat += 2 * (N > 1 ? netTreeStep : intraTreeStep);
        xfer += 2 * toUs(S, protoBw(m, proto, N > 1 ? m.netBw / G : m.portBw, ch, N, false));
      }
      break;
    }
    case Algorithm::kDirect: {
      if (n == 1) {
        xfer = toUs(S, m.hostMemory ? m.portBw : 1000.0);
        break;
      }
      bool p2pStyle = coll == Collective::kAlltoAll || coll == Collective::kGather ||
                      coll == Collective::kScatter || coll == Collective::kSendRecv;
      if (!p2pStyle && N > 1)
        return no("Direct (one-shot) reduction and gathering is single-host; across hosts it sends n-1 "
                  "copies per rank over the network");
      lat += (N > 1 ? netTreeStep : intraTreeStep);
      if (coll != Collective::kSendRecv) lat += (n - 1) * poll;
      double a2a = protoBw(m, proto, m.allToAllBw, ch, N, false) / (m.hostMemory ? kHostDirectPasses : 1.0);
      double port = protoBw(m, proto, m.portBw, ch, N, false);
      double net = protoBw(m, proto, m.netBw, ch, N, false);
      switch (coll) {
        case Collective::kAllReduce: xfer = toUs((n - 1) * S, a2a); break;
        case Collective::kAllGather:
        case Collective::kReduceScatter: xfer = toUs((n - 1.0) / n * S, a2a); break;
        case Collective::kBroadcast:
        case Collective::kReduce: xfer = toUs((n - 1) * S, port); break;
        case Collective::kAlltoAll:
          xfer = std::max(toUs((G - 1.0) / n * S, a2a), N > 1 ? toUs(G * (n - G) * S / n, net) : 0.0);
          break;
        case Collective::kGather:
        case Collective::kScatter:
          xfer = std::max(toUs((G - 1.0) / n * S, port), N > 1 ? toUs((n - G) * S / n, net) : 0.0);
          break;
        case Collective::kSendRecv:
          xfer = toUs(S, N > 1 ? net / std::max(1, m.rails) : port);
          break;
        default:
          return no("unknown collective");
      }
      break;
    }
    case Algorithm::kHierarchical: {
      if (!(ar || ag || rs || bc || rd)) return no("Hierarchical implements AllReduce, AllGather, ReduceScatter, Broadcast and Reduce");
      if (N < 2 || G < 2) return no("Hierarchical needs several hosts with several ranks each");
      double intraBw = protoBw(m, proto, m.ringBw, ch, 1, false);
      double netBw = protoBw(m, proto, m.netBw, ch, N, false);
      if (ar) {
        // Intra reduce-scatter, all-reduce of 1/G of the data per local rank across hosts
        // (all local ranks at once, sharing the host's NICs), intra all-gather.
        lat += 2 * (G - 1) * intraStep + 2 * (N - 1) * netStep;
        xfer = 2 * toUs((G - 1.0) / G * S, intraBw) + toUs(2.0 * (N - 1) / N * S, netBw);
      } else if (ag || rs) {
        lat += 2 * (G - 1) * intraStep + (N - 1) * netStep;
        xfer = toUs((G - 1.0) / G * S, intraBw) + toUs((N - 1.0) / N * S, netBw);
      } else {
        lat += (G - 1) * intraStep + (N - 1) * netStep;
        xfer = toUs(S, intraBw) + toUs(S, netBw);
      }
      break;
    }
    default:
      return no("unknown algorithm");
  }
  e.feasible = true;
  e.latencyUs = lat;
  e.us = lat + xfer;
  e.channels = shape.channels;
  e.chunkBytes = shape.chunkBytes;
  e.busBw = e.us > 0 ? busBwFactor(coll, n) * S / (e.us * 1e3) : 0;
  return e;
}

}  // namespace loom::algo
