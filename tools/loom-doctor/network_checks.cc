// Network checks: the bootstrap interface NCCL_SOCKET_IFNAME selects (with Loom's own
// selection code), the rendezvous address NCCL_COMM_ID names, RDMA ports and the kernel
// modules GPUDirect RDMA needs.
#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <strings.h>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include "base/config.h"
#include "base/error.h"
#include "base/socket.h"
#include "bootstrap/unique_id.h"
#include "doctor.h"
#include "transports/net/ib_devices.h"

namespace loom::doctor {
namespace {

std::string knobValue(const char* name) {
  const KnobBase* k = findKnob(name);
  return k ? k->raw() : "";
}

// The address without its port (0 for an interface).
std::string hostPart(const SocketAddr& a) {
  std::string s = a.str();
  if (!s.empty() && s[0] == '[') return s.substr(1, s.find(']') - 1);
  return s.substr(0, s.rfind(':'));
}

std::string sysNet(const std::string& ifname, const char* file) {
  std::ifstream f("/sys/class/net/" + ifname + "/" + file);
  std::string v;
  if (f) std::getline(f, v);
  return v;
}

std::vector<std::string> dirEntries(const char* path) {
  std::vector<std::string> out;
  if (DIR* d = opendir(path)) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

bool isLocalAddress(const SocketAddr& a) {
  for (const NetInterface& i : findInterfaces("^", 0))
    if (hostPart(i.addr) == hostPart(a)) return true;
  return false;
}

}  // namespace

Check checkInterface(Host* host) {
  Check c("interface");
  const std::string spec = knobValue("LOOM_SOCKET_IFNAME");
  c.fact("spec", jsonString(spec));
  std::string usable;  // "eth0 10.0.0.2, lo 127.0.0.1"
  std::string firstUsable;
  std::set<std::string> seen;
  for (const NetInterface& i : findInterfaces("^", 0)) {
    if (!seen.insert(i.name).second) continue;  // one address per interface is enough here
    usable += (usable.empty() ? "" : ", ") + i.name + " " + hostPart(i.addr);
    if (firstUsable.empty() && i.name.rfind("lo", 0) != 0) firstUsable = i.name;
  }
  NetInterface chosen;
  try {
    chosen = bootstrapInterface();
  } catch (const Error& e) {
    std::string down;  // interfaces the spec names that exist but are not usable
    for (const std::string& n : dirEntries("/sys/class/net"))
      if (!spec.empty() && matchIfName(spec, n))
        down += (down.empty() ? "" : ", ") + n + " (" + sysNet(n, "operstate") + ", no usable address or not up)";
    std::string fix;
    if (!down.empty()) fix = "bring it up with an address (ip link set <if> up; ip addr add ...), or ";
    fix += usable.empty()
               ? "bring an interface up and give it an address"
               : "set NCCL_SOCKET_IFNAME to one that is up, e.g. NCCL_SOCKET_IFNAME==" +
                     (firstUsable.empty() ? std::string("lo") : firstUsable) + " (usable here: " + usable + ")";
    return c.set(Status::kFail, std::string(e.what()) + (down.empty() ? "" : "; matching but unusable: " + down), fix);
  }
  host->bootstrapOk = true;
  const std::string addr = hostPart(chosen.addr);
  c.fact("name", jsonString(chosen.name));
  c.fact("address", jsonString(addr));
  std::string found = "bootstrap and TCP traffic use " + chosen.name + " " + addr;
  const std::string speed = sysNet(chosen.name, "speed"), mtu = sysNet(chosen.name, "mtu");
  if (!speed.empty() && speed[0] != '-') found += ", " + speed + " Mb/s";
  if (!mtu.empty()) found += ", MTU " + mtu;
  found += spec.empty() ? " (NCCL_SOCKET_IFNAME unset: the first that is up, not docker* or lo)"
                        : " (NCCL_SOCKET_IFNAME=" + spec + ")";
  if (chosen.name.rfind("lo", 0) == 0 && spec.empty())
    return c.set(
        Status::kWarn, found + ": loopback only, so ranks on other hosts cannot reach this one",
        "fine on one host; for several hosts bring up an interface that reaches them and set NCCL_SOCKET_IFNAME to it");
  return c.set(Status::kPass, found);
}

// Before a job, NCCL_COMM_ID names rank 0's host: there it must be bindable, elsewhere
// reachable once rank 0 runs. A refusal from another host means nothing listens there.
Check checkRendezvous(int timeoutMs) {
  Check c("rendezvous");
  const std::string text = knobValue("LOOM_COMM_ID");
  if (text.empty()) return c.set(Status::kSkip, "NCCL_COMM_ID unset: ranks exchange the ncclUniqueId themselves");
  c.fact("address", jsonString(text));
  SocketAddr addr;
  try {
    addr = SocketAddr::parse(text, "NCCL_COMM_ID");
  } catch (const Error& e) {
    return c.set(Status::kFail, e.what(), "set NCCL_COMM_ID=<host>:<port> or [<ipv6>]:<port>, the same on every rank");
  }
  const bool local = isLocalAddress(addr);
  c.fact("local", jsonBool(local));
  const int r = Socket::probe(addr, timeoutMs);
  c.fact("probe", jsonString(r == 1 ? "listening" : r == 0 ? "refused" : "no answer"));
  const std::string where = "NCCL_COMM_ID=" + text + (addr.str() == text ? "" : " (" + addr.str() + ")");
  if (local) {
    if (r == 1)
      return c.set(Status::kWarn, where + " is this host's and something already listens there",
                   "if the job is not running yet, rank 0 will fail to bind it: find the holder "
                   "(ss -ltnp 'sport = :" +
                       std::to_string(addr.port()) + "') or choose another port");
    try {
      SocketAddr bindAddr = addr;
      Socket s = Socket::listen(bindAddr, 1);
    } catch (const Error& e) {
      return c.set(Status::kFail, where + " is this host's but cannot be bound: " + e.what(),
                   "choose a free port above 1024 that no other service uses");
    }
    return c.set(Status::kPass, where + " is an address of this host and its port is free: rank 0 must run here");
  }
  // A TCP handshake is all this proves: the root speaks only after a rank's authenticated
  // hello, and a transparent proxy on the way would complete the handshake too.
  if (r == 1)
    return c.set(Status::kPass, where + " accepts TCP connections (the root of a running job, or whatever else "
                                        "listens or proxies there)");
  if (r == 0)
    return c.set(Status::kFail, where + ": connection refused, nothing listens there",
                 "start rank 0 first (it runs the rendezvous root), or correct the host or port in NCCL_COMM_ID");
  return c.set(Status::kFail,
               where + ": no answer within " + std::to_string(timeoutMs) + " ms (unreachable, or a firewall drops it)",
               "check that the host is right and reachable from here (ping, ip route get) and that TCP port " +
                   std::to_string(addr.port()) + " is open between the hosts");
}

Check checkRdma(Host* host) {
  Check c("rdma");
  const std::vector<std::string> devices = dirEntries("/sys/class/infiniband");
  host->rdmaDevices = static_cast<int>(devices.size());
  std::string names;
  for (const std::string& d : devices) names += (names.empty() ? "" : " ") + d;
  c.fact("devices", jsonNumber(static_cast<double>(devices.size())));
  if (devices.empty()) {
    std::string net = knobValue("LOOM_NET");
    if (strcasecmp(net.c_str(), "IB") == 0)
      return c.set(Status::kFail, "NCCL_NET=IB but there is no RDMA device (/sys/class/infiniband is empty or absent)",
                   "unset NCCL_NET (TCP is used), or load the RDMA driver (ibstat should list the HCAs)");
    return c.set(Status::kSkip,
                 "no RDMA device (/sys/class/infiniband is empty or absent): ranks on other hosts use TCP");
  }
  std::string why;
  std::vector<IbPort> ports = listIbPorts(&why);
  if (ports.empty())
    return c.set(Status::kWarn, "RDMA devices " + names + " but no usable port: " + why,
                 "install rdma-core (libibverbs1) and the device's provider, then check ibv_devinfo");
  std::string active, inactive;
  for (const IbPort& p : ports) {
    std::string& list = p.active ? active : inactive;
    list += (list.empty() ? "" : ", ") + describe(p);
  }
  c.fact("active", jsonString(active));
  c.fact("inactive", jsonString(inactive));
  if (active.empty())
    return c.set(Status::kWarn, "no active RDMA port (" + inactive + "): jobs fall back to TCP",
                 "check cables and the subnet manager (ibstat, ibv_devinfo); RoCE: the port's Ethernet link");
  if (std::string spec = ibHcaSpec(); !spec.empty()) {
    try {
      std::string sel;
      for (const IbPort& p : selectIbPorts(ports, spec))
        sel += (sel.empty() ? "" : ", ") + p.device + ":" + std::to_string(p.port);
      active = "NCCL_IB_HCA=" + spec + " selects " + sel;
    } catch (const Error& e) {
      return c.set(Status::kFail, e.what(), "set NCCL_IB_HCA to select active ports, or unset it");
    }
  }
  if (!inactive.empty())
    return c.set(Status::kWarn, "active: " + active + "; not active: " + inactive,
                 "bring the inactive ports up or exclude them (NCCL_IB_HCA=^<device>)");
  return c.set(Status::kPass, "active: " + active);
}

// GPUDirect RDMA lets the NIC read and write GPU memory; without a peer-memory module the
// data is staged through host memory.
Check checkGdr(const Host& host) {
  Check c("gdr");
  std::ifstream f("/proc/modules");
  std::string loaded;
  bool readable = static_cast<bool>(f);
  for (std::string line; std::getline(f, line);) {
    std::string name = line.substr(0, line.find(' '));
    if (name == "nvidia_peermem" || name == "nv_peer_mem") loaded += (loaded.empty() ? "" : " ") + name;
  }
  c.fact("modules", jsonString(loaded));
  const int gpus = host.sys ? host.sys->gpuCount() : 0;
  if (gpus == 0 || host.rdmaDevices == 0)
    return c.set(Status::kSkip,
                 std::string("not needed: no ") + (gpus == 0 ? "GPU" : "RDMA device") +
                     (readable ? "; peer-memory modules loaded: " + (loaded.empty() ? std::string("none") : loaded)
                               : "; /proc/modules cannot be read here"));
  if (!readable)
    return c.set(Status::kWarn, "GPUs and RDMA devices, but /proc/modules cannot be read to find nvidia_peermem",
                 "check on the host: lsmod | grep -e nvidia_peermem -e nv_peer_mem");
  if (loaded.empty())
    return c.set(Status::kWarn,
                 "GPUs and RDMA devices, but neither nvidia_peermem nor nv_peer_mem is loaded: "
                 "GPU buffers are staged through host memory",
                 "modprobe nvidia_peermem (shipped with the NVIDIA driver since 470), or use DMA-BUF "
                 "(kernel 5.12+, NVIDIA open kernel modules)");
  return c.set(Status::kPass, "loaded: " + loaded);
}

}  // namespace loom::doctor
