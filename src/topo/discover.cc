#include "topo/discover.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/utsname.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/log.h"
#include "topo/nvml.h"
#include "topo/system.h"

namespace loom::topo {
namespace {

std::string trim(std::string s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// Small sysfs files only; a missing or unreadable file reads as "".
std::string readSmall(const std::string& path) {
  std::ifstream f(path);
  if (!f) return "";
  std::string s(4096, '\0');
  f.read(s.data(), static_cast<std::streamsize>(s.size()));
  s.resize(static_cast<size_t>(f.gcount()));
  return trim(s);
}

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = opendir(path.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string realPath(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? std::string(buf) : std::string();
}

bool isBdf(const std::string& s) {
  std::string norm;
  return s.size() == 12 && normalizeBusId(s, &norm);
}

std::vector<std::string> components(const std::string& path) {
  std::vector<std::string> out;
  std::stringstream ss(path);
  std::string c;
  while (std::getline(ss, c, '/'))
    if (!c.empty()) out.push_back(c);
  return out;
}

// Bus ids from a device up to the root port, read off its sysfs path
// (/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/...). The device is the BDF nearest
// the end, so a net or IB class device resolves to its PCI function.
std::vector<std::string> pciChain(const std::string& sysPath) {
  std::vector<std::string> parts = components(sysPath);
  int i = static_cast<int>(parts.size()) - 1;
  while (i >= 0 && !isBdf(parts[static_cast<size_t>(i)])) --i;
  std::vector<std::string> chain;
  for (; i >= 0 && isBdf(parts[static_cast<size_t>(i)]); --i) {
    std::string norm;
    normalizeBusId(parts[static_cast<size_t>(i)], &norm);
    chain.push_back(norm);
  }
  return chain;
}

std::string hexMaskFromList(const std::string& list) {
  // "0-3,8" -> NCCL's affinity format: 32-bit hex words, most significant first.
  std::vector<uint32_t> words;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int lo = 0, hi = 0;
    if (sscanf(item.c_str(), "%d-%d", &lo, &hi) != 2) hi = lo = atoi(item.c_str());
    for (int c = lo; c <= hi && c >= 0 && c < 65536; ++c) {
      size_t w = static_cast<size_t>(c / 32);
      if (words.size() <= w) words.resize(w + 1, 0);
      words[w] |= 1u << (c % 32);
    }
  }
  if (words.empty()) words.push_back(0);
  std::string out;
  for (size_t w = words.size(); w-- > 0;) {
    char buf[16];
    snprintf(buf, sizeof buf, "%08x", words[w]);
    if (!out.empty()) out += ',';
    out += buf;
  }
  return out;
}

struct PciEntry {
  XmlNode element{"pci"};
  std::string parent;                 // bus id of the enclosing switch, "" = the CPU
  int numa = -1;
  std::vector<XmlNode> subs;          // <gpu> or <nic>
};

class Detector {
 public:
  explicit Detector(const DetectOptions& o) : root_(o.root), useNvml_(o.useNvml) {}

  XmlNode run() {
    detectCpus();
    gdr_ = exists(root_ + "/sys/kernel/mm/memory_peers/nv_mem/version") ||
           exists(root_ + "/sys/module/nvidia_peermem") || exists(root_ + "/sys/module/nv_peer_mem");
    detectGpus();
    detectRdma();
    detectEthernet();
    return assemble();
  }

 private:
  std::string sys(const std::string& rel) const { return root_ + "/sys/" + rel; }

  void detectCpus() {
    std::string vendor, family, model;
    std::ifstream info(root_ + "/proc/cpuinfo");
    for (std::string line; std::getline(info, line);) {
      if (line.empty()) break;  // first processor is enough
      size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string k = trim(line.substr(0, colon)), v = trim(line.substr(colon + 1));
      if (k == "vendor_id") vendor = v;
      else if (k == "cpu family") family = v;
      else if (k == "model") model = v;
    }
    std::string arch;
    struct utsname u;
    if (uname(&u) == 0) {
      std::string m = u.machine;
      arch = m == "aarch64" ? "arm64" : (m.rfind("ppc64", 0) == 0 ? "ppc64" : m);
    }
    auto make = [&](int numa, const std::string& affinity) {
      XmlNode cpu("cpu");
      cpu.set("numaid", std::to_string(numa));
      cpu.set("affinity", affinity);
      if (!arch.empty()) cpu.set("arch", arch);
      if (!vendor.empty()) cpu.set("vendor", vendor);
      if (!family.empty()) cpu.set("familyid", family);
      if (!model.empty()) cpu.set("modelid", model);
      cpus_[numa] = std::move(cpu);
    };
    for (const std::string& d : listDir(sys("devices/system/node"))) {
      if (d.rfind("node", 0) != 0 || d.size() == 4) continue;
      char* end = nullptr;
      long numa = strtol(d.c_str() + 4, &end, 10);
      if (*end != '\0') continue;
      std::string list = readSmall(sys("devices/system/node/" + d + "/cpulist"));
      if (list.empty()) continue;  // memory-only node (CXL, HBM): no CPUs to bind to
      make(static_cast<int>(numa), hexMaskFromList(list));
    }
    if (cpus_.empty()) {
      std::string online = readSmall(sys("devices/system/cpu/online"));
      make(0, hexMaskFromList(online.empty() ? "0" : online));
    }
  }

  int numaOf(const std::string& bus) {
    std::string v = readSmall(sys("bus/pci/devices/" + bus + "/numa_node"));
    int numa = v.empty() ? -1 : atoi(v.c_str());
    if (cpus_.count(numa)) return numa;
    return cpus_.begin()->first;  // single-node VMs report -1
  }

  // Creates the entries for a device and the switches above it. NCCL keeps one <pci> per
  // switch (its upstream port) and skips the downstream and root ports, so the parent of a
  // device is two BDFs up, and a device without such an ancestor hangs off its CPU.
  void addChain(const std::vector<std::string>& chain) {
    if (chain.empty()) return;
    int numa = numaOf(chain[0]);
    for (size_t i = 0; i < chain.size(); i += 2) {
      const std::string& bus = chain[i];
      std::string parent = i + 2 < chain.size() ? chain[i + 2] : "";
      auto [it, fresh] = pci_.try_emplace(bus);
      if (!fresh) break;  // the rest of the chain is already known
      PciEntry& e = it->second;
      e.parent = parent;
      e.numa = numa;
      e.element.set("busid", bus);
      std::string dir = sys("bus/pci/devices/" + bus);
      for (const char* a : {"class", "vendor", "device", "subsystem_vendor", "subsystem_device"}) {
        std::string v = readSmall(dir + "/" + a);
        if (!v.empty()) e.element.set(a, v);
      }
      std::string speed = readSmall(dir + "/max_link_speed");
      std::string width = readSmall(dir + "/max_link_width");
      // The link runs at the slower of the device and the port above it.
      if (i + 1 < chain.size()) {
        std::string up = sys("bus/pci/devices/" + chain[i + 1]);
        std::string upSpeed = readSmall(up + "/max_link_speed");
        std::string upWidth = readSmall(up + "/max_link_width");
        if (!upSpeed.empty() && (speed.empty() || atof(upSpeed.c_str()) < atof(speed.c_str()))) speed = upSpeed;
        if (!upWidth.empty() && (width.empty() || atoi(upWidth.c_str()) < atoi(width.c_str()))) width = upWidth;
      }
      if (!speed.empty()) e.element.set("link_speed", speed);
      if (!width.empty()) e.element.set("link_width", width);
    }
  }

  std::string classOf(const std::string& bus) { return readSmall(sys("bus/pci/devices/" + bus + "/class")); }

  void detectGpus() {
    std::vector<std::string> found;
    for (const std::string& bus : listDir(sys("bus/pci/devices"))) {
      std::string cls = classOf(bus);
      if (readSmall(sys("bus/pci/devices/" + bus + "/vendor")) != "0x10de") continue;
      if (cls.rfind("0x0302", 0) != 0 && cls.rfind("0x0300", 0) != 0) continue;
      std::string norm;
      if (normalizeBusId(bus, &norm)) found.push_back(norm);
    }
    std::map<std::string, NvmlGpu> nvml;
    if (useNvml_) {
      std::vector<NvmlGpu> gpus;
      std::string why;
      if (queryNvml(&gpus, &why)) {
        for (NvmlGpu& g : gpus) {
          if (std::find(found.begin(), found.end(), g.busId) == found.end()) found.push_back(g.busId);
          nvml[g.busId] = std::move(g);
        }
      } else {
        LOOM_INFO(kLogGraph | kLogInit, "topology: %s; GPU generation and NVLinks unknown", why.c_str());
      }
    }
    std::sort(found.begin(), found.end());
    std::set<std::string> gpuSet(found.begin(), found.end());
    for (size_t i = 0; i < found.size(); ++i) {
      const std::string& bus = found[i];
      addChain(pciChain(realPath(sys("bus/pci/devices/" + bus))));
      if (!pci_.count(bus)) {  // NVML sees it but sysfs does not (restricted container)
        PciEntry& e = pci_[bus];
        e.element.set("busid", bus);
        e.element.set("class", "0x030200");
        e.numa = cpus_.begin()->first;
      }
      XmlNode gpu("gpu");
      auto it = nvml.find(bus);
      gpu.set("dev", std::to_string(it != nvml.end() ? it->second.index : static_cast<int>(i)));
      if (it != nvml.end() && it->second.sm > 0) gpu.set("sm", std::to_string(it->second.sm));
      gpu.set("gdr", gdr_ ? "1" : "0");
      if (it != nvml.end()) {
        for (const NvmlLink& l : it->second.links) {
          XmlNode& nv = gpu.addChild("nvlink");
          nv.set("target", l.remoteBusId);
          nv.set("count", std::to_string(l.count));
          std::string cls = gpuSet.count(l.remoteBusId) ? "0x030200" : classOf(l.remoteBusId);
          // NVSwitches are often invisible (HGX H100 hides them; VMs report a fabric id).
          nv.set("tclass", cls.empty() ? "0x068000" : cls);
        }
      }
      pci_[bus].subs.push_back(std::move(gpu));
    }
  }

  void detectRdma() {
    for (const std::string& dev : listDir(sys("class/infiniband"))) {
      std::string base = sys("class/infiniband/" + dev);
      std::vector<std::string> chain = pciChain(realPath(base + "/device"));
      std::string guid = readSmall(base + "/node_guid");
      guid.erase(std::remove(guid.begin(), guid.end(), ':'), guid.end());
      for (const std::string& port : listDir(base + "/ports")) {
        std::string p = base + "/ports/" + port;
        if (readSmall(p + "/state").find("ACTIVE") == std::string::npos) continue;
        double gbps = atof(readSmall(p + "/rate").c_str());  // "400 Gb/sec (4X NDR)"
        XmlNode net("net");
        net.set("name", port == "1" ? dev : dev + ":" + port);
        net.set("dev", std::to_string(netDev_++));
        net.set("speed", std::to_string(static_cast<long long>(gbps > 0 ? gbps * 1000 : 10000)));
        net.set("port", port);
        net.set("guid", "0x" + (guid.empty() ? std::string("0") : guid));
        net.set("gdr", gdr_ && !pciGpuless() ? "1" : "0");
        addNet(chain, std::move(net));
      }
      if (!chain.empty()) rdmaBuses_.insert(chain[0]);
    }
  }

  bool pciGpuless() const {
    for (const auto& [bus, e] : pci_)
      for (const XmlNode& s : e.subs)
        if (s.name() == "gpu") return false;
    return true;
  }

  void detectEthernet() {
    for (const std::string& ifname : listDir(sys("class/net"))) {
      if (ifname == "lo" || ifname.rfind("docker", 0) == 0 || ifname.rfind("virbr", 0) == 0 ||
          ifname.rfind("ifb", 0) == 0)
        continue;
      std::string base = sys("class/net/" + ifname);
      std::string state = readSmall(base + "/operstate");
      if (state != "up" && state != "unknown") continue;
      std::string dev = realPath(base + "/device");
      std::vector<std::string> chain = dev.empty() ? std::vector<std::string>() : pciChain(dev);
      if (!chain.empty() && rdmaBuses_.count(chain[0])) continue;  // already listed as an RDMA port
      long speed = atol(readSmall(base + "/speed").c_str());
      XmlNode net("net");
      net.set("name", ifname);
      net.set("dev", std::to_string(netDev_++));
      net.set("speed", std::to_string(speed > 0 ? speed : 10000));
      net.set("port", "0");
      net.set("guid", "0x0");
      net.set("gdr", "0");
      addNet(chain, std::move(net));
    }
  }

  void addNet(const std::vector<std::string>& chain, XmlNode net) {
    if (chain.empty()) {
      busless_.push_back(std::move(net));
      return;
    }
    addChain(chain);
    PciEntry& e = pci_[chain[0]];
    auto nic = std::find_if(e.subs.begin(), e.subs.end(), [](const XmlNode& s) { return s.name() == "nic"; });
    if (nic == e.subs.end()) {
      e.subs.emplace_back("nic");
      nic = e.subs.end() - 1;
    }
    nic->addChild(std::move(net));
  }

  XmlNode build(const std::string& bus, const std::map<std::string, std::vector<std::string>>& kids) {
    PciEntry& e = pci_[bus];
    XmlNode el = e.element;
    auto k = kids.find(bus);
    if (k != kids.end())
      for (const std::string& c : k->second) el.addChild(build(c, kids));
    for (const XmlNode& s : e.subs) el.addChild(s);
    return el;
  }

  XmlNode assemble() {
    std::map<std::string, std::vector<std::string>> kids;  // sorted bus order
    std::map<int, std::vector<std::string>> tops;
    for (const auto& [bus, e] : pci_) {
      if (e.parent.empty()) tops[e.numa].push_back(bus);
      else kids[e.parent].push_back(bus);
    }
    XmlNode root("system");
    root.set("version", "1");
    bool first = true;
    for (auto& [numa, cpu] : cpus_) {
      XmlNode el = cpu;
      for (const std::string& bus : tops[numa]) el.addChild(build(bus, kids));
      if (first) {
        // Interfaces without a PCI function (veth in a namespace, bonds) hang off the first
        // NUMA domain, as NCCL lists socket NICs under a <cpu>.
        for (XmlNode& net : busless_) {
          XmlNode nic("nic");
          nic.addChild(std::move(net));
          el.addChild(std::move(nic));
        }
        first = false;
      }
      root.addChild(std::move(el));
    }
    return root;
  }

  std::string root_;
  bool useNvml_;
  bool gdr_ = false;
  int netDev_ = 0;
  std::map<int, XmlNode> cpus_;
  std::map<std::string, PciEntry> pci_;
  std::vector<XmlNode> busless_;
  std::set<std::string> rdmaBuses_;
};

}  // namespace

XmlNode detectXml(const DetectOptions& options) { return Detector(options).run(); }

}  // namespace loom::topo
