#include "engine/profiler_plugin.h"

#include <dlfcn.h>
#include <strings.h>

#include <algorithm>
#include <cstdarg>
#include <ctime>
#include <map>
#include <mutex>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "engine/profiler_abi.h"
#include "kernels/reduce.h"
#include "transports/net/plugin_api.h"

namespace loom {
namespace {

using namespace profabi;  // NOLINT(google-build-using-namespace): the ABI's own names

StringKnob kProfilerPlugin("LOOM_PROFILER_PLUGIN", "NCCL_PROFILER_PLUGIN", "",
                           "NCCL profiler plugin: unset tries libnccl-profiler.so, then the NCCL net "
                           "plugin's library; a name is tried as given and as "
                           "libnccl-profiler-<name>.so; none: no profiler plugin");

void profilerLogger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pluginLogV(kLogInit, "PROFILER/Plugin", level, flags, file, line, fmt, ap);
  va_end(ap);
}

// The activation mask: one per process, as NCCL's, which every init may set (a plugin may
// keep the pointer and change it later).
int gEventMask = 0;
int eventMask() { return __atomic_load_n(&gEventMask, __ATOMIC_RELAXED); }

// Which events a mask bit needs, as NCCL decides it: a task event needs its API and group
// parents, a channel event its task.
constexpr int kGroupApiNeeds = kGroupApi | kCollApi | kP2pApi | kKernelLaunch | kGroup | kColl | kP2p |
                               kProxyOp | kProxyStep | kKernelCh | kNetPlugin;
constexpr int kCollApiNeeds = kCollApi | kColl | kProxyOp | kProxyStep | kKernelCh | kNetPlugin;
constexpr int kP2pApiNeeds = kP2pApi | kP2p | kProxyOp | kProxyStep | kKernelCh | kNetPlugin;
constexpr int kGroupNeeds = kGroup | kColl | kP2p | kProxyOp | kProxyStep | kKernelCh | kNetPlugin;
constexpr int kCollNeeds = kColl | kProxyOp | kProxyStep | kKernelCh | kNetPlugin;
constexpr int kP2pNeeds = kP2p | kProxyOp | kProxyStep | kKernelCh | kNetPlugin;

const char* ncclTypeName(int dtype) {
  static const char* const kNames[] = {"ncclInt8",    "ncclUint8",    "ncclInt32",      "ncclUint32",
                                       "ncclInt64",   "ncclUint64",   "ncclFloat16",    "ncclFloat32",
                                       "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  return dtype >= 0 && dtype < 12 ? kNames[dtype] : "Unknown";
}

// ncclFuncToString's names.
const char* funcName(Collective c) { return collectiveName(c); }

}  // namespace

struct Profiler::Library {
  int version = 0;              // 0: the library loaded but exports no profiler (`why`)
  const void* table = nullptr;  // the exported ncclProfiler_v<version>
  std::string name, path, why;
  std::string describe() const { return strprintf("%s (v%d, %s)", name.c_str(), version, path.c_str()); }
  const ProfilerV4& v4() const { return *static_cast<const ProfilerV4*>(table); }
  const ProfilerV5& v5() const { return *static_cast<const ProfilerV5*>(table); }
};

namespace {

bool findProfiler(void* lib, const std::string& fallbackPath, Profiler::Library* out) {
  for (int v = 6; v >= 4; --v) {
    const std::string sym = "ncclProfiler_v" + std::to_string(v);
    const void* t = dlsym(lib, sym.c_str());
    if (!t) continue;
    out->version = v;
    out->table = t;
    const char* name = *static_cast<const char* const*>(t);
    out->name = name ? name : "?";
    Dl_info info;
    out->path = dladdr(t, &info) && info.dli_fname ? info.dli_fname : fallbackPath;
    return true;
  }
  return false;
}

// What NCCL_PROFILER_PLUGIN (null: unset) names. Null when nothing loads; a Library of
// version 0 when a library loads without a profiler Loom takes.
const Profiler::Library* loadByName(const char* spec) {
  std::string tried;
  for (const std::string& n : profilerLibraryNames(spec)) {
    dlerror();
    void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* err = dlerror();
      tried += strprintf("%s%s (%s)", tried.empty() ? "" : "; ", n.c_str(), err ? err : "not found");
      continue;
    }
    auto* lib = new Profiler::Library;  // lives as long as the process: plugins keep state
    if (findProfiler(h, n, lib)) {
      LOOM_INFO(kLogInit, "PROFILER/Plugin: loaded %s", lib->describe().c_str());
      return lib;
    }
    lib->why = dlsym(h, "ncclProfiler_v3") || dlsym(h, "ncclProfiler_v2") || dlsym(h, "ncclProfiler_v1")
                   ? strprintf("%s exports only a profiler interface older than v4 (NCCL 2.25), which Loom "
                               "does not load",
                               n.c_str())
                   : strprintf("%s loads but exports no ncclProfiler_v4..v6 symbol", n.c_str());
    if (spec) LOOM_WARN("PROFILER/Plugin: %s: no profiler plugin", lib->why.c_str());
    else LOOM_INFO(kLogInit, "PROFILER/Plugin: %s", lib->why.c_str());
    dlclose(h);
    return lib;
  }
  if (spec)
    LOOM_WARN("PROFILER/Plugin: NCCL_PROFILER_PLUGIN=%s: could not load %s; running without a profiler "
              "plugin unless a net plugin's library has one",
              spec, tried.c_str());
  else
    LOOM_INFO(kLogInit, "PROFILER/Plugin: %s", tried.c_str());
  return nullptr;
}

const Profiler::Library* loadFromNetPlugin(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) return nullptr;
  auto* lib = new Profiler::Library;
  if (findProfiler(h, path, lib)) {
    LOOM_INFO(kLogInit, "PROFILER/Plugin: loaded %s from the net plugin's library", lib->describe().c_str());
    return lib;
  }
  dlclose(h);
  delete lib;
  return nullptr;
}

const Profiler::Library* processProfiler(std::string* why = nullptr) {
  static std::mutex mu;
  static auto* byName = new std::map<std::string, const Profiler::Library*>;  // "\x01": unset
  static auto* byNetPlugin = new std::map<std::string, const Profiler::Library*>;
  const std::string value = kProfilerPlugin.get();
  const bool set = kProfilerPlugin.isSet();
  if (set && strcasecmp(value.c_str(), "none") == 0) {
    if (why) *why = "none (NCCL_PROFILER_PLUGIN=none)";
    return nullptr;
  }
  std::lock_guard<std::mutex> g(mu);
  const std::string key = set ? value : std::string("\x01");
  auto it = byName->find(key);
  if (it == byName->end()) it = byName->emplace(key, loadByName(set ? value.c_str() : nullptr)).first;
  if (it->second && !it->second->version && why) *why = "none: " + it->second->why;
  if (it->second) return it->second->version ? it->second : nullptr;
  for (const auto& net : processNetPlugins().plugins) {
    auto n = byNetPlugin->find(net->path());
    if (n == byNetPlugin->end()) n = byNetPlugin->emplace(net->path(), loadFromNetPlugin(net->path())).first;
    if (n->second) return n->second;
  }
  if (why)
    *why = strprintf("none: %s does not load and no net plugin library exports one",
                     set ? value.c_str() : "libnccl-profiler.so");
  return nullptr;
}

}  // namespace

std::vector<std::string> profilerLibraryNames(const char* spec) {
  if (!spec) return {"libnccl-profiler.so"};
  return pluginLibraryNames(spec, "libnccl-profiler");
}

std::string processProfilerPlugin(std::string* path) {
  std::string why;
  const Profiler::Library* lib = processProfiler(&why);
  *path = lib ? lib->path : "";
  return lib ? lib->describe() : why;
}

namespace {

// The host clock Loom passes as a KernelCh event's pTimer (CLOCK_REALTIME, ns).
uint64_t profilerTimer() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

std::unique_ptr<Profiler> Profiler::open(uint64_t commHash, const char* commName, int nNodes, int nranks,
                                         int rank) {
  const Library* lib = processProfiler();
  if (!lib) return nullptr;
  void* ctx = nullptr;
  const Result r = lib->version == 4
                       ? lib->v4().init(&ctx, &gEventMask, commName, commHash, nNodes, nranks, rank, profilerLogger)
                       : lib->v5().init(&ctx, commHash, &gEventMask, commName, nNodes, nranks, rank, profilerLogger);
  if (r != kOk) {
    LOOM_INFO(kLogInit, "PROFILER/Plugin: %s: init failed (%s) for rank %d of %d; no profiler events for this "
              "communicator", lib->describe().c_str(), netResultName(r), rank, nranks);
    return nullptr;
  }
  LOOM_INFO(kLogInit, "PROFILER/Plugin: %s for rank %d of %d, event mask %#x", lib->describe().c_str(), rank,
            nranks, eventMask());
  return std::unique_ptr<Profiler>(new Profiler(*lib, ctx, rank));
}

Profiler::~Profiler() {
  if (lib_.version == 4) lib_.v4().finalize(ctx_);
  else lib_.v5().finalize(ctx_);
}

bool Profiler::wants(int mask) const { return (eventMask() & mask) != 0; }

namespace {

// Starts a v5 event (v6: the same prefix); null when the plugin gives no handle.
void* startV5(const Profiler::Library& lib, void* ctx, DescrV5& d) {
  void* h = nullptr;
  if (lib.v5().startEvent(ctx, &h, &d) != kOk) return nullptr;
  return h;
}

}  // namespace

void* Profiler::startGroupApi(int depth, bool captured) {
  if (lib_.version < 5 || !wants(kGroupApiNeeds)) return nullptr;
  DescrV5 d{};
  d.type = kGroupApi;
  d.rank = rank_;
  d.groupApi.graphCaptured = captured;
  d.groupApi.groupDepth = depth;
  void* h = startV5(lib_, ctx_, d);
  record(h, kStateGroupStartApiStop);
  return h;
}

void* Profiler::startCollApi(void* groupApi, Collective coll, size_t count, int dtype, int root, void* stream,
                             bool captured) {
  if (lib_.version < 5 || !wants(kCollApiNeeds)) return nullptr;
  DescrV5 d{};
  d.type = kCollApi;
  d.parentObj = groupApi;
  d.rank = rank_;
  d.collApi.func = funcName(coll);
  d.collApi.count = count;
  d.collApi.datatype = ncclTypeName(dtype);
  d.collApi.root = root;
  d.collApi.stream = stream;
  d.collApi.graphCaptured = captured;
  return startV5(lib_, ctx_, d);
}

void* Profiler::startP2pApi(void* groupApi, bool isSend, size_t count, int dtype, void* stream, bool captured) {
  if (lib_.version < 5 || !wants(kP2pApiNeeds)) return nullptr;
  DescrV5 d{};
  d.type = kP2pApi;
  d.parentObj = groupApi;
  d.rank = rank_;
  d.p2pApi.func = isSend ? "Send" : "Recv";
  d.p2pApi.count = count;
  d.p2pApi.datatype = ncclTypeName(dtype);
  d.p2pApi.stream = stream;
  d.p2pApi.graphCaptured = captured;
  return startV5(lib_, ctx_, d);
}

void* Profiler::startGroup() {
  if (!wants(kGroupNeeds)) return nullptr;
  void* h = nullptr;
  if (lib_.version == 4) {
    DescrV4 d{};
    d.type = kGroup;
    d.rank = rank_;
    if (lib_.v4().startEvent(ctx_, &h, &d) != kOk) return nullptr;
    return h;
  }
  DescrV5 d{};
  d.type = kGroup;
  d.rank = rank_;
  return startV5(lib_, ctx_, d);
}

void* Profiler::startColl(void* api, void* group, Collective coll, const void* sendbuff, void* recvbuff,
                          size_t count, int dtype, int root, int nChannels, const char* algo, const char* proto) {
  // Numbered whether or not the event is made, so that ranks agree on the numbers.
  const uint64_t seq = seq_[static_cast<int>(coll)].fetch_add(1, std::memory_order_relaxed);
  if (!wants(kCollNeeds)) return nullptr;
  CollFields c{};
  c.seqNumber = seq;
  c.func = funcName(coll);
  c.sendBuff = sendbuff;
  c.recvBuff = recvbuff;
  c.count = count;
  c.root = root;
  c.datatype = ncclTypeName(dtype);
  c.nChannels = static_cast<uint8_t>(std::min(nChannels, 255));
  c.nWarps = 0;  // host threads, no warps
  c.algo = algo;
  c.proto = proto;
  // As NCCL: broadcasts and all-gathers are counted in bytes.
  if (coll == Collective::kBroadcast || coll == Collective::kAllGather) {
    c.count = count * static_cast<size_t>(dtypeSize(dtype));
    c.datatype = ncclTypeName(0);
  }
  void* h = nullptr;
  if (lib_.version == 4) {
    DescrV4 d{};
    d.type = kColl;
    d.parentObj = group;
    d.rank = rank_;
    d.coll = c;
    return lib_.v4().startEvent(ctx_, &h, &d) == kOk ? h : nullptr;
  }
  DescrV5 d{};
  d.type = kColl;
  d.parentObj = api;
  d.rank = rank_;
  d.coll.c = c;
  d.coll.parentGroup = group;
  return startV5(lib_, ctx_, d);
}

void* Profiler::startP2p(void* api, void* group, bool isSend, void* buff, size_t count, int dtype, int peer) {
  if (!wants(kP2pNeeds)) return nullptr;
  P2pFields p{};
  p.func = isSend ? "Send" : "Recv";
  p.buff = buff;
  p.datatype = ncclTypeName(dtype);
  p.count = count;
  p.peer = peer;
  p.nChannels = 1;  // one channel per (direction, peer)
  void* h = nullptr;
  if (lib_.version == 4) {
    DescrV4 d{};
    d.type = kP2p;
    d.parentObj = group;
    d.rank = rank_;
    d.p2p = p;
    return lib_.v4().startEvent(ctx_, &h, &d) == kOk ? h : nullptr;
  }
  DescrV5 d{};
  d.type = kP2p;
  d.parentObj = api;
  d.rank = rank_;
  d.p2p.p = p;
  d.p2p.parentGroup = group;
  return startV5(lib_, ctx_, d);
}

void* Profiler::startKernelCh(void* task, int channel, uint64_t pTimer) {
  if (!task || !wants(kKernelCh)) return nullptr;
  KernelChFields k{static_cast<uint8_t>(channel), pTimer};
  void* h = nullptr;
  if (lib_.version == 4) {
    DescrV4 d{};
    d.type = kKernelCh;
    d.parentObj = task;
    d.rank = rank_;
    d.kernelCh = k;
    return lib_.v4().startEvent(ctx_, &h, &d) == kOk ? h : nullptr;
  }
  DescrV5 d{};
  d.type = kKernelCh;
  d.parentObj = task;
  d.rank = rank_;
  d.kernelCh = k;
  return startV5(lib_, ctx_, d);
}

void Profiler::record(void* event, int state, uint64_t pTimer) {
  if (!event) return;
  StateArgs a{};
  a.kernelCh.pTimer = pTimer;
  StateArgs* args = state == kStateKernelChStop ? &a : nullptr;
  if (lib_.version == 4) lib_.v4().recordEventState(event, state, args);
  else lib_.v5().recordEventState(event, state, args);
}

void Profiler::stop(void* event) {
  if (!event) return;
  if (lib_.version == 4) lib_.v4().stopEvent(event);
  else lib_.v5().stopEvent(event);
}

void TaskProfile::begin() {
  if (begun_ || !prof_) return;
  begun_ = true;
  const uint64_t t = profilerTimer();
  for (void* p : parents_)
    for (int c = 0; c < channels_; ++c)
      if (void* h = prof_->startKernelCh(p, c, t)) running_.push_back(h);
}

void TaskProfile::end() {
  if (!begun_ || ended_) return;
  ended_ = true;
  const uint64_t t = profilerTimer();
  for (void* h : running_) {
    prof_->record(h, kStateKernelChStop, t);
    prof_->stop(h);
  }
  running_.clear();
}

}  // namespace loom
