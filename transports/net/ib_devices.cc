#include "transports/net/ib_devices.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "base/config.h"
#include "base/error.h"
#include "transports/net/ibv_api.h"

namespace loom {
namespace {
StringKnob kIbHca("LOOM_IB_HCA", "NCCL_IB_HCA", "",
                  "RDMA devices and ports to use, as NCCL: prefixes, '=' for exact names, '^' "
                  "to exclude, ':<port>' for one port (e.g. =mlx5_0:1,mlx5_1:1)");
}  // namespace

std::string ibHcaSpec() { return kIbHca.get(); }

IbHcaFilter IbHcaFilter::parse(const std::string& spec) {
  IbHcaFilter f;
  size_t i = 0;
  if (i < spec.size() && spec[i] == '^') f.exclude = true, ++i;
  if (i < spec.size() && spec[i] == '=') f.exact = true, ++i;
  std::string rest = spec.substr(i);
  size_t start = 0;
  while (start <= rest.size() && !rest.empty()) {
    size_t end = rest.find(',', start);
    std::string item = rest.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!item.empty()) {
      Entry e;
      size_t colon = item.find(':');
      e.name = item.substr(0, colon);
      if (colon != std::string::npos) {
        char* stop = nullptr;
        long port = strtol(item.c_str() + colon + 1, &stop, 10);
        if (stop == item.c_str() + colon + 1 || *stop != '\0' || port < 1 || port > 255)
          LOOM_THROW(kInvalidArgument, "NCCL_IB_HCA=%s: \"%s\" has no valid port after ':' "
                     "(expected <device>[:<port>], ports from 1)", spec.c_str(), item.c_str());
        e.port = static_cast<int>(port);
      }
      if (e.name.empty())
        LOOM_THROW(kInvalidArgument, "NCCL_IB_HCA=%s: an entry names no device", spec.c_str());
      f.entries.push_back(e);
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return f;
}

bool IbHcaFilter::matches(const std::string& device, int port) const {
  if (entries.empty()) return !exclude;  // "^" alone excludes everything, as in NCCL
  bool hit = false;
  for (const Entry& e : entries) {
    bool name = exact ? device == e.name : device.compare(0, e.name.size(), e.name) == 0;
    if (name && (e.port < 0 || e.port == port)) hit = true;
  }
  return exclude ? !hit : hit;
}

std::string describe(const IbPort& p) {
  return p.device + ":" + std::to_string(p.port) + (p.active ? " ACTIVE " : " down ") +
         p.linkLayer + (p.linkLayer == "Ethernet" ? " (RoCE)" : "");
}

std::vector<IbPort> selectIbPorts(const std::vector<IbPort>& ports, const std::string& spec) {
  IbHcaFilter f = IbHcaFilter::parse(spec);
  std::vector<IbPort> out;
  std::string active;
  for (const IbPort& p : ports) {
    if (!p.active) continue;
    active += (active.empty() ? "" : ", ") + p.device + ":" + std::to_string(p.port);
    if (f.matches(p.device, p.port)) out.push_back(p);
  }
  if (out.empty() && !active.empty())
    LOOM_THROW(kInvalidArgument, "NCCL_IB_HCA=%s matches no active RDMA port; active ports "
               "here: %s", spec.c_str(), active.c_str());
  return out;
}

#ifdef LOOM_VERBS_HEADERS

std::vector<IbPort> listIbPorts(std::string* whyOut) {
  std::string ignored;
  std::string* why = whyOut ? whyOut : &ignored;
  std::vector<IbPort> out;
  const IbvApi* v = ibvApi(why);
  if (!v) return out;
  int n = 0;
  ibv_device** list = v->getDeviceList(&n);
  if (!list) {
    int e = errno;
    *why = std::string("ibv_get_device_list failed: ") + strerror(e) +
           (e == ENOSYS ? " (this kernel has no RDMA subsystem: no InfiniBand/RoCE driver)" : "");
    return out;
  }
  for (int d = 0; d < n; ++d) {
    const char* name = v->getDeviceName(list[d]);
    ibv_context* ctx = v->openDevice(list[d]);
    if (!ctx) continue;
    ibv_device_attr attr{};
    if (v->queryDevice(ctx, &attr) == 0) {
      for (int p = 1; p <= attr.phys_port_cnt; ++p) {
        ibv_port_attr pa{};
        if (v->queryPort(ctx, static_cast<uint8_t>(p), &pa) != 0) continue;
        IbPort port;
        port.device = name ? name : "?";
        port.port = p;
        port.active = pa.state == IBV_PORT_ACTIVE;
        port.linkLayer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
        port.gidTable = pa.gid_tbl_len;
        out.push_back(port);
      }
    }
    v->closeDevice(ctx);
  }
  v->freeDeviceList(list);
  if (out.empty()) *why = "libibverbs found no RDMA device (no driver loaded, or none present)";
  return out;
}

#else

std::vector<IbPort> listIbPorts(std::string* why) {
  if (why) *why = verbsUnavailable();
  return {};
}

#endif

}  // namespace loom
