#include "report.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>

#include "base/error.h"
#include "base/json.h"
#include "transports/net/net_transport.h"

namespace loom::tools {
namespace {

using topo::PathType;

std::string cell(const topo::Path& p) {
  if (p.type == PathType::kLoc) return "X";
  if (p.type == PathType::kNvl && p.nvlinks > 0) return strprintf("NV%d", p.nvlinks);
  return topo::pathTypeName(p.type);
}

// "00000000,00ffffff" -> "0-23"
std::string cpuList(const std::string& mask) {
  std::vector<int> cpus;
  int bit = 0;
  for (size_t i = mask.size(); i-- > 0;) {
    char c = mask[i];
    if (c == ',') continue;
    int v = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : 0;
    for (int b = 0; b < 4; ++b, ++bit)
      if (v & (1 << b)) cpus.push_back(bit);
  }
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + (i == j ? std::to_string(cpus[i]) : strprintf("%d-%d", cpus[i], cpus[j]));
    i = j + 1;
  }
  return out.empty() ? "-" : out;
}

std::string affinityOf(const topo::System& sys, int nodeId) {
  for (int id = nodeId; id >= 0; id = sys.node(id).parent)
    if (sys.node(id).type == topo::NodeType::kCpu) return cpuList(sys.node(id).element.attrOr("affinity", ""));
  return "-";
}

std::string nicBusId(const topo::System& sys, int net) {
  int p = sys.net(net).parent;
  return p >= 0 ? sys.node(p).busId : "";
}

std::string sizeName(size_t b) {
  if (b >= (1u << 30) && b % (1u << 30) == 0) return strprintf("%zuG", b >> 30);
  if (b >= (1u << 20) && b % (1u << 20) == 0) return strprintf("%zuM", b >> 20);
  if (b >= (1u << 10) && b % (1u << 10) == 0) return strprintf("%zuK", b >> 10);
  return strprintf("%zu", b);
}

std::string jsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  return strprintf("%.6g", v);
}

template <typename T, typename F>
std::string jsonArray(const std::vector<T>& v, F f) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + f(v[i]);
  return out + "]";
}

}  // namespace

namespace {

// The network device (rail) each local rank's channels use in the net transport
// (netRail), both ends of a connection on the same NIC index.
// Channels the selector uses at some size, at least one.
int channelsUsed(const Report& r) {
  int ch = std::max(1, r.model.maxChannels);
  for (const TuningRow& row : r.tuning) ch = std::max(ch, row.sel.channels);
  return ch;
}

void printNetRails(FILE* out, const Report& r) {
  const topo::System& sys = *r.sys;
  int nics = sys.netCount();
  if (nics < 1) return;
  fprintf(out, "  net transport rails (channel c of local rank o of %d on NIC (o + c x %d) mod "
          "%d; the receiver's NIC index on both ends):\n", r.model.localRanks, r.model.localRanks, nics);
  for (int o = 0; o < r.model.localRanks; ++o) {
    fprintf(out, "    local rank %d:", o);
    for (int c = 0; c < channelsUsed(r); ++c) {
      int n = netRail(o, r.model.localRanks, c, nics);
      fprintf(out, "%s channel %d -> NIC%d %s", c ? "," : "", c, n, sys.net(n).netName.c_str());
    }
    fprintf(out, "\n");
  }
  // The device executor starts each rank at its GPU's rail (netGpuRail).
  bool any = false;
  for (int g = 0; g < sys.gpuCount(); ++g) {
    const int rail = sys.railOf(g);
    if (rail < 0) continue;
    if (!any)
      fprintf(out, "  device executor rails (channel c of the rank on GPU g on NIC (rail(g) + c x %d) mod %d):\n",
              r.model.localRanks, nics);
    any = true;
    fprintf(out, "    GPU%d:", g);
    for (int c = 0; c < channelsUsed(r); ++c) {
      int n = netGpuRail(rail, r.model.localRanks, c, nics);
      fprintf(out, "%s channel %d -> NIC%d %s", c ? "," : "", c, n, sys.net(n).netName.c_str());
    }
    fprintf(out, "\n");
  }
}

}  // namespace

void printText(FILE* out, const Report& r) {
  const topo::System& sys = *r.sys;
  fprintf(out, "Topology: %s\n", sys.source().c_str());
  fprintf(out, "  %d GPU(s), %d network port(s), %d NUMA domain(s)%s\n\n", sys.gpuCount(), sys.netCount(),
          sys.cpuCount(), sys.hasNvSwitch() ? ", NVSwitch" : "");
  // nvidia-smi topo -m style matrix over GPUs and NICs.
  int g = sys.gpuCount(), n = sys.netCount();
  if (g + n > 0) {
    fprintf(out, "%-8s", "");
    for (int i = 0; i < g; ++i) fprintf(out, "%-7s", strprintf("GPU%d", i).c_str());
    for (int i = 0; i < n; ++i) fprintf(out, "%-7s", strprintf("NIC%d", i).c_str());
    fprintf(out, "%-16s%s\n", "CPU Affinity", "NUMA");
    for (int row = 0; row < g + n; ++row) {
      int src = row < g ? sys.gpuNodeId(row) : sys.netNodeId(row - g);
      fprintf(out, "%-8s", row < g ? strprintf("GPU%d", row).c_str() : strprintf("NIC%d", row - g).c_str());
      for (int c = 0; c < g + n; ++c) {
        int dst = c < g ? sys.gpuNodeId(c) : sys.netNodeId(c - g);
        fprintf(out, "%-7s", cell(sys.path(src, dst)).c_str());
      }
      fprintf(out, "%-16s%d\n", affinityOf(sys, src).c_str(), sys.numaOf(src));
    }
    fprintf(out,
            "\nLegend: X self; NV# NVLink (# bonded links, direct or via NVSwitch); NVB NVLink through a GPU;\n"
            "  PIX one PCIe switch; PXB several PCIe switches; PHB a CPU host bridge; SYS across NUMA domains\n");
  }
  if (n > 0) {
    fprintf(out, "\nNICs:\n");
    for (int i = 0; i < n; ++i) {
      const topo::Node& net = sys.net(i);
      fprintf(out, "  NIC%d  %-10s %-13s %6.0f Gb/s  port %d  %s%s  NUMA %d\n", i, net.netName.c_str(),
              nicBusId(sys, i).empty() ? "-" : nicBusId(sys, i).c_str(), net.speedMbps / 1000.0, net.port,
              net.rdma ? "RDMA" : "socket", net.gdr ? " GDR" : "", sys.numaOf(sys.netNodeId(i)));
    }
  }
  if (g > 0 && n > 0) {
    fprintf(out, "\nRails (each GPU's closest NIC):\n");
    for (int i = 0; i < g; ++i) {
      int rail = sys.railOf(i);
      if (rail >= 0)
        fprintf(out, "  GPU%d -> NIC%d (%s, %s, %.1f GB/s)\n", i, rail, sys.net(rail).netName.c_str(),
                topo::pathTypeName(sys.gpuToNet(i, rail).type), sys.gpuToNet(i, rail).bw);
    }
  }
  fprintf(out, "\nIntra-host model (%d local rank(s)%s): %s ring %.1f GB/s, port %.1f GB/s, up to %d channel(s)\n",
          r.model.localRanks, r.hostMemory ? ", host memory" : "", algo::linkClassName(r.model.intra), r.model.ringBw,
          r.model.portBw, r.model.maxChannels);
  for (size_t i = 0; i < r.rings.rings.size(); ++i) {
    const topo::Ring& ring = r.rings.rings[i];
    fprintf(out, "  ring %zu: ", i);
    for (int x : ring.gpus) fprintf(out, "%d ", x);
    fprintf(out, " (%.1f GB/s, worst hop %s)\n", ring.bw, topo::pathTypeName(ring.worst));
  }
  if (r.nodes > 1) {
    fprintf(out, "\nAcross %d hosts: %s %.1f GB/s per host over %d rail(s)\n", r.nodes,
            algo::linkClassName(r.model.inter), r.model.netBw, r.model.rails);
    for (const topo::RailRing& rr : r.railRings) {
      fprintf(out, "  rail NIC%d (%s): each host ", rr.net, sys.net(rr.net).netName.c_str());
      for (int x : rr.gpus) fprintf(out, "%d ", x);
      fprintf(out, "-> next host via NIC%d\n", rr.net);
    }
    printNetRails(out, r);
    for (int t = 0; t < 2; ++t) {
      fprintf(out, "  tree %d over hosts (root %d): ", t, r.trees.tree[t].root);
      for (int h = 0; h < r.nodes; ++h) fprintf(out, "%d->%d ", h, r.trees.tree[t].parent[static_cast<size_t>(h)]);
      fprintf(out, "\n");
    }
  }
  if (!r.model.notes.empty()) fprintf(out, "  notes: %s\n", r.model.notes.c_str());
  if (!r.tunerPlugin.empty()) fprintf(out, "  tuner plugin: %s (NCCL_TUNER_PLUGIN)\n", r.tunerPlugin.c_str());
  Collective last = Collective::kCount;
  for (const TuningRow& row : r.tuning) {
    if (row.coll != last) {
      last = row.coll;
      fprintf(out, "\nTuning %s, %d ranks on %d host(s):\n  %8s  %-16s %-7s %3s %8s %12s %10s\n",
              collectiveName(last), r.nranks, r.nodes, "size", "algorithm", "proto", "ch", "chunk",
              "predicted us", "busbw GB/s");
    }
    if (!row.error.empty()) {
      fprintf(out, "  %8s  %s\n", sizeName(row.bytes).c_str(), row.error.c_str());
      continue;
    }
    fprintf(out, "  %8s  %-16s %-7s %3d %8s %12.2f %10.2f\n", sizeName(row.bytes).c_str(),
            algorithmName(row.sel.algorithm), protocolName(row.sel.protocol), row.sel.channels,
            sizeName(row.sel.chunkBytes).c_str(), row.predictedUs, row.busBw);
  }
}

bool printPlan(FILE* out, const CollRequest& req, const JobContexts& job, int rank, bool hostMemory) {
  const PlanContext& ctx = job[rank];
  const size_t bytes = req.count * req.eltSize;
  fprintf(out, "%s of %zu bytes per rank (%zu x %zu-byte elements), %d ranks on %d host(s), %s, FIFOs %d x %s\n",
          collectiveName(req.coll), bytes, req.count, req.eltSize, job.nranks(), ctx.layout.nhosts(),
          hostMemory ? "host memory" : "GPU memory", ctx.depth, sizeName(ctx.slotBytes).c_str());
  if (req.coll == Collective::kBroadcast || req.coll == Collective::kReduce) fprintf(out, "Root: rank %d\n", req.root);
  SimReport sim = simulate(req, job);
  const Selection& sel = sim.selection;
  fprintf(out, "Selected: %s/%s, %d channel(s), chunk %s", algorithmName(sel.algorithm),
          protocolName(sel.protocol), sel.channels, sizeName(sel.chunkBytes).c_str());
  if (sim.predictedUs >= 0) fprintf(out, "; predicted %.2f us", sim.predictedUs);
  else fprintf(out, "; the cost model rules this algorithm out here (forced by NCCL_ALGO?)");
  fprintf(out, "\n");
  if (!sim.error.empty()) {
    fprintf(out, "Simulated: FAILED: %s\n", sim.error.c_str());
  } else {
    size_t steps = 0, sent = 0;
    for (const SimStats& st : sim.stats) {
      steps += st.steps;
      sent += st.bytesSent;
    }
    fprintf(out, "Simulated: every rank finished%s (%zu steps, %zu bytes sent in all)\n",
            sim.dataChecked ? " with the exact result" : "; sizes and order only, too large to check the data",
            steps, sent);
  }
  if (sim.plans.size() <= static_cast<size_t>(rank) || sim.stats.size() <= static_cast<size_t>(rank)) return false;
  const SimStats& mine = sim.stats[static_cast<size_t>(rank)];
  fprintf(out, "Plan of rank %d (%zu steps, %zu bytes sent, %zu received, scratch %zu bytes):\n", rank, mine.steps,
          mine.bytesSent, mine.bytesReceived, sim.plans[static_cast<size_t>(rank)].scratchBytes);
  fputs(sim.plans[static_cast<size_t>(rank)].str().c_str(), out);
  return sim.error.empty();
}

std::string toJson(const Report& r) {
  const topo::System& sys = *r.sys;
  int g = sys.gpuCount(), n = sys.netCount();
  std::vector<int> gi(static_cast<size_t>(g)), ni(static_cast<size_t>(n));
  for (int i = 0; i < g; ++i) gi[static_cast<size_t>(i)] = i;
  for (int i = 0; i < n; ++i) ni[static_cast<size_t>(i)] = i;
  std::string j = "{\n";
  j += "  \"source\": " + jsonString(sys.source()) + ",\n";
  j += strprintf("  \"nodes\": %d,\n  \"nranks\": %d,\n  \"host_memory\": %s,\n", r.nodes, r.nranks,
                 r.hostMemory ? "true" : "false");
  j += "  \"tuner_plugin\": " + jsonString(r.tunerPlugin) + ",\n";
  j += "  \"gpus\": " + jsonArray(gi, [&](int i) {
         return strprintf("{\"index\":%d,\"busid\":%s,\"numa\":%d,\"sm\":%d}", i, jsonString(sys.gpu(i).busId).c_str(),
                          sys.numaOf(sys.gpuNodeId(i)), sys.gpu(i).sm);
       }) + ",\n";
  j += "  \"nics\": " + jsonArray(ni, [&](int i) {
         const topo::Node& net = sys.net(i);
         return strprintf("{\"index\":%d,\"name\":%s,\"busid\":%s,\"speed_gbps\":%s,\"numa\":%d,\"rdma\":%s,\"gdr\":%s}", i,
                          jsonString(net.netName).c_str(), jsonString(nicBusId(sys, i)).c_str(),
                          jsonNumber(net.speedMbps / 1000.0).c_str(), sys.numaOf(sys.netNodeId(i)),
                          net.rdma ? "true" : "false", net.gdr ? "true" : "false");
       }) + ",\n";
  j += "  \"paths\": {\n    \"gpu_gpu\": " + jsonArray(gi, [&](int a) {
         return jsonArray(gi, [&](int b) { return jsonString(topo::pathTypeName(sys.gpuToGpu(a, b).type)); });
       });
  j += ",\n    \"gpu_nic\": " + jsonArray(gi, [&](int a) {
         return jsonArray(ni, [&](int b) { return jsonString(topo::pathTypeName(sys.gpuToNet(a, b).type)); });
       }) + "\n  },\n";
  std::vector<int> railed;
  for (int i = 0; i < g; ++i)
    if (sys.railOf(i) >= 0) railed.push_back(i);
  j += "  \"rails\": " + jsonArray(railed, [&](int i) {
         int rail = sys.railOf(i);
         return strprintf("{\"gpu\":%d,\"nic\":%d,\"nic_name\":%s,\"path\":%s}", i, rail,
                          jsonString(sys.net(rail).netName).c_str(),
                          jsonString(topo::pathTypeName(sys.gpuToNet(i, rail).type)).c_str());
       }) + ",\n";
  j += "  \"rings\": " + jsonArray(r.rings.rings, [&](const topo::Ring& ring) {
         return jsonArray(ring.gpus, [](int x) { return std::to_string(x); });
       }) + ",\n";
  j += "  \"ring_bw_gbps\": " + jsonArray(r.rings.rings, [](const topo::Ring& ring) { return jsonNumber(ring.bw); }) +
       ",\n";
  j += "  \"rail_rings\": " + jsonArray(r.railRings, [](const topo::RailRing& rr) {
         return strprintf("{\"nic\":%d,\"gpus\":%s}", rr.net,
                          jsonArray(rr.gpus, [](int x) { return std::to_string(x); }).c_str());
       }) + ",\n";
  std::vector<int> localRanks;
  if (r.nodes > 1 && sys.netCount() > 0)
    for (int o = 0; o < r.model.localRanks; ++o) localRanks.push_back(o);
  j += "  \"net_rails\": " + jsonArray(localRanks, [&](int o) {
         std::vector<int> ch;
         for (int c = 0; c < channelsUsed(r); ++c) ch.push_back(netRail(o, r.model.localRanks, c, sys.netCount()));
         return strprintf("{\"local_rank\":%d,\"channel_nics\":%s}", o,
                          jsonArray(ch, [](int x) { return std::to_string(x); }).c_str());
       }) + ",\n";
  std::vector<int> treeIdx;
  if (r.nodes > 1) treeIdx = {0, 1};
  j += "  \"trees\": " + jsonArray(treeIdx, [&](int t) {
         return strprintf("{\"root\":%d,\"parent\":%s}", r.trees.tree[t].root,
                          jsonArray(r.trees.tree[t].parent, [](int x) { return std::to_string(x); }).c_str());
       }) + ",\n";
  j += strprintf("  \"model\": {\"intra\":%s,\"ring_bw_gbps\":%s,\"inter\":%s,\"net_bw_gbps\":%s,\"rails\":%d},\n",
                 jsonString(algo::linkClassName(r.model.intra)).c_str(), jsonNumber(r.model.ringBw).c_str(),
                 jsonString(algo::linkClassName(r.model.inter)).c_str(), jsonNumber(r.model.netBw).c_str(),
                 r.model.rails);
  j += "  \"tuning\": [\n";
  for (size_t i = 0; i < r.tuning.size(); ++i) {
    const TuningRow& row = r.tuning[i];
    const char* sep = i + 1 < r.tuning.size() ? "," : "";
    if (!row.error.empty()) {
      j += strprintf("    {\"collective\":%s,\"bytes\":%zu,\"nranks\":%d,\"algorithm\":null,\"protocol\":null,"
                     "\"channels\":0,\"predicted_us\":null,\"error\":%s}%s\n",
                     jsonString(collectiveName(row.coll)).c_str(), row.bytes, row.nranks,
                     jsonString(row.error).c_str(), sep);
      continue;
    }
    j += strprintf("    {\"collective\":%s,\"bytes\":%zu,\"nranks\":%d,\"algorithm\":%s,\"protocol\":%s,"
                   "\"channels\":%d,\"chunk_bytes\":%zu,\"predicted_us\":%s,\"busbw_gbps\":%s}%s\n",
                   jsonString(collectiveName(row.coll)).c_str(), row.bytes, row.nranks,
                   jsonString(algorithmName(row.sel.algorithm)).c_str(),
                   jsonString(protocolName(row.sel.protocol)).c_str(), row.sel.channels, row.sel.chunkBytes,
                   jsonNumber(row.predictedUs).c_str(), jsonNumber(row.busBw).c_str(), sep);
  }
  j += "  ]\n}\n";
  return j;
}

}  // namespace loom::tools
