// NCCL tuner plugins, loaded as NCCL loads them, as the cost model's tuner hook
// (algo/tuner_hook.h).
//
// NCCL_TUNER_PLUGIN unset: "libnccl-tuner.so"; "none" (any case): no plugin;
// "STATIC_PLUGIN": the program itself; else the name as given, then
// libnccl-tuner-<name>.so (unless it holds a '/' or is already lib*.so). When none of those
// loads, the NCCL net plugin libraries this process loaded (NCCL_NET_PLUGIN) are searched
// (NCCL searches the one it uses). In the library the newest ncclTunerPlugin_v<N> symbol
// wins (v6, NCCL 2.29's, down to v2). Loaded once per process (per value of the knob) and
// never unloaded; each communicator initialises the plugin for itself and finalises it
// when destroyed.
//
// Where NCCL asks the plugin per call, Loom asks it when a communicator ranks its
// candidates: once per collective (the five NCCL asks about) and power-of-two size class,
// with that size. The table the plugin sees is Loom's cost model in NCCL's shape: Loom's
// ring and tree in NCCL's Ring and Tree rows (protocols Loom's executor cannot run, and
// NCCL's other algorithms, are NCCL_ALGO_PROTO_IGNORE). What the plugin writes there goes
// back into Loom's table, where Loom's own algorithms (halving-doubling, one-shot,
// hierarchical) compete with their model times: a plugin that sets an entry to 0, as
// NCCL's own tuners do, makes it the choice (equal costs in NCCL's order); -1 rules it out.
// A channel count it sets (NCCL passes 0) is the communicator's for that collective and
// size. A v6 plugin's getChunkSize is asked, right after, about each candidate of that size
// class in NCCL's Ring and Tree rows that the table leaves feasible, with NCCL's numbers
// (ncclFunc_t, NCCL_ALGO_*, NCCL_PROTO_*), the size class, the plan's channels and the
// model's chunk in *chunkSize; what it sets is that candidate's chunk for the size class
// (algo/select.h: clamped to the buffers; 0, its own value back or a failure keep the
// model's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "algo/tuner_hook.h"
#include "engine/plugin_library.h"

namespace loom {

// The libraries NCCL_TUNER_PLUGIN's value (null: unset) names, in the order they are tried.
std::vector<std::string> tunerLibraryNames(const char* spec);

// What this process's NCCL_TUNER_PLUGIN loads (loading it if need be): "<name> (v<N>,
// <path>)" with *path set, or why there is none with *path empty.
std::string processTunerPlugin(std::string* path);

class TunerPlugin final : public algo::TunerHook {
 public:
  // The process's tuner plugin initialised for one communicator; null when there is none.
  // Throws the plugin's error code, naming the plugin, when its init fails (NCCL fails the
  // communicator's init then too).
  static std::unique_ptr<TunerPlugin> open(uint64_t commId, int nranks, int nnodes,
                                           int minPerHost, int maxPerHost);
  ~TunerPlugin() override;  // the plugin's finalize (destroy before v5)

  void adjust(algo::CostTable& table) override;
  // v6's getChunkSize for the candidates NCCL has (its Ring and Tree), with NCCL's numbers;
  // 0 where there is none, the candidate is Loom's own, or the call fails.
  size_t chunkBytes(const algo::ChunkQuery& q) override;
  std::string describe() const;  // "<name> (v<N>, <path>)"

 private:
  TunerPlugin(const PluginLibrary& lib, void* ctx) : lib_(lib), ctx_(ctx) {}
  const PluginLibrary& lib_;
  void* ctx_;
  bool warned_ = false;       // a failed getCollInfo is reported once per communicator
  bool chunkWarned_ = false;  // and a failed getChunkSize
};

}  // namespace loom
