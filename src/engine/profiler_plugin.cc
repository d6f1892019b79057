#include "engine/profiler_plugin.h"

#include <algorithm>
#include <cstdarg>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "base/time.h"
#include "engine/plugin_library.h"
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

const PluginKind kProfiler{"PROFILER/Plugin", &kProfilerPlugin, "NCCL_PROFILER_PLUGIN", "libnccl-profiler",
                           "ncclProfiler_v", 6, 4, kLogInit, /*staticPlugin=*/true};

const ProfilerV4& v4(const PluginLibrary& lib) { return *static_cast<const ProfilerV4*>(lib.table); }
const ProfilerV5& v5(const PluginLibrary& lib) { return *static_cast<const ProfilerV5*>(lib.table); }

}  // namespace

std::vector<std::string> profilerLibraryNames(const char* spec) { return pluginLibrariesFor(kProfiler, spec); }

std::string processProfilerPlugin(std::string* path) { return describeProcessPlugin(kProfiler, path); }


std::unique_ptr<Profiler> Profiler::open(uint64_t commHash, const char* commName, int nNodes, int nranks,
                                         int rank) {
  const PluginLibrary* lib = processPlugin(kProfiler);
  if (!lib) return nullptr;
  void* ctx = nullptr;
  const Result r = lib->version == 4
                       ? v4(*lib).init(&ctx, &gEventMask, commName, commHash, nNodes, nranks, rank, profilerLogger)
                       : v5(*lib).init(&ctx, commHash, &gEventMask, commName, nNodes, nranks, rank, profilerLogger);
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
  if (lib_.version == 4) v4(lib_).finalize(ctx_);
  else v5(lib_).finalize(ctx_);
}

bool Profiler::wants(int mask) const { return (eventMask() & mask) != 0; }

namespace {

// Starts a v5 event (v6: the same prefix); null when the plugin gives no handle.
void* startV5(const PluginLibrary& lib, void* ctx, DescrV5& d) {
  void* h = nullptr;
  if (v5(lib).startEvent(ctx, &h, &d) != kOk) return nullptr;
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
  d.collApi.func = collectiveName(coll);
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

namespace {

// Starts a task or channel event in the library's descriptor layout: v4's parent is
// `parent4` (a task's group), v5's `parent5` (its API event); `fill4` / `fill5` set the
// union's members.
template <class Fill4, class Fill5>
void* startTask(const PluginLibrary& lib, void* ctx, int rank, int type, void* parent4, void* parent5, Fill4 fill4,
                Fill5 fill5) {
  if (lib.version == 4) {
    DescrV4 d{};
    d.type = static_cast<uint8_t>(type);
    d.parentObj = parent4;
    d.rank = rank;
    fill4(d);
    void* h = nullptr;
    return v4(lib).startEvent(ctx, &h, &d) == kOk ? h : nullptr;
  }
  DescrV5 d{};
  d.type = static_cast<uint64_t>(type);
  d.parentObj = parent5;
  d.rank = rank;
  fill5(d);
  return startV5(lib, ctx, d);
}

}  // namespace

void* Profiler::startGroup() {
  if (!wants(kGroupNeeds)) return nullptr;
  return startTask(lib_, ctx_, rank_, kGroup, nullptr, nullptr, [](DescrV4&) {}, [](DescrV5&) {});
}

void* Profiler::startColl(void* api, void* group, Collective coll, const void* sendbuff, void* recvbuff,
                          size_t count, int dtype, int root, int nChannels, const char* algo, const char* proto) {
  // Numbered whether or not the event is made, so that ranks agree on the numbers.
  const uint64_t seq = seq_[static_cast<int>(coll)].fetch_add(1, std::memory_order_relaxed);
  if (!wants(kCollNeeds)) return nullptr;
  CollFields c{};
  c.seqNumber = seq;
  c.func = collectiveName(coll);
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
  return startTask(lib_, ctx_, rank_, kColl, group, api, [&](DescrV4& d) { d.coll = c; },
                   [&](DescrV5& d) {
                     d.coll.c = c;
                     d.coll.parentGroup = group;
                   });
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
  return startTask(lib_, ctx_, rank_, kP2p, group, api, [&](DescrV4& d) { d.p2p = p; },
                   [&](DescrV5& d) {
                     d.p2p.p = p;
                     d.p2p.parentGroup = group;
                   });
}

void* Profiler::startKernelCh(void* task, int channel, uint64_t pTimer) {
  if (!task || !wants(kKernelCh)) return nullptr;
  const KernelChFields k{static_cast<uint8_t>(channel), pTimer};
  return startTask(lib_, ctx_, rank_, kKernelCh, task, task, [&](DescrV4& d) { d.kernelCh = k; },
                   [&](DescrV5& d) { d.kernelCh = k; });
}

void Profiler::record(void* event, int state, uint64_t pTimer) {
  if (!event) return;
  StateArgs a{};
  a.kernelCh.pTimer = pTimer;
  StateArgs* args = state == kStateKernelChStop ? &a : nullptr;
  if (lib_.version == 4) v4(lib_).recordEventState(event, state, args);
  else v5(lib_).recordEventState(event, state, args);
}

void Profiler::stop(void* event) {
  if (!event) return;
  if (lib_.version == 4) v4(lib_).stopEvent(event);
  else v5(lib_).stopEvent(event);
}

void TaskProfile::begin() {
  if (begun_ || !prof_) return;
  begun_ = true;
  const uint64_t t = realtimeNs();
  for (void* p : parents_)
    for (int c = 0; c < channels_; ++c)
      if (void* h = prof_->startKernelCh(p, c, t)) running_.push_back(h);
}

void TaskProfile::end() {
  if (!begun_ || ended_) return;
  ended_ = true;
  const uint64_t t = realtimeNs();
  for (void* h : running_) {
    prof_->record(h, kStateKernelChStop, t);
    prof_->stop(h);
  }
  running_.clear();
}

}  // namespace loom
