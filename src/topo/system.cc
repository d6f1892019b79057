#include "topo/system.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "base/error.h"

namespace loom::topo {

const char* nodeTypeName(NodeType t) {
  switch (t) {
    case NodeType::kCpu: return "CPU";
    case NodeType::kPci: return "PCI";
    case NodeType::kGpu: return "GPU";
    case NodeType::kNic: return "NIC";
    case NodeType::kNet: return "NET";
    case NodeType::kNvSwitch: return "NVS";
  }
  return "?";
}

const char* linkTypeName(LinkType t) {
  switch (t) {
    case LinkType::kLoc: return "LOC";
    case LinkType::kNvl: return "NVL";
    case LinkType::kPci: return "PCI";
    case LinkType::kSys: return "SYS";
    case LinkType::kNet: return "NET";
  }
  return "?";
}

const char* pathTypeName(PathType t) {
  switch (t) {
    case PathType::kLoc: return "LOC";
    case PathType::kNvl: return "NVL";
    case PathType::kNvb: return "NVB";
    case PathType::kPix: return "PIX";
    case PathType::kPxb: return "PXB";
    case PathType::kPhb: return "PHB";
    case PathType::kSys: return "SYS";
    case PathType::kNet: return "NET";
    case PathType::kDis: return "DIS";
  }
  return "?";
}

PathType parsePathType(const std::string& name) {
  std::string up = name;
  for (char& c : up) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  for (int t = 0; t <= static_cast<int>(PathType::kDis); ++t)
    if (up == pathTypeName(static_cast<PathType>(t))) return static_cast<PathType>(t);
  LOOM_THROW(kInvalidArgument, "unknown path type '%s' (expected LOC, NVL, NVB, PIX, PXB, PHB, SYS, NET or DIS)",
             name.c_str());
}

double nvlinkBwPerLink(int sm) {
  if (sm >= 100) return 40.1;
  if (sm >= 90) return 20.6;
  if (sm == 86) return 12.0;
  if (sm >= 80) return 20.0;
  if (sm >= 70) return 20.0;
  if (sm >= 60) return 18.0;
  return 20.0;  // unknown generation: assume the common Ampere/Volta rate
}

double pciBw(const std::string& linkSpeed, int width) {
  // Per-lane rate in units of 100 Mb/s after 128b/130b (or 8b/10b) encoding and TLP overhead,
  // as NCCL tabulates it; an unreadable speed counts as Gen3.
  double perLane = 60;
  double gts = atof(linkSpeed.c_str());
  if (gts >= 63) perLane = 480;
  else if (gts >= 31) perLane = 240;
  else if (gts >= 15) perLane = 120;
  else if (gts >= 7.9) perLane = 60;
  else if (gts >= 4.9) perLane = 30;
  else if (gts >= 2.4) perLane = 15;
  if (width <= 0) width = 16;  // sysfs sometimes reports 0 behind virtualised bridges
  return width * perLane / 80.0;
}

double interCpuBw(const std::string& arch, const std::string& vendor, int family, int model) {
  if (arch == "ppc64") return 32.0;
  if (arch == "arm64") return 6.0;
  if (vendor == "GenuineIntel") {
    if (family == 6 && model >= 0xCF) return 40.0;  // Emerald Rapids
    if (family == 6 && model >= 0x8F) return 22.0;  // Sapphire Rapids
    if (family == 6 && model >= 0x55) return 10.0;  // Skylake .. Ice Lake
    return 6.0;                                     // Broadwell and older
  }
  if (vendor == "AuthenticAMD") return 16.0;
  if (vendor == "CentaurHauls" || vendor == "  Shanghai  ") return 6.0;
  return kLocalBw;  // unknown CPU: do not invent a bottleneck
}

bool normalizeBusId(const std::string& in, std::string* out) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  int consumed = 0;
  if (sscanf(in.c_str(), "%x:%x:%x.%x%n", &domain, &bus, &dev, &fn, &consumed) != 4 ||
      static_cast<size_t>(consumed) != in.size())
    return false;
  if (bus > 0xff || dev > 0x1f || fn > 7 || domain > 0xffff) return false;
  char buf[32];
  snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain, bus, dev, fn);
  *out = buf;
  return true;
}

int System::addNode(Node node) {
  nodes_.push_back(std::move(node));
  return static_cast<int>(nodes_.size()) - 1;
}

void System::connectOneWay(int from, int to, LinkType type, double bw, int nvlinks) {
  LOOM_ASSERT(from >= 0 && to >= 0 && from < static_cast<int>(nodes_.size()) &&
              to < static_cast<int>(nodes_.size()) && from != to);
  // Parallel declarations (two <nvlink> rows to one switch) add up into one link.
  for (Link& l : nodes_[static_cast<size_t>(from)].links) {
    if (l.peer == to && l.type == type) {
      l.bw += bw;
      l.nvlinks += nvlinks;
      return;
    }
  }
  nodes_[static_cast<size_t>(from)].links.push_back({to, type, bw, nvlinks});
}

void System::connect(int a, int b, LinkType type, double bw, int nvlinks) {
  connectOneWay(a, b, type, bw, nvlinks);
  connectOneWay(b, a, type, bw, nvlinks);
}

std::vector<int> System::nodesOf(NodeType type) const {
  std::vector<int> out;
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].type == type) out.push_back(static_cast<int>(i));
  return out;
}

int System::numaOf(int nodeId) const {
  for (int id = nodeId; id >= 0; id = node(id).parent)
    if (node(id).type == NodeType::kCpu) return node(id).numaId;
  return -1;
}

int System::totalCores() const {
  int n = 0;
  for (int c : cpus_) n += node(c).cores;
  return n;
}

bool System::hasNvSwitch() const {
  for (const Node& n : nodes_)
    if (n.type == NodeType::kNvSwitch) return true;
  return false;
}

int System::minGpuSm() const {
  int sm = 0;
  for (int g : gpus_) {
    int s = node(g).sm;
    if (s > 0 && (sm == 0 || s < sm)) sm = s;
  }
  return sm;
}

void System::finalize() {
  gpus_ = nodesOf(NodeType::kGpu);
  nets_ = nodesOf(NodeType::kNet);
  cpus_ = nodesOf(NodeType::kCpu);
  // GPUs follow their NVML/CUDA index where the file gives one (CUDA_DEVICE_ORDER=PCI_BUS_ID
  // is the same order), then bus id; ports follow their NIC's bus id and port number.
  std::stable_sort(gpus_.begin(), gpus_.end(), [&](int a, int b) {
    const Node& x = node(a);
    const Node& y = node(b);
    int dx = x.dev < 0 ? 1 << 30 : x.dev, dy = y.dev < 0 ? 1 << 30 : y.dev;
    return std::tie(dx, x.busId) < std::tie(dy, y.busId);
  });
  auto nicBus = [&](int net) {
    int p = node(net).parent;
    return p >= 0 ? node(p).busId : std::string();
  };
  std::stable_sort(nets_.begin(), nets_.end(), [&](int a, int b) {
    return std::make_tuple(nicBus(a), node(a).port, node(a).netName) <
           std::make_tuple(nicBus(b), node(b).port, node(b).netName);
  });
  std::stable_sort(cpus_.begin(), cpus_.end(),
                   [&](int a, int b) { return node(a).numaId < node(b).numaId; });

  pathIndex_.assign(nodes_.size(), -1);
  paths_.clear();
  for (int src : gpus_) computePathsFrom(src);
  for (int src : nets_) computePathsFrom(src);
  computeRails();
}

const Path& System::path(int fromNode, int toNode) const {
  if (fromNode < 0 || fromNode >= static_cast<int>(pathIndex_.size()) ||
      pathIndex_[static_cast<size_t>(fromNode)] < 0)
    LOOM_THROW(kInvalidArgument, "no paths computed from node %d (paths start at GPUs and network ports)",
               fromNode);
  const auto& row = paths_[static_cast<size_t>(pathIndex_[static_cast<size_t>(fromNode)])];
  if (toNode < 0 || toNode >= static_cast<int>(row.size()))
    LOOM_THROW(kInvalidArgument, "path destination %d out of range", toNode);
  return row[static_cast<size_t>(toNode)];
}

}  // namespace loom::topo
