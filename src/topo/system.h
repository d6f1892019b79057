// Loom's model of one host: NUMA domains (CPUs), the PCI tree and its switches, GPUs,
// NVLink and NVSwitch, NICs and their network ports, joined by typed links with a
// bandwidth. Paths between devices are classified the way NCCL and `nvidia-smi topo -m`
// classify them (LOC NVL NVB PIX PXB PHB SYS NET) and carry their bottleneck bandwidth;
// rails are each GPU's closest network port.
//
// A System is built from NCCL's topology XML (topo_xml.h), whether that XML came from a
// file or from live discovery (discover.h), and is immutable after finalize().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topo/xml.h"

namespace loom::topo {

enum class NodeType : int { kCpu = 0, kPci, kGpu, kNic, kNet, kNvSwitch };
enum class LinkType : int { kLoc = 0, kNvl, kPci, kSys, kNet };

// Ordered from closest to farthest, as in NCCL: a path's type is the worst of its hops.
enum class PathType : int {
  kLoc = 0,  // the device itself
  kNvl,      // NVLink, directly or through NVSwitch
  kNvb,      // NVLink through an intermediate GPU
  kPix,      // at most one PCIe switch
  kPxb,      // several PCIe switches, no host bridge
  kPhb,      // through a CPU's PCIe host bridge
  kSys,      // across the SMP interconnect between NUMA domains
  kNet,      // across the network (another host)
  kDis,      // disconnected
};

const char* nodeTypeName(NodeType t);
const char* linkTypeName(LinkType t);
const char* pathTypeName(PathType t);
// Parses "PIX", "sys", ...; throws kInvalidArgument on an unknown name.
PathType parsePathType(const std::string& name);

// Bandwidths in GB/s (1e9 bytes/s), one direction. NVLink per-link figures follow NCCL's
// topo.h (effective data rate per link after protocol overhead, by compute capability):
// 18 H100 links x 20.6 = 371 GB/s is the ring bus bandwidth NVIDIA quotes for H100.
double nvlinkBwPerLink(int sm);
// PCIe: lanes x per-lane rate ("16.0 GT/s PCIe" = Gen4 -> 1.5 GB/s per lane after
// encoding/protocol), so Gen4 x16 = 24 GB/s and Gen5 x16 = 48 GB/s, as NCCL computes.
double pciBw(const std::string& linkSpeed, int width);
// CPU-to-CPU (QPI/UPI/xGMI) by vendor and model, NCCL's table.
double interCpuBw(const std::string& arch, const std::string& vendor, int family, int model);
constexpr double kLocalBw = 5000.0;  // inside one device

// "0000:18:00.0" from any accepted spelling ("00000000:18:00.0", upper case); false if
// the text is not domain:bus:device.function in hex.
bool normalizeBusId(const std::string& in, std::string* out);

struct NvLinkTarget {
  std::string target;  // remote PCI address as the file spells it
  int count = 0;       // bonded links
  std::string tclass;  // remote PCI class: 0x068000 NVSwitch, 0x0302xx/0x0300xx GPU, 0x068001 CPU
};

struct Link {
  int peer = -1;
  LinkType type = LinkType::kLoc;
  double bw = 0;    // GB/s
  int nvlinks = 0;  // bonded NVLinks on an NVL link
};

struct Node {
  NodeType type = NodeType::kPci;
  int parent = -1;            // enclosing <cpu>/<pci>/<nic> node, -1 for CPUs and NVSwitch
  std::string busId;          // normalized PCI address, "" where there is none
  XmlNode element;            // the XML element this node came from, children removed
  XmlNode sub;                // <gpu>/<net> sub-element for GPUs and network ports
  std::vector<XmlNode> extra; // other child elements (c2c, pcilink, ...) kept for dumps
  std::vector<Link> links;

  // kCpu
  int numaId = -1;
  std::string arch, vendor;
  int familyId = 0, modelId = 0;
  int cores = 0;  // CPUs in the affinity mask
  // kGpu
  int dev = -1, rank = -1, sm = 0;
  bool gdr = false;
  std::vector<NvLinkTarget> nvlinks;
  // kNet (a port of a NIC; its parent is the kNic node)
  std::string netName;
  double speedMbps = 0;
  int port = 0;
  bool rdma = false;  // verbs-capable (IB/RoCE), as opposed to a plain socket interface
  // kPci / device nodes
  double pciLinkBw = 0;  // the node's uplink, GB/s
};

struct Path {
  PathType type = PathType::kDis;
  double bw = 0;          // bottleneck, GB/s
  std::vector<int> hops;  // node ids from source to destination, both included
  int nvlinks = 0;        // NVLinks on an NVL path's narrowest hop (for "NV18")
};

class System {
 public:
  // Construction (used by topo_xml.cc and tests).
  int addNode(Node node);
  void connect(int a, int b, LinkType type, double bw, int nvlinks = 0);  // both directions
  void connectOneWay(int from, int to, LinkType type, double bw, int nvlinks = 0);
  // Computes device orderings, all GPU/NIC/NET paths and rails. Call once after building.
  void finalize();

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(int id) const { return nodes_.at(static_cast<size_t>(id)); }
  Node& mutableNode(int id) { return nodes_.at(static_cast<size_t>(id)); }  // builders only
  std::vector<int> nodesOf(NodeType type) const;

  // Devices as users number them: GPUs by (dev, bus id), network ports by (NIC bus id, port).
  int gpuCount() const { return static_cast<int>(gpus_.size()); }
  int netCount() const { return static_cast<int>(nets_.size()); }
  int cpuCount() const { return static_cast<int>(cpus_.size()); }
  const Node& gpu(int i) const { return node(gpus_.at(static_cast<size_t>(i))); }
  const Node& net(int i) const { return node(nets_.at(static_cast<size_t>(i))); }
  int gpuNodeId(int i) const { return gpus_.at(static_cast<size_t>(i)); }
  int netNodeId(int i) const { return nets_.at(static_cast<size_t>(i)); }
  int numaOf(int nodeId) const;  // NUMA id of the CPU above a device, -1 if none
  int totalCores() const;

  // Paths from GPUs and network ports to every node. Throws kInvalidArgument for other
  // sources (paths are only computed where the search and tuner need them).
  const Path& path(int fromNode, int toNode) const;
  const Path& gpuToGpu(int a, int b) const { return path(gpuNodeId(a), gpuNodeId(b)); }
  const Path& gpuToNet(int g, int n) const { return path(gpuNodeId(g), netNodeId(n)); }
  // Closest network port of GPU g (-1 without network ports); ties are spread so that
  // two GPUs behind one switch with two NICs get one each.
  int railOf(int g) const { return rails_.empty() ? -1 : rails_.at(static_cast<size_t>(g)); }
  bool hasNvSwitch() const;
  int minGpuSm() const;  // 0 without GPUs

  const std::string& source() const { return source_; }
  void setSource(std::string s) { source_ = std::move(s); }

 private:
  void computePathsFrom(int src);
  void computeRails();

  std::vector<Node> nodes_;
  std::vector<int> gpus_, nets_, cpus_;
  std::vector<int> pathIndex_;            // node id -> row in paths_, -1 if not a source
  std::vector<std::vector<Path>> paths_;  // [source row][destination node]
  std::vector<int> rails_;
  std::string source_ = "unknown";
};

}  // namespace loom::topo
