#include "topo/nvml.h"

#include <cstdio>
#include <map>

#include "base/dl.h"
#include "base/error.h"
#include "base/log.h"
#include "topo/system.h"

namespace loom::topo {
namespace {

// The few NVML declarations Loom needs, so the build does not depend on nvml.h. Values and
// layouts are NVML's public ABI.
using NvmlReturn = int;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlInvalidArgument = 2;
constexpr unsigned kNvmlMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS since R535 (Hopper)
struct NvmlDeviceSt;
using NvmlDevice = NvmlDeviceSt*;

// nvmlPciInfo_t: v1 and v3 share the leading layout up to `device`; the trailing bus-id
// string differs in size, so the buffer is generously padded and only numbers are read.
struct NvmlPciInfo {
  char busIdLegacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pciDeviceId;
  unsigned pciSubSystemId;
  char rest[96];
};

struct NvmlApi {
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  const char* (*errorString)(NvmlReturn) = nullptr;
  NvmlReturn (*getCount)(unsigned*) = nullptr;
  NvmlReturn (*getHandleByIndex)(unsigned, NvmlDevice*) = nullptr;
  NvmlReturn (*getPciInfo)(NvmlDevice, NvmlPciInfo*) = nullptr;
  NvmlReturn (*getComputeCapability)(NvmlDevice, int*, int*) = nullptr;
  NvmlReturn (*getNvLinkState)(NvmlDevice, unsigned, int*) = nullptr;
  NvmlReturn (*getNvLinkRemotePciInfo)(NvmlDevice, unsigned, NvmlPciInfo*) = nullptr;
};

template <typename Fn>
bool bindFirst(const DynLib& lib, Fn*& fn, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (lib.bind(fn, n)) return true;
  return false;
}

std::string busIdOf(const NvmlPciInfo& p) {
  char buf[40];
  snprintf(buf, sizeof buf, "%04x:%02x:%02x.0", p.domain, p.bus, p.device);
  std::string norm;
  return normalizeBusId(buf, &norm) ? norm : std::string(buf);  // NVSwitch fabric ids are not PCI
}

class Session {
 public:
  explicit Session(const NvmlApi& api) : api_(api) {}
  ~Session() {
    if (api_.shutdown) api_.shutdown();
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

 private:
  const NvmlApi& api_;
};

}  // namespace

bool queryNvml(std::vector<NvmlGpu>* gpus, std::string* why) {
  gpus->clear();
  std::string err;
  DynLib lib = DynLib::open({"libnvidia-ml.so.1", "libnvidia-ml.so"}, &err);
  if (!lib.loaded()) {
    *why = "NVML not loadable: " + err;
    return false;
  }
  NvmlApi api;
  bool ok = bindFirst(lib, api.init, {"nvmlInit_v2", "nvmlInit"}) &&
            bindFirst(lib, api.shutdown, {"nvmlShutdown"}) &&
            bindFirst(lib, api.getCount, {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"}) &&
            bindFirst(lib, api.getHandleByIndex,
                      {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"}) &&
            bindFirst(lib, api.getPciInfo, {"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo"}) &&
            bindFirst(lib, api.getComputeCapability, {"nvmlDeviceGetCudaComputeCapability"});
  if (!ok) {
    *why = "NVML at " + lib.path() + " lacks a required symbol";
    return false;
  }
  bindFirst(lib, api.errorString, {"nvmlErrorString"});
  // NVLink queries are optional: GPUs without NVLink simply report none.
  bindFirst(lib, api.getNvLinkState, {"nvmlDeviceGetNvLinkState"});
  bindFirst(lib, api.getNvLinkRemotePciInfo,
            {"nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo"});

  auto fail = [&](const char* what, NvmlReturn r) {
    *why = strprintf("%s failed: %s (%d)", what, api.errorString ? api.errorString(r) : "NVML error", r);
    return false;
  };
  NvmlReturn r = api.init();
  if (r != kNvmlSuccess) {
    api.shutdown = nullptr;  // nothing to shut down
    return fail("nvmlInit", r);
  }
  Session session(api);
  unsigned count = 0;
  if ((r = api.getCount(&count)) != kNvmlSuccess) return fail("nvmlDeviceGetCount", r);
  for (unsigned i = 0; i < count; ++i) {
    NvmlDevice dev = nullptr;
    if ((r = api.getHandleByIndex(i, &dev)) != kNvmlSuccess) return fail("nvmlDeviceGetHandleByIndex", r);
    NvmlGpu g;
    g.index = static_cast<int>(i);
    NvmlPciInfo pci{};
    if ((r = api.getPciInfo(dev, &pci)) != kNvmlSuccess) return fail("nvmlDeviceGetPciInfo", r);
    g.busId = busIdOf(pci);
    int major = 0, minor = 0;
    if (api.getComputeCapability(dev, &major, &minor) == kNvmlSuccess) g.sm = major * 10 + minor;
    if (api.getNvLinkState && api.getNvLinkRemotePciInfo) {
      std::map<std::string, int> byRemote;
      for (unsigned link = 0; link < kNvmlMaxLinks; ++link) {
        int active = 0;
        r = api.getNvLinkState(dev, link, &active);
        if (r == kNvmlInvalidArgument) break;  // past this GPU's last link
        if (r != kNvmlSuccess || !active) continue;
        NvmlPciInfo remote{};
        if (api.getNvLinkRemotePciInfo(dev, link, &remote) != kNvmlSuccess) continue;
        ++byRemote[busIdOf(remote)];
      }
      for (const auto& [bus, n] : byRemote) g.links.push_back({bus, n});
    }
    LOOM_INFO(kLogGraph, "NVML GPU %u: %s sm %d, %zu NVLink peers", i, g.busId.c_str(), g.sm,
              g.links.size());
    gpus->push_back(std::move(g));
  }
  return true;
}

}  // namespace loom::topo
