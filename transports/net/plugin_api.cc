#include "transports/net/plugin_api.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <strings.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"

namespace loom {
namespace {

StringKnob kNetPlugin("LOOM_NET_PLUGIN", "NCCL_NET_PLUGIN", "",
                      "NCCL net plugins to load: unset tries libnccl-net.so; a comma list, each "
                      "entry tried as given and as libnccl-net-<entry>.so; none: no plugin");

using namespace netabi;  // NOLINT(google-build-using-namespace): the ABI's own names

// Plugins print through NCCL's logger; their lines join Loom's, under NET unless they say.
void pluginLogger(int level, unsigned long flags, const char* file, int line, const char* fmt,
                  ...) {
  va_list ap;
  va_start(ap, fmt);
  pluginLogV(kLogNet, "NET/Plugin", level, flags, file, line, fmt, ap);
  va_end(ap);
}

CommConfig gDefaultConfig{-1};

// One adapter per ABI version; `if constexpr` keeps each version's differences next to
// the call they change.
template <int V, class Net>
class Adapter final : public PluginApi {
 public:
  Adapter(const Net* net, std::string path) : PluginApi(V, net->name ? net->name : "?", std::move(path)), n_(net) {}

  R init(void** ctx, uint64_t commId) override {
    *ctx = nullptr;
    if constexpr (V >= 11) {
      CommConfig config{-1};  // the plugin copies what it keeps
      return n_->init(ctx, commId, &config, pluginLogger, nullptr);
    } else {
      // Older plugins keep process-wide state: their init runs once per process, and
      // they stay initialised (they have no finalize).
      std::lock_guard<std::mutex> g(mu_);
      if (initialised_) return kOk;
      R r;
      if constexpr (V == 10)
        r = n_->init(pluginLogger, nullptr);
      else
        r = n_->init(pluginLogger);
      initialised_ = r == kOk;
      return r;
    }
  }
  void finalize(void* ctx) override {
    if constexpr (V >= 11) {
      if (n_->finalize) n_->finalize(ctx);
    }
  }
  R devices(int* n) override { return n_->devices(n); }
  R properties(int dev, NetProperties* p) override {
    std::conditional_t<V == 6, PropsV6,
                       std::conditional_t<V == 7, PropsV7,
                                          std::conditional_t<V == 8, PropsV8,
                                                             std::conditional_t<V <= 10, PropsV9, PropsV11>>>>
        q{};
    R r = n_->getProperties(dev, &q);
    if (r != kOk) return r;
    p->name = q.name ? q.name : "";
    p->pciPath = q.pciPath ? q.pciPath : "";
    p->guid = q.guid;
    p->ptrSupport = q.ptrSupport;
    p->speedMbps = q.speed;
    p->port = q.port;
    p->latencyUs = static_cast<int>(q.latency);
    p->maxComms = q.maxComms;
    p->maxRecvs = q.maxRecvs;
    if constexpr (V >= 9)
      p->maxMessageBytes = q.maxP2pBytes;
    else
      p->maxMessageBytes = kLegacyMaxBytes;
    return kOk;
  }
  R listen(void* ctx, int dev, void* handle, void** comm) override {
    if constexpr (V >= 11)
      return n_->listen(ctx, dev, handle, comm);
    else
      return n_->listen(dev, handle, comm);
  }
  R connect(void* ctx, int dev, void* handle, void** comm) override {
    if constexpr (V >= 11) {
      DeviceHandle* dh = nullptr;
      return n_->connect(ctx, dev, handle, comm, &dh);
    } else if constexpr (V == 10) {
      DeviceHandle* dh = nullptr;
      return n_->connect(dev, &gDefaultConfig, handle, comm, &dh);
    } else if constexpr (V >= 7) {
      DeviceHandle* dh = nullptr;
      return n_->connect(dev, handle, comm, &dh);
    } else {
      return n_->connect(dev, handle, comm);
    }
  }
  R accept(void* listenComm, void** comm) override {
    if constexpr (V >= 7) {
      DeviceHandle* dh = nullptr;
      return n_->accept(listenComm, comm, &dh);
    } else {
      return n_->accept(listenComm, comm);
    }
  }
  R regMr(void* comm, void* data, size_t bytes, int type, void** mh) override {
    if constexpr (V <= 7) {
      if (bytes > INT_MAX) return kInternalError;
      return n_->regMr(comm, data, static_cast<int>(bytes), type, mh);
    } else {
      return n_->regMr(comm, data, bytes, type, mh);
    }
  }
  R regMrDmaBuf(void* comm, void* data, size_t bytes, int type, uint64_t offset, int fd,
                void** mh) override {
    return n_->regMrDmaBuf(comm, data, bytes, type, offset, fd, mh);  // size_t in every version
  }
  R deregMr(void* comm, void* mh) override { return n_->deregMr(comm, mh); }
  R isend(void* comm, void* data, size_t bytes, int tag, void* mh, void** req) override {
    if constexpr (V <= 8) {
      if (bytes > kLegacyMaxBytes) return kInternalError;
      return n_->isend(comm, data, static_cast<int>(bytes), tag, mh, req);
    } else if constexpr (V == 9) {
      return n_->isend(comm, data, bytes, tag, mh, req);
    } else {
      return n_->isend(comm, data, bytes, tag, mh, nullptr, req);
    }
  }
  R irecv(void* comm, void* data, size_t bytes, int tag, void* mh, void** req) override {
    void* ptrs[1] = {data};
    int tags[1] = {tag};
    void* mhs[1] = {mh};
    if constexpr (V <= 8) {
      int sizes[1] = {static_cast<int>(bytes > kLegacyMaxBytes ? kLegacyMaxBytes : bytes)};
      return n_->irecv(comm, 1, ptrs, sizes, tags, mhs, req);
    } else if constexpr (V == 9) {
      size_t sizes[1] = {bytes};
      return n_->irecv(comm, 1, ptrs, sizes, tags, mhs, req);
    } else {
      size_t sizes[1] = {bytes};
      void* ph[1] = {nullptr};
      return n_->irecv(comm, 1, ptrs, sizes, tags, mhs, ph, req);
    }
  }
  R iflush(void* comm, void* data, int bytes, void* mh, void** req) override {
    void* ptrs[1] = {data};
    int sizes[1] = {bytes};
    void* mhs[1] = {mh};
    return n_->iflush(comm, 1, ptrs, sizes, mhs, req);
  }
  R test(void* req, int* done, int* bytes) override { return n_->test(req, done, bytes); }
  R closeSend(void* comm) override { return n_->closeSend(comm); }
  R closeRecv(void* comm) override { return n_->closeRecv(comm); }
  R closeListen(void* comm) override { return n_->closeListen(comm); }

 private:
  const Net* n_;
  std::mutex mu_;
  bool initialised_ = false;  // v6-v10
};

std::shared_ptr<PluginApi> makeAdapter(void* lib, const std::string& path);

// The newest interface the library exports, adapted; one adapter per plugin table in the
// process, however many NCCL_NET_PLUGIN spellings reach it (v6-v10 init once per process).
std::shared_ptr<PluginApi> adapt(void* lib, const std::string& path) {
  static std::mutex mu;
  static auto* adapters = new std::map<const void*, std::shared_ptr<PluginApi>>;
  const void* table = nullptr;
  for (const char* sym : {"ncclNetPlugin_v11", "ncclNetPlugin_v10", "ncclNetPlugin_v9",
                          "ncclNetPlugin_v8", "ncclNetPlugin_v7", "ncclNetPlugin_v6"})
    if (!table) table = dlsym(lib, sym);
  if (!table) return nullptr;
  std::lock_guard<std::mutex> g(mu);
  auto& a = (*adapters)[table];
  if (!a) a = makeAdapter(lib, path);
  return a;
}

std::shared_ptr<PluginApi> makeAdapter(void* lib, const std::string& path) {
  if (auto* n = static_cast<const NetV11*>(dlsym(lib, "ncclNetPlugin_v11")))
    return std::make_shared<Adapter<11, NetV11>>(n, path);
  if (auto* n = static_cast<const NetV10*>(dlsym(lib, "ncclNetPlugin_v10")))
    return std::make_shared<Adapter<10, NetV10>>(n, path);
  if (auto* n = static_cast<const NetV9*>(dlsym(lib, "ncclNetPlugin_v9")))
    return std::make_shared<Adapter<9, NetV9>>(n, path);
  if (auto* n = static_cast<const NetV8*>(dlsym(lib, "ncclNetPlugin_v8")))
    return std::make_shared<Adapter<8, NetV8>>(n, path);
  if (auto* n = static_cast<const NetV7*>(dlsym(lib, "ncclNetPlugin_v7")))
    return std::make_shared<Adapter<7, NetV7>>(n, path);
  if (auto* n = static_cast<const NetV6*>(dlsym(lib, "ncclNetPlugin_v6")))
    return std::make_shared<Adapter<6, NetV6>>(n, path);
  return nullptr;
}

std::string loadedPath(void* lib, const std::string& fallback) {
  Dl_info info;
  void* sym = dlsym(lib, "ncclNetPlugin_v11");
  for (const char* s : {"ncclNetPlugin_v10", "ncclNetPlugin_v9", "ncclNetPlugin_v8",
                        "ncclNetPlugin_v7", "ncclNetPlugin_v6"})
    if (!sym) sym = dlsym(lib, s);
  if (sym && dladdr(sym, &info) && info.dli_fname) return info.dli_fname;
  return fallback;
}

}  // namespace

void pluginLogV(uint64_t defaultSubsys, const char* prefix, int level, unsigned long flags,
                const char* file, int line, const char* fmt, va_list ap) {
  LogLevel l = level == kLogWarn || level == kLogAbort ? LogLevel::kWarn
               : level == kLogInfo ? LogLevel::kInfo
               : level >= kLogTrace ? LogLevel::kTrace
                                    : LogLevel::kNone;
  uint64_t subsys = (flags & 0x7ff) ? (flags & 0x7ff) : defaultSubsys;
  if (l == LogLevel::kNone || !logEnabled(l, subsys)) return;
  char buf[1024];
  vsnprintf(buf, sizeof(buf), fmt, ap);
  logMessage(l, subsys, file ? file : "plugin", line, "%s: %s", prefix, buf);
}

std::string PluginApi::describe() const {
  return strprintf("%s (v%d, %s)", name_.c_str(), version_, path_.c_str());
}

const char* netResultName(netabi::Result r) {
  static const char* const kNames[] = {"ncclSuccess",        "ncclUnhandledCudaError",
                                       "ncclSystemError",    "ncclInternalError",
                                       "ncclInvalidArgument", "ncclInvalidUsage",
                                       "ncclRemoteError",    "ncclInProgress"};
  return r >= 0 && r < 8 ? kNames[r] : "an unknown ncclResult_t";
}

std::vector<std::string> pluginLibraryNames(const std::string& entry, const char* prefix) {
  std::vector<std::string> names{entry};
  bool libSo = entry.rfind("lib", 0) == 0 && entry.size() >= 3 &&
               entry.compare(entry.size() - 3, 3, ".so") == 0;
  if (entry.find('/') == std::string::npos && !libSo)
    names.push_back(std::string(prefix) + "-" + entry + ".so");
  return names;
}

PluginLoad loadNetPlugins(const char* spec) {
  PluginLoad out;
  std::vector<std::string> entries;
  if (!spec) {
    entries.push_back("libnccl-net.so");
  } else if (strcasecmp(spec, "none") != 0) {
    std::string s = spec;
    size_t at = 0;
    while (at <= s.size()) {
      size_t comma = s.find(',', at);
      std::string e = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      if (!e.empty()) entries.push_back(e);
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
    out.requested = !entries.empty();
  }
  for (const std::string& e : entries) {
    std::string tried;
    void* lib = nullptr;
    std::string path;
    for (const std::string& name : pluginLibraryNames(e)) {
      dlerror();
      lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib) {
        path = name;
        break;
      }
      const char* err = dlerror();
      tried += strprintf("%s%s (%s)", tried.empty() ? "" : "; ", name.c_str(),
                         err ? err : "not found");
    }
    if (!lib) {
      out.failures.push_back(strprintf("NCCL_NET_PLUGIN entry \"%s\": could not load %s",
                                       e.c_str(), tried.c_str()));
      continue;
    }
    path = loadedPath(lib, path);
    auto api = adapt(lib, path);
    if (!api) {
      out.failures.push_back(strprintf(
          "NCCL_NET_PLUGIN entry \"%s\": %s exports no ncclNetPlugin_v6..v11 symbol", e.c_str(),
          path.c_str()));
      dlclose(lib);
      continue;
    }
    LOOM_INFO(kLogNet | kLogInit, "NET/Plugin: loaded %s", api->describe().c_str());
    out.plugins.push_back(std::move(api));  // the library stays loaded: its code is in use
  }
  return out;
}

const PluginLoad& processNetPlugins() {
  static std::mutex mu;
  static auto* loads = new std::map<std::string, PluginLoad>;  // by value; "\x01": unset
  std::string value = kNetPlugin.get();
  const char* spec = kNetPlugin.isSet() ? value.c_str() : nullptr;
  std::string key = spec ? value : std::string("\x01");
  std::lock_guard<std::mutex> g(mu);
  auto it = loads->find(key);
  if (it == loads->end()) {
    it = loads->emplace(key, loadNetPlugins(spec)).first;
    for (const std::string& f : it->second.failures) {
      if (it->second.requested)
        LOOM_WARN("NET/Plugin: %s", f.c_str());
      else
        LOOM_INFO(kLogNet | kLogInit, "NET/Plugin: %s (no plugin: the built-in networks)",
                  f.c_str());
    }
  }
  return it->second;
}

}  // namespace loom
