// The libraries of NCCL's plugins of one kind beside the network's (tuner, profiler), found
// as NCCL 2.28 finds them: the library the kind's variable names (unset or empty:
// <prefix>.so; none, in any case: no plugin; STATIC_PLUGIN: the program itself; else the
// name as given, then <prefix>-<name>.so unless it holds a '/' or is already lib*.so), else,
// when that does not load, the NCCL net plugin libraries this process loaded; in the library
// the newest <symbol><N> of the versions Loom takes. Loaded once per process and value of
// the variable, and never unloaded: plugins keep state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

class StringKnob;

struct PluginLibrary {
  int version = 0;              // 0: the library loaded but has no table Loom takes (`why`)
  const void* table = nullptr;  // the exported <symbol><version>
  std::string name, path, why;
  std::string describe() const;  // "<name> (v<N>, <path>)"
};

struct PluginKind {
  const char* log;          // "TUNER/Plugin": the log lines' prefix
  const StringKnob* knob;   // LOOM_TUNER_PLUGIN / NCCL_TUNER_PLUGIN
  const char* variable;     // "NCCL_TUNER_PLUGIN", for messages
  const char* prefix;       // "libnccl-tuner"
  const char* symbol;       // "ncclTunerPlugin_v"
  int newest, oldest;       // the versions Loom takes
  uint64_t logSubsys;       // the log lines' subsystem
  bool staticPlugin;        // STATIC_PLUGIN names the program itself
};

// The libraries a value of the kind's variable (null: unset) names, in the order they are tried.
std::vector<std::string> pluginLibrariesFor(const PluginKind& kind, const char* spec);

// The plugin of `kind` this process's variable gives (loading it if need be); null when
// there is none, *why (if given) saying why.
const PluginLibrary* processPlugin(const PluginKind& kind, std::string* why = nullptr);

// What loom-info shows: "<name> (v<N>, <path>)" with *path set, or why there is none with
// *path empty.
std::string describeProcessPlugin(const PluginKind& kind, std::string* path);

}  // namespace loom
