#include "engine/tuner_plugin.h"

#include <cstdarg>
#include <cstring>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "engine/plugin_library.h"
#include "engine/tuner_abi.h"
#include "transports/net/plugin_api.h"

namespace loom {
namespace {

using namespace tunerabi;  // NOLINT(google-build-using-namespace): the ABI's own names

StringKnob kTunerPlugin("LOOM_TUNER_PLUGIN", "NCCL_TUNER_PLUGIN", "",
                        "NCCL tuner plugin: unset tries libnccl-tuner.so, then the NCCL net "
                        "plugin's library; a name is tried as given and as "
                        "libnccl-tuner-<name>.so; none: no tuner plugin");

void tunerLogger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pluginLogV(kLogTuning, "TUNER/Plugin", level, flags, file, line, fmt, ap);
  va_end(ap);
}

const PluginKind kTuner{"TUNER/Plugin", &kTunerPlugin, "NCCL_TUNER_PLUGIN", "libnccl-tuner", "ncclTunerPlugin_v",
                        6, 2, kLogTuning, /*staticPlugin=*/true};

const PluginLibrary* processTuner() { return processPlugin(kTuner); }

int funcOf(Collective c) {
  switch (c) {
    case Collective::kBroadcast: return kFuncBroadcast;
    case Collective::kReduce: return kFuncReduce;
    case Collective::kAllGather: return kFuncAllGather;
    case Collective::kReduceScatter: return kFuncReduceScatter;
    case Collective::kAllReduce: return kFuncAllReduce;
    default: return -1;  // NCCL asks tuners about these five only
  }
}

// Loom's (algorithm, protocol) pairs that have a place in NCCL's table.
struct Cell {
  Algorithm algo;
  Protocol proto;
  int row, col;
};
constexpr Cell kCells[] = {
    {Algorithm::kTree, Protocol::kLL, kAlgoTree, kProtoLL},
    {Algorithm::kTree, Protocol::kLL128, kAlgoTree, kProtoLL128},
    {Algorithm::kTree, Protocol::kSimple, kAlgoTree, kProtoSimple},
    {Algorithm::kRing, Protocol::kLL, kAlgoRing, kProtoLL},
    {Algorithm::kRing, Protocol::kLL128, kAlgoRing, kProtoLL128},
    {Algorithm::kRing, Protocol::kSimple, kAlgoRing, kProtoSimple},
};

}  // namespace

std::string processTunerPlugin(std::string* path) { return describeProcessPlugin(kTuner, path); }

std::vector<std::string> tunerLibraryNames(const char* spec) { return pluginLibrariesFor(kTuner, spec); }

std::unique_ptr<TunerPlugin> TunerPlugin::open(uint64_t commId, int nranks, int nnodes, int minPerHost,
                                               int maxPerHost) {
  const PluginLibrary* lib = processTuner();
  if (!lib) return nullptr;
  void* ctx = nullptr;
  Result r = kOk;
  const auto n = static_cast<size_t>(nranks), nodes = static_cast<size_t>(nnodes);
  switch (lib->version) {
    case 2: r = static_cast<const TunerV2*>(lib->table)->init(n, nodes, tunerLogger, &ctx); break;
    case 3: r = static_cast<const TunerV3*>(lib->table)->init(n, nodes, tunerLogger, &ctx); break;
    case 4: r = static_cast<const TunerV4*>(lib->table)->init(n, nodes, tunerLogger, &ctx); break;
    default: {  // v5, and v6, which begins with v5's members
      // Loom's model has no use for NCCL's constants: the plugin gets zeros, and what it
      // writes there changes nothing.
      NvlDomainInfo nvl{nnodes, minPerHost, maxPerHost};
      Constants constants{};
      r = static_cast<const TunerV5*>(lib->table)->init(&ctx, commId, n, nodes, tunerLogger, &nvl, &constants);
    }
  }
  if (r != kOk)  // NCCL fails the init with the plugin's own code
    throwError(r > 0 && r < 7 ? static_cast<Code>(r) : Code::kInternalError,
               "tuner plugin %s: init returned %s (NCCL_TUNER_PLUGIN=none runs without it)",
               lib->describe().c_str(), netResultName(r));
  return std::unique_ptr<TunerPlugin>(new TunerPlugin(*lib, ctx));
}

TunerPlugin::~TunerPlugin() {
  switch (lib_.version) {
    case 2: static_cast<const TunerV2*>(lib_.table)->destroy(ctx_); break;
    case 3: static_cast<const TunerV3*>(lib_.table)->destroy(ctx_); break;
    case 4: static_cast<const TunerV4*>(lib_.table)->destroy(ctx_); break;
    default: static_cast<const TunerV5*>(lib_.table)->finalize(ctx_);  // v6 begins with v5
  }
}

std::string TunerPlugin::describe() const { return lib_.describe(); }

void TunerPlugin::adjust(algo::CostTable& t) {
  const int func = funcOf(t.coll);
  if (func < 0) return;
  float cost[kNumAlgorithms][kNumProtocols];
  for (auto& row : cost)
    for (float& c : row) c = kIgnore;
  for (const Cell& c : kCells) {
    const double us = t.at(c.algo, c.proto);
    if (us >= 0) cost[c.row][c.col] = static_cast<float>(us);
  }
  float before[kNumAlgorithms][kNumProtocols];
  memcpy(before, cost, sizeof(cost));
  int channels = 0;  // as NCCL passes it: a count the plugin sets (> 0) is the one to run
  auto* table = reinterpret_cast<float**>(cost);  // NCCL passes its 2-D array so
  Result r = kOk;
  switch (lib_.version) {
    case 2: {
      int algo = kAlgoUndef, proto = kAlgoUndef;
      r = static_cast<const TunerV2*>(lib_.table)->getCollInfo(ctx_, func, t.bytes, 0, 0, 1, &algo, &proto, &channels);
      // As NCCL adapts v2: the named pair, if it can run, costs nothing.
      if (r == kOk && algo >= 0 && algo < kNumAlgorithms && proto >= 0 && proto < kNumProtocols &&
          cost[algo][proto] != kIgnore)
        cost[algo][proto] = 0;
      break;
    }
    case 3:
      r = static_cast<const TunerV3*>(lib_.table)->getCollInfo(ctx_, func, t.bytes, 1, table, kNumAlgorithms,
                                                              kNumProtocols, &channels);
      break;
    case 4:
      r = static_cast<const TunerV4*>(lib_.table)->getCollInfo(ctx_, func, t.bytes, 1, table, kNumAlgorithms,
                                                              kNumProtocols, 0, &channels);
      break;
    default:  // v5, and v6, which begins with v5's members
      r = static_cast<const TunerV5*>(lib_.table)->getCollInfo(ctx_, func, t.bytes, 1, table, kNumAlgorithms,
                                                              kNumProtocols, 0, &channels);
  }
  if (r != kOk) {
    if (!warned_)
      LOOM_WARN("tuner plugin %s: getCollInfo(%s, %zu bytes) returned %s; the cost model's choice stands where it "
                "fails", describe().c_str(), collectiveName(t.coll), t.bytes, netResultName(r));
    warned_ = true;
    return;
  }
  // Only pairs Loom can run take the plugin's word; -1 (or any negative) rules one out.
  // Equal costs rank in NCCL's order (Tree before Ring; LL, LL128, Simple), as NCCL takes
  // the first minimum it scans: each edited cell is nudged by its place in that order.
  for (const Cell& c : kCells) {
    const float v = cost[c.row][c.col];
    if (before[c.row][c.col] == kIgnore || v == before[c.row][c.col]) continue;  // untouched: the model's own
    t.at(c.algo, c.proto) = v < 0 ? -1.0 : static_cast<double>(v) + 1e-6 * (c.row * kNumProtocols + c.col);
  }
  if (channels > 0) t.channels = channels;
}

size_t TunerPlugin::chunkBytes(const algo::ChunkQuery& q) {
  if (lib_.version < 6) return 0;
  const auto* v6 = static_cast<const TunerV6*>(lib_.table);
  const int func = funcOf(q.coll);
  const Cell* cell = nullptr;
  for (const Cell& c : kCells)
    if (c.algo == q.algo && c.proto == q.proto) cell = &c;
  if (!v6->getChunkSize || func < 0 || !cell) return 0;  // optional; NCCL has no such candidate
  size_t chunk = q.chunkBytes;  // in/out, as NCCL passes its own
  const Result r = v6->getChunkSize(ctx_, func, q.bytes, cell->row, cell->col, q.channels, &chunk);
  if (r == kOk) return chunk;
  // NCCL fails the collective here; Loom asks at init, where the model's chunk can stand.
  if (!chunkWarned_)
    LOOM_WARN("tuner plugin %s: getChunkSize(%s, %zu bytes, %s/%s, %d channels) returned %s; the cost model's "
              "chunk stands where it fails", describe().c_str(), collectiveName(q.coll), q.bytes,
              algorithmName(q.algo), protocolName(q.proto), q.channels, netResultName(r));
  chunkWarned_ = true;
  return 0;
}

}  // namespace loom
