#include "topo/topo_xml.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <set>

#include "base/error.h"
#include "base/log.h"

namespace loom::topo {
namespace {

constexpr const char* kNvSwitchClass = "0x068000";
constexpr const char* kCpuClass = "0x068001";
constexpr size_t kMaxGpus = 256, kMaxNets = 256, kMaxNodes = 2048;

bool startsWith(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

int popcountHexMask(const std::string& mask) {
  int n = 0;
  for (char c : mask) {
    if (!isxdigit(static_cast<unsigned char>(c))) continue;
    int v = isdigit(static_cast<unsigned char>(c)) ? c - '0' : (tolower(c) - 'a' + 10);
    n += __builtin_popcount(static_cast<unsigned>(v));
  }
  return n;
}

XmlNode withoutChildren(const XmlNode& el) {
  XmlNode copy(el.name());
  for (const auto& [k, v] : el.attrs()) copy.set(k, v);
  return copy;
}

// Port speeds are Mb/s in the file (400000 = NDR); GB/s on the link.
double speedToBw(double mbps) { return mbps / 8000.0; }

bool looksRdma(const XmlNode& net) {
  const std::string* guid = net.attr("guid");
  if (guid && strtoull(guid->c_str(), nullptr, 16) != 0) return true;
  const std::string name = net.attrOr("name", "");
  for (const char* p : {"mlx", "ib", "bnxt_re", "irdma", "efa", "erdma", "hfi", "qedr", "rdma"})
    if (startsWith(name, p)) return true;
  return false;
}

class Builder {
 public:
  System build(const XmlNode& root) {
    if (root.name() != "system")
      LOOM_THROW(kInvalidArgument, "topology XML root is <%s>, expected <system version=\"1\">",
                 root.name().c_str());
    long long version = root.intAttr("version", -1);
    if (version != 1)
      LOOM_THROW(kInvalidArgument, "topology XML <system version=\"%s\"> is not version 1",
                 root.attrOr("version", "(missing)").c_str());
    for (const XmlNode& c : root.children()) {
      if (c.name() == "cpu") addCpu(c);
      // Other top-level elements (NCCL writes none today) carry nothing Loom models.
    }
    // Bounds keep path computation (quadratic in devices) predictable on hostile files; a
    // real host is far below them (an NVL72 tray has 4 GPUs, a DGX 8).
    size_t nets = sys_.nodesOf(NodeType::kNet).size();
    if (gpus_.size() > kMaxGpus || nets > kMaxNets || sys_.nodes().size() > kMaxNodes)
      LOOM_THROW(kInvalidArgument, "topology XML describes %zu GPUs, %zu network ports and %zu nodes; Loom models "
                 "one host with at most %zu GPUs, %zu ports and %zu nodes",
                 gpus_.size(), nets, sys_.nodes().size(), kMaxGpus, kMaxNets, kMaxNodes);
    connectCpus();
    addNvLinks();
    sys_.finalize();
    return std::move(sys_);
  }

 private:
  void addCpu(const XmlNode& el) {
    Node n;
    n.type = NodeType::kCpu;
    n.element = withoutChildren(el);
    n.numaId = static_cast<int>(el.intAttr("numaid", -1));
    n.arch = el.attrOr("arch", "");
    n.vendor = el.attrOr("vendor", "");
    n.familyId = static_cast<int>(el.intAttr("familyid", 0));
    n.modelId = static_cast<int>(el.intAttr("modelid", 0));
    n.cores = popcountHexMask(el.attrOr("affinity", ""));
    for (int c : cpus_) {
      if (sys_.node(c).numaId == n.numaId)
        LOOM_THROW(kInvalidArgument, "topology XML lists <cpu numaid=\"%d\"> twice", n.numaId);
    }
    int id = sys_.addNode(std::move(n));
    cpus_.push_back(id);
    for (const XmlNode& c : el.children()) {
      if (c.name() == "pci") {
        addPci(c, id);
      } else if (c.name() == "nic") {
        // A NIC with no PCI address (socket interfaces, virtual functions the file hides).
        int nic = addNic(XmlNode("nic"), c, id, "");
        sys_.connect(id, nic, LinkType::kPci, kLocalBw);
      } else {
        extraOf(id).push_back(c);
      }
    }
  }

  std::vector<XmlNode>& extraOf(int id) { return sys_.mutableNode(id).extra; }

  void addPci(const XmlNode& el, int parent) {
    const std::string raw = el.attrOr("busid", "");
    std::string busId;
    if (!normalizeBusId(raw, &busId))
      LOOM_THROW(kInvalidArgument, "topology XML <pci busid=\"%s\">: not a PCI address (dddd:bb:dd.f)",
                 raw.c_str());
    if (!busIds_.insert(busId).second)
      LOOM_THROW(kInvalidArgument, "topology XML lists PCI device %s twice", busId.c_str());
    const std::string cls = el.attrOr("class", "");
    double bw = pciBw(el.attrOr("link_speed", ""), static_cast<int>(el.intAttr("link_width", 16)));
    const XmlNode* gpu = el.child("gpu");
    const XmlNode* nic = el.child("nic");
    XmlNode element = withoutChildren(el);
    element.set("busid", busId);

    int id;
    if (gpu || startsWith(cls, "0x03")) {
      id = addGpu(std::move(element), gpu, parent, busId, bw);
    } else if (nic || startsWith(cls, "0x02")) {
      id = addNic(std::move(element), nic ? *nic : XmlNode("nic"), parent, busId);
      sys_.mutableNode(id).pciLinkBw = bw;
    } else {
      Node n;
      n.type = NodeType::kPci;
      n.parent = parent;
      n.busId = busId;
      n.element = std::move(element);
      n.pciLinkBw = bw;
      id = sys_.addNode(std::move(n));
    }
    sys_.connect(parent, id, LinkType::kPci, bw);
    for (const XmlNode& c : el.children()) {
      if (c.name() == "pci") {
        addPci(c, id);
      } else if (c.name() != "gpu" && c.name() != "nic") {
        extraOf(id).push_back(c);
      }
    }
  }

  int addGpu(XmlNode element, const XmlNode* gpu, int parent, const std::string& busId, double bw) {
    Node n;
    n.type = NodeType::kGpu;
    n.parent = parent;
    n.busId = busId;
    n.element = std::move(element);
    n.pciLinkBw = bw;
    if (gpu) {
      n.dev = static_cast<int>(gpu->intAttr("dev", -1));
      n.rank = static_cast<int>(gpu->intAttr("rank", -1));
      n.sm = static_cast<int>(gpu->intAttr("sm", 0));
      n.gdr = gpu->intAttr("gdr", 0) != 0;
      n.sub = withoutChildren(*gpu);
      for (const XmlNode& c : gpu->children()) {
        if (c.name() == "nvlink") {
          NvLinkTarget t;
          t.target = c.attrOr("target", "");
          t.count = static_cast<int>(c.intAttr("count", 0));
          t.tclass = c.attrOr("tclass", kNvSwitchClass);
          if (t.count <= 0)
            LOOM_THROW(kInvalidArgument, "GPU %s: <nvlink target=\"%s\"> has no positive count",
                       busId.c_str(), t.target.c_str());
          n.nvlinks.push_back(std::move(t));
        } else {
          n.sub.addChild(c);  // c2c and future sub-elements, kept for the dump
        }
      }
    } else {
      n.sub = XmlNode("gpu");
    }
    int id = sys_.addNode(std::move(n));
    gpus_.push_back(id);
    return id;
  }

  int addNic(XmlNode element, const XmlNode& nic, int parent, const std::string& busId) {
    Node n;
    n.type = NodeType::kNic;
    n.parent = parent;
    n.busId = busId;
    n.element = std::move(element);
    n.sub = withoutChildren(nic);
    int id = sys_.addNode(std::move(n));
    for (const XmlNode& c : nic.children()) {
      if (c.name() != "net") {
        // Kept inside <nic> for the dump: written anywhere else it could turn into a device.
        sys_.mutableNode(id).sub.addChild(c);
        continue;
      }
      Node net;
      net.type = NodeType::kNet;
      net.parent = id;
      net.sub = c;
      net.netName = c.attrOr("name", "");
      if (net.netName.empty())
        LOOM_THROW(kInvalidArgument, "topology XML: <net> under NIC %s has no name",
                   busId.empty() ? "(no bus id)" : busId.c_str());
      net.speedMbps = c.doubleAttr("speed", 0);
      if (net.speedMbps <= 0) net.speedMbps = 10000;  // NCCL's assumption for unknown speeds
      net.port = static_cast<int>(c.intAttr("port", 1));
      net.gdr = c.intAttr("gdr", 0) != 0;
      net.rdma = looksRdma(c);
      double bw = speedToBw(net.speedMbps);
      int netId = sys_.addNode(std::move(net));
      sys_.connect(id, netId, LinkType::kNet, bw);
    }
    return id;
  }

  void connectCpus() {
    for (size_t i = 0; i < cpus_.size(); ++i) {
      for (size_t j = i + 1; j < cpus_.size(); ++j) {
        const Node& a = sys_.node(cpus_[i]);
        double bw = interCpuBw(a.arch, a.vendor, a.familyId, a.modelId);
        sys_.connect(cpus_[i], cpus_[j], LinkType::kSys, bw);
      }
    }
  }

  int cpuAbove(int id) {
    for (; id >= 0; id = sys_.node(id).parent)
      if (sys_.node(id).type == NodeType::kCpu) return id;
    return -1;
  }

  void addNvLinks() {
    std::map<std::string, int> gpuByBus;
    for (int g : gpus_) gpuByBus[sys_.node(g).busId] = g;
    int nvSwitch = -1;
    for (int g : gpus_) {
      const Node& gn = sys_.node(g);
      double perLink = nvlinkBwPerLink(gn.sm);
      for (const NvLinkTarget& t : gn.nvlinks) {
        double bw = t.count * perLink;
        if (startsWith(t.tclass, "0x03")) {
          std::string bus;
          auto it = normalizeBusId(t.target, &bus) ? gpuByBus.find(bus) : gpuByBus.end();
          if (it == gpuByBus.end()) {
            LOOM_WARN("topology: GPU %s has an NVLink to %s, which is not a GPU in this topology; ignored",
                      gn.busId.c_str(), t.target.c_str());
            continue;
          }
          // Each GPU lists its own side of a GPU-GPU bond, so one direction per row.
          if (it->second != g) sys_.connectOneWay(g, it->second, LinkType::kNvl, bw, t.count);
        } else if (t.tclass == kCpuClass) {
          int cpu = cpuAbove(g);
          if (cpu >= 0) sys_.connect(g, cpu, LinkType::kNvl, bw, t.count);
        } else {
          if (nvSwitch < 0) {
            Node n;
            n.type = NodeType::kNvSwitch;
            nvSwitch = sys_.addNode(std::move(n));
          }
          sys_.connect(g, nvSwitch, LinkType::kNvl, bw, t.count);
        }
      }
    }
  }

  System sys_;
  std::vector<int> cpus_, gpus_;
  std::set<std::string> busIds_;
};

// ---- System -> XML ----

void writeDevice(const System& sys, int id, XmlNode& parent, const std::vector<std::vector<int>>& kids);

void writeChildren(const System& sys, int id, XmlNode& el, const std::vector<std::vector<int>>& kids) {
  for (int c : kids[static_cast<size_t>(id)]) writeDevice(sys, c, el, kids);
  for (const XmlNode& x : sys.node(id).extra) el.addChild(x);
}

void writeNic(const System& sys, int id, XmlNode& nicEl, const std::vector<std::vector<int>>& kids) {
  for (int c : kids[static_cast<size_t>(id)]) {
    const Node& net = sys.node(c);
    if (net.type == NodeType::kNet) nicEl.addChild(net.sub);
  }
}

void writeDevice(const System& sys, int id, XmlNode& parent, const std::vector<std::vector<int>>& kids) {
  const Node& n = sys.node(id);
  switch (n.type) {
    case NodeType::kGpu: {
      XmlNode& el = parent.addChild(n.element);
      XmlNode gpu = n.sub;
      std::vector<XmlNode> other = gpu.children();
      gpu.children().clear();
      for (const NvLinkTarget& t : n.nvlinks) {
        XmlNode& l = gpu.addChild("nvlink");
        l.set("target", t.target);
        l.set("count", std::to_string(t.count));
        l.set("tclass", t.tclass);
      }
      for (XmlNode& o : other) gpu.addChild(std::move(o));
      // A GPU known only by its PCI class (Azure-style files) stays that way in the dump; one
      // whose class does not say so keeps its (empty) <gpu>, or it would load back as PCI.
      if (!gpu.attrs().empty() || !gpu.children().empty() ||
          !startsWith(el.attrOr("class", ""), "0x03"))
        el.addChild(std::move(gpu));
      writeChildren(sys, id, el, kids);
      break;
    }
    case NodeType::kNic: {
      if (n.busId.empty()) {
        XmlNode& nic = parent.addChild(n.sub);
        writeNic(sys, id, nic, kids);
      } else {
        XmlNode& el = parent.addChild(n.element);
        XmlNode nic = n.sub;
        writeNic(sys, id, nic, kids);
        if (!nic.attrs().empty() || !nic.children().empty()) el.addChild(std::move(nic));
        // PCI devices listed below the NIC's own <pci> element.
        for (int c : kids[static_cast<size_t>(id)]) {
          if (sys.node(c).type != NodeType::kNet) writeDevice(sys, c, el, kids);
        }
        for (const XmlNode& x : n.extra) el.addChild(x);
      }
      break;
    }
    case NodeType::kPci: {
      XmlNode& el = parent.addChild(n.element);
      writeChildren(sys, id, el, kids);
      break;
    }
    default:
      break;
  }
}

bool hasBus(const XmlNode& n, std::string* bus) {
  const std::string* b = n.attr("busid");
  return n.name() == "pci" && b && normalizeBusId(*b, bus);
}

XmlNode* findPci(XmlNode& n, const std::string& bus) {
  std::string b;
  if (hasBus(n, &b) && b == bus) return &n;
  for (XmlNode& c : n.children())
    if (XmlNode* f = findPci(c, bus)) return f;
  return nullptr;
}

void mergeAttrs(XmlNode& dst, const XmlNode& src) {
  for (const auto& [k, v] : src.attrs()) dst.setIfUnset(k, v);
}

void mergeInto(XmlNode& fileRoot, XmlNode& dst, const XmlNode& src) {
  bool fileHasNvlinks = dst.name() == "gpu" && dst.child("nvlink") != nullptr;
  for (const XmlNode& c : src.children()) {
    std::string bus;
    if (hasBus(c, &bus)) {
      XmlNode* target = findPci(fileRoot, bus);
      if (!target) {
        target = &dst.addChild(withoutChildren(c));
        target->set("busid", bus);
      } else {
        mergeAttrs(*target, c);
      }
      mergeInto(fileRoot, *target, c);
    } else if (c.name() == "cpu") {
      XmlNode* t = dst.childWith("cpu", "numaid", c.attrOr("numaid", "-1"));
      if (!t) t = &dst.addChild(withoutChildren(c));
      else mergeAttrs(*t, c);
      mergeInto(fileRoot, *t, c);
    } else if (c.name() == "gpu" || c.name() == "nic") {
      XmlNode* t = dst.child(c.name());
      if (!t) t = &dst.addChild(withoutChildren(c));
      else mergeAttrs(*t, c);
      mergeInto(fileRoot, *t, c);
    } else if (c.name() == "net") {
      XmlNode* t = dst.childWith("net", "name", c.attrOr("name", ""));
      if (!t) dst.addChild(c);
      else mergeAttrs(*t, c);
    } else if (c.name() == "nvlink") {
      if (!fileHasNvlinks) dst.addChild(c);
    } else if (!dst.child(c.name())) {
      dst.addChild(c);
    }
  }
}

}  // namespace

System systemFromXml(const XmlNode& root) { return Builder().build(root); }

XmlNode systemToXml(const System& sys) {
  XmlNode root("system");
  root.set("version", "1");
  std::vector<std::vector<int>> kids(sys.nodes().size());
  for (size_t i = 0; i < sys.nodes().size(); ++i) {
    const Node& n = sys.nodes()[i];
    if (n.parent >= 0) kids[static_cast<size_t>(n.parent)].push_back(static_cast<int>(i));
  }
  // Keep siblings in PCI bus order, as NCCL does, so dumps diff cleanly.
  for (auto& k : kids) {
    std::stable_sort(k.begin(), k.end(), [&](int a, int b) {
      const Node& x = sys.node(a);
      const Node& y = sys.node(b);
      if (x.type == NodeType::kNet || y.type == NodeType::kNet) return false;
      return x.busId < y.busId;
    });
  }
  std::vector<int> cpus = sys.nodesOf(NodeType::kCpu);
  std::stable_sort(cpus.begin(), cpus.end(),
                   [&](int a, int b) { return sys.node(a).numaId < sys.node(b).numaId; });
  for (int c : cpus) {
    XmlNode& el = root.addChild(sys.node(c).element);
    writeChildren(sys, c, el, kids);
  }
  return root;
}

XmlNode mergeXml(XmlNode file, const XmlNode& detected) {
  if (file.name() != "system" || detected.name() != "system")
    LOOM_THROW(kInvalidArgument, "mergeXml: both trees must be <system> documents");
  mergeInto(file, file, detected);
  return file;
}

}  // namespace loom::topo
