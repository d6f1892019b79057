// Gathers loom-info's facts: features and their runtimes, CPU ISA, network, host, knobs.
#include <nccl.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/dl.h"
#include "base/error.h"
#include "base/host.h"
#include "engine/profiler_plugin.h"
#include "engine/tuner_plugin.h"
#include "base/socket.h"
#include "bootstrap/unique_id.h"
#include "dispatch/fallback.h"
#include "dispatch/stock_nccl.h"
#include "transports/net/ib_devices.h"
#include "transports/net/plugin_api.h"
#include "info.h"
#include "kernels/reduce.h"
#include "loom/loom.h"

namespace loom::info {
namespace {

// The libraries each optional runtime lives in, in the order Loom tries them. The
// authoritative yes/no comes from loomGetFeatures; these lookups only find the file to
// show, so a user sees *which* libcudart or libnccl this process would get.
struct RuntimeSpec {
  unsigned bit;
  const char* name;
  const char* key;
  std::vector<std::string> libs;  // empty: built in, nothing to load
};

const std::vector<RuntimeSpec>& runtimeSpecs() {
  static const std::vector<RuntimeSpec> specs = {
      {loomFeatureHostMemory, "host memory", "hostMemory", {}},
      {loomFeatureCuda, "CUDA", "cuda", {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}},
      {loomFeatureNvml, "NVML", "nvml", {"libnvidia-ml.so.1"}},
      {loomFeatureIbverbs, "ibverbs", "ibverbs", {"libibverbs.so.1"}},
      {loomFeatureUcx, "UCX", "ucx", {"libucp.so.0"}},
      {loomFeatureNcclFallback, "NCCL fallback", "ncclFallback", {}},
  };
  return specs;
}

std::string versionText(int code) {
  // NCCL_VERSION(X,Y,Z) is X*10000 + Y*100 + Z since 2.9.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

// The fallback's own search (src/dispatch): what it would hand calls to, or why nothing.
void findStockNccl(FeatureInfo* f) {
  std::string tried;
  std::unique_ptr<dispatch::StockNccl> lib = dispatch::findStockNccl(&tried);
  if (!lib) {
    f->detail = tried;
    return;
  }
  f->path = lib->path();
  std::string mode;
  try {
    mode = std::string("LOOM_NCCL_FALLBACK=") + dispatch::fallbackModeName(dispatch::fallbackMode());
  } catch (const Error& e) {
    mode = e.what();
  }
  // What it serves beside the collectives where it serves a communicator (docs/gpu.md).
  const dispatch::StockApi& a = lib->api();
  auto has = [](bool yes) { return yes ? "yes" : "no"; };
  f->detail = "NCCL " + versionText(lib->version()) + "; " + mode +
              " (each communicator's INIT log says who serves its device buffers and why); "
              "beside the collectives: registration " + has(a.commRegister && a.commDeregister) +
              ", windows " + has(a.commWindowRegister && a.commWindowDeregister) +
              ", device API " + has(a.devCommCreate && a.devCommDestroy) +
              ", window lookups (NCCL 2.29+) " + has(a.winGetUserPtr) +
              ", puts and signals (NCCL 2.29+) " + has(a.putSignal && a.signal && a.waitSignal) +
              ", memory statistics and suspension (NCCL 2.29+) " +
              has(a.commMemStats && a.commSuspend && a.commResume) +
              ", ncclMemAlloc " + has(a.memAlloc && a.memFree);
}

void findRuntime(const RuntimeSpec& spec, FeatureInfo* f) {
  if (spec.bit == loomFeatureNcclFallback) return findStockNccl(f);
  if (spec.libs.empty()) {
    f->detail = "built in";
    return;
  }
  std::string error;
  DynLib lib = DynLib::open(spec.libs, &error);
  if (lib.loaded()) f->path = lib.path();
  else f->detail = error;
}

// NCCL net plugins as NCCL_NET_PLUGIN names them: which loaded (the first that starts
// serves the network unless NCCL_NET says otherwise), and why the others did not.
FeatureInfo netPlugins() {
  FeatureInfo f;
  f.name = "NCCL net plugins";
  f.key = "netPlugins";
  f.compiled = true;
  const PluginLoad& load = processNetPlugins();
  f.available = !load.plugins.empty();
  if (f.available) f.path = load.plugins[0]->path();
  for (const auto& p : load.plugins) f.detail += (f.detail.empty() ? "" : "; ") + p->describe();
  for (const std::string& e : load.failures) f.detail += (f.detail.empty() ? "" : "; ") + e;
  if (f.detail.empty()) f.detail = "none (NCCL_NET_PLUGIN=none)";
  return f;
}

// An NCCL plugin beside the network's as its variable names it (or a net plugin's library
// exports one): processTunerPlugin, processProfilerPlugin.
FeatureInfo pluginFeature(const char* name, const char* key, std::string (*describe)(std::string* path)) {
  FeatureInfo f;
  f.name = name;
  f.key = key;
  f.compiled = true;
  std::string path;
  f.detail = describe(&path);
  f.available = !path.empty();
  f.path = path;
  return f;
}

std::vector<FeatureInfo> collectFeatures() {
  unsigned compiled = 0, available = 0;
  ncclResult_t rc = loomGetFeatures(&compiled, &available);
  if (rc != ncclSuccess)
    LOOM_THROW(kInternalError, "loomGetFeatures failed: %s", ncclGetLastError(nullptr));
  std::vector<FeatureInfo> out;
  for (const RuntimeSpec& spec : runtimeSpecs()) {
    FeatureInfo f;
    f.name = spec.name;
    f.key = spec.key;
    f.compiled = (compiled & spec.bit) != 0;
    f.available = (available & spec.bit) != 0;
    findRuntime(spec, &f);
    out.push_back(std::move(f));
  }
  out.push_back(netPlugins());
  out.push_back(pluginFeature("NCCL tuner plugin", "tunerPlugin", processTunerPlugin));
  out.push_back(pluginFeature("NCCL profiler plugin", "profilerPlugin", processProfilerPlugin));
  return out;
}

const char* typeName(KnobType t) {
  switch (t) {
    case KnobType::kInt: return "int";
    case KnobType::kBool: return "bool";
    case KnobType::kString: return "string";
    case KnobType::kSize: return "size";
  }
  return "unknown";
}

// Parses the value in force as the code that reads the knob would, so a malformed
// setting shows up here instead of as an error in the middle of a job.
void validate(const KnobBase& k, KnobInfo* out) {
  try {
    switch (k.type()) {
      case KnobType::kInt: (void)static_cast<const IntKnob&>(k).get(); break;
      case KnobType::kBool: (void)static_cast<const BoolKnob&>(k).get(); break;
      case KnobType::kSize: (void)static_cast<const SizeKnob&>(k).get(); break;
      case KnobType::kString: break;
    }
  } catch (const Error& e) {
    out->valid = false;
    out->error = e.what();
  }
}

KnobInfo describe(const KnobBase& k) {
  KnobInfo out;
  out.name = k.name();
  out.alias = k.ncclAlias();
  out.type = typeName(k.type());
  out.def = k.defaultValue();
  out.value = k.raw();
  out.source = k.source();
  out.help = k.help();
  out.jobWide = k.scope() == KnobScope::kJob;
  validate(k, &out);
  return out;
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string stripPrefix(const std::string& s) {
  for (const char* p : {"LOOM_", "NCCL_"})
    if (s.rfind(p, 0) == 0) return s.substr(5);
  return s;
}

// SocketAddr::str() with the port, which is 0 for an interface address, left off.
std::string hostPart(const SocketAddr& a) {
  std::string s = a.str();
  if (!s.empty() && s[0] == '[') return s.substr(1, s.find(']') - 1);
  return s.substr(0, s.rfind(':'));
}

void collectNetwork(Info* info) {
  try {
    NetInterface i = bootstrapInterface();
    info->bootstrap = {i.name, hostPart(i.addr)};
    info->bootstrapOk = true;
  } catch (const Error& e) {
    info->bootstrapError = e.what();
  }
  try {
    // "^" excludes nothing: every interface that is up and has a usable address.
    for (const NetInterface& i : findInterfaces("^", 0)) info->interfaces.push_back({i.name, hostPart(i.addr)});
  } catch (const Error&) {
    // getifaddrs failed; the bootstrap line already carries the reason.
  }
  std::string why;
  std::vector<IbPort> ports = listIbPorts(&why);
  for (const IbPort& p : ports) info->rdmaPorts.push_back(describe(p));
  info->rdmaNote = why;
  if (std::string spec = ibHcaSpec(); !spec.empty() && !ports.empty()) {
    try {
      std::string sel;
      for (const IbPort& p : selectIbPorts(ports, spec))
        sel += (sel.empty() ? "" : ", ") + p.device + ":" + std::to_string(p.port);
      info->rdmaNote = "NCCL_IB_HCA=" + spec + " selects " + (sel.empty() ? "none" : sel);
    } catch (const Error& e) {
      info->rdmaNote = e.what();
    }
  }
}

}  // namespace

int Info::invalidKnobs() const {
  return static_cast<int>(std::count_if(knobs.begin(), knobs.end(),
                                        [](const KnobInfo& k) { return !k.valid; }));
}

Info collect() {
  Info info;
  info.version = LOOM_VERSION_STRING;
  info.ncclVersionCode = NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  info.ncclVersion = versionText(info.ncclVersionCode);
  info.features = collectFeatures();
  info.cpuIsa = cpuIsaName(activeCpuIsa());
  for (int i = 0; i < kNumCpuIsas; ++i)
    if (cpuIsaSupported(CpuIsa(i))) info.cpuIsasSupported.push_back(cpuIsaName(CpuIsa(i)));
  collectNetwork(&info);
  info.hostName = hostName();
  info.hostId = hostIdString();
  info.hostHash = hostHash();
  for (const KnobBase* k : allKnobs()) info.knobs.push_back(describe(*k));
  std::sort(info.knobs.begin(), info.knobs.end(),
            [](const KnobInfo& a, const KnobInfo& b) { return a.name < b.name; });
  return info;
}

bool collectKnob(const std::string& name, KnobInfo* out) {
  const KnobBase* k = findKnob(name);
  if (!k) {
    std::string want = upper(name);
    for (const KnobBase* c : allKnobs()) {
      if (want == upper(c->name()) || (*c->ncclAlias() && want == upper(c->ncclAlias()))) {
        k = c;
        break;
      }
    }
  }
  if (!k) return false;
  *out = describe(*k);
  return true;
}

std::vector<std::string> similarKnobs(const std::string& fragment) {
  std::string want = stripPrefix(upper(fragment));
  std::vector<std::string> out;
  if (want.empty()) return out;
  for (const KnobBase* k : allKnobs()) {
    bool hit = stripPrefix(k->name()).find(want) != std::string::npos ||
               (*k->ncclAlias() && stripPrefix(k->ncclAlias()).find(want) != std::string::npos);
    if (hit) out.push_back(k->name());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace loom::info
