// Checks from Loom's topology discovery (the System a communicator would build, with
// NCCL_TOPO_FILE merged over it): GPUs, the links between them, and each GPU's NIC.
#include <map>

#include "base/error.h"
#include "doctor.h"
#include "topo/load.h"

namespace loom::doctor {
namespace {

std::string gpuName(const topo::System& sys, int g) {
  return "GPU" + std::to_string(sys.gpu(g).dev >= 0 ? sys.gpu(g).dev : g);
}

std::string netText(const topo::System& sys, int n) {
  const topo::Node& net = sys.net(n);
  std::string s = net.netName + " (" + (net.rdma ? "RDMA" : "socket");
  if (net.speedMbps > 0) s += ", " + jsonNumber(net.speedMbps / 1000) + " Gb/s";
  int numa = sys.numaOf(sys.netNodeId(n));
  if (numa >= 0) s += ", NUMA " + std::to_string(numa);
  return s + ")";
}

}  // namespace

Host loadHost() {
  Host h;
  try {
    h.sys = topo::loadLocalSystem();
  } catch (const Error& e) {
    h.topoError = e.what();
  }
  return h;
}

Check checkGpus(const Host& host) {
  Check c("gpus");
  if (!host.sys)
    return c.set(Status::kFail, "topology discovery failed: " + host.topoError,
                 "fix or unset NCCL_TOPO_FILE (loom-topo --topo-file F checks a file on its own)");
  const topo::System& sys = *host.sys;
  c.fact("count", jsonNumber(sys.gpuCount()));
  c.fact("topologySource", jsonString(sys.source()));
  if (sys.gpuCount() == 0)
    return c.set(Status::kSkip,
                 "no GPU found (topology: " + sys.source() + "): host-memory collectives only, GPU checks skipped");
  std::string list;
  for (int g = 0; g < sys.gpuCount(); ++g) {
    const topo::Node& n = sys.gpu(g);
    list += (g ? ", " : "") + gpuName(sys, g) + " " + n.busId;
    if (n.sm > 0) list += " sm" + std::to_string(n.sm);
    if (int numa = sys.numaOf(sys.gpuNodeId(g)); numa >= 0) list += " NUMA " + std::to_string(numa);
  }
  std::string found = std::to_string(sys.gpuCount()) + " GPU(s) (topology: " + sys.source() + "): " + list;
  if (sys.minGpuSm() == 0)
    return c.set(Status::kWarn, found + "; compute capability unknown (NVML did not load)",
                 "install the NVIDIA driver's libnvidia-ml.so.1 where this runs, so NVLinks and GPU models are seen");
  return c.set(Status::kPass, found);
}

// Pairs of GPUs by how they reach each other. Without any NVLink the PCIe paths are the
// hardware's and nothing can be fixed; with NVLink on some GPUs, a pair without it is a
// link down or a miscabled board.
Check checkNvLink(const Host& host) {
  Check c("nvlink");
  const int gpus = host.sys ? host.sys->gpuCount() : 0;
  if (gpus < 2) return c.set(Status::kSkip, gpus == 0 ? "no GPU found" : "one GPU: no GPU-to-GPU links to check");
  const topo::System& sys = *host.sys;
  std::map<topo::PathType, int> pairs;
  std::string worst;
  topo::PathType worstType = topo::PathType::kLoc;
  bool anyNvlink = false;
  for (int a = 0; a < gpus; ++a) {
    if (!sys.gpu(a).nvlinks.empty()) anyNvlink = true;
    for (int b = a + 1; b < gpus; ++b) {
      const topo::Path& p = sys.gpuToGpu(a, b);
      ++pairs[p.type];
      if (p.type > worstType) {
        worstType = p.type;
        worst = gpuName(sys, a) + "-" + gpuName(sys, b) + " " + topo::pathTypeName(p.type);
      }
    }
  }
  std::string summary;
  for (const auto& [type, n] : pairs) {
    summary += (summary.empty() ? "" : ", ") + std::to_string(n) + " " + topo::pathTypeName(type);
    c.fact(topo::pathTypeName(type), jsonNumber(n));
  }
  const int total = gpus * (gpus - 1) / 2;
  const int nvl = pairs[topo::PathType::kNvl] + pairs[topo::PathType::kNvb];
  std::string found = std::to_string(total) + " GPU pair(s): " + summary;
  if (nvl == total) return c.set(Status::kPass, found + (sys.hasNvSwitch() ? " (through NVSwitch)" : ""));
  if (!anyNvlink)
    return c.set(Status::kPass, found + "; no NVLink on this host, GPUs talk over PCIe (slowest pair " + worst + ")");
  return c.set(Status::kWarn, found + "; NVLink on this host but not between every pair (e.g. " + worst + ")",
               "check the links (nvidia-smi nvlink --status, nvidia-smi topo -m); a link down needs a GPU reset or "
               "a service call");
}

// Each GPU's closest network port (its rail): GPUDirect RDMA wants the NIC under the same
// PCIe switch (PIX/PXB); across the CPU (PHB/SYS) every transfer crosses the host bridge.
Check checkGpuNic(const Host& host) {
  Check c("gpu-nic");
  if (!host.sys) return c.set(Status::kSkip, "no topology (see gpus)");
  const topo::System& sys = *host.sys;
  std::string nics;
  for (int n = 0; n < sys.netCount(); ++n) nics += (n ? ", " : "") + netText(sys, n);
  c.fact("nics", jsonNumber(sys.netCount()));
  if (sys.gpuCount() == 0) return c.set(Status::kSkip, "no GPU found; NICs: " + (nics.empty() ? "none" : nics));
  if (sys.netCount() == 0)
    return c.set(Status::kWarn, "no network port in the topology: this host cannot reach others",
                 "check the NICs (ip link; ibstat) or NCCL_TOPO_FILE");
  std::string rails, far;
  int farCount = 0;
  for (int g = 0; g < sys.gpuCount(); ++g) {
    int n = sys.railOf(g);
    if (n < 0) continue;
    const topo::Path& p = sys.gpuToNet(g, n);
    std::string pair = gpuName(sys, g) + "->" + sys.net(n).netName + " " + topo::pathTypeName(p.type);
    rails += (rails.empty() ? "" : ", ") + pair;
    if (sys.net(n).rdma && p.type >= topo::PathType::kPhb) far += (far.empty() ? "" : ", ") + pair, ++farCount;
  }
  if (!far.empty())
    return c.set(Status::kWarn,
                 "closest RDMA NIC across the CPU for " + std::to_string(farCount) + " of " +
                     std::to_string(sys.gpuCount()) + " GPUs: " + far,
                 "on such hosts GPUDirect RDMA is slow or off (NCCL_NET_GDR_LEVEL); check that the NICs sit in "
                 "the GPUs' PCIe switches and that NCCL_IB_HCA does not exclude the close ones");
  return c.set(Status::kPass, "closest NIC per GPU: " + rails);
}

}  // namespace loom::doctor
