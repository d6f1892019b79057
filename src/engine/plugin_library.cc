#include "engine/plugin_library.h"

#include <dlfcn.h>
#include <strings.h>

#include <map>
#include <mutex>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "transports/net/plugin_api.h"

namespace loom {
namespace {

// The newest table of the kind's versions `lib` exports; false if none.
bool findTable(const PluginKind& kind, void* lib, const std::string& fallbackPath, PluginLibrary* out) {
  for (int v = kind.newest; v >= kind.oldest; --v) {
    const void* t = dlsym(lib, (kind.symbol + std::to_string(v)).c_str());
    if (!t) continue;
    out->version = v;
    out->table = t;
    const char* name = *static_cast<const char* const*>(t);  // every version's first member
    out->name = name ? name : "?";
    Dl_info info;
    out->path = dladdr(t, &info) && info.dli_fname ? info.dli_fname : fallbackPath;
    return true;
  }
  return false;
}

// Why a library that loads has no table Loom takes.
std::string noTable(const PluginKind& kind, void* lib, const std::string& n) {
  for (int v = kind.oldest - 1; v >= 1; --v)
    if (dlsym(lib, (kind.symbol + std::to_string(v)).c_str()))
      return strprintf("%s exports only %s%d or older, which Loom does not load", n.c_str(), kind.symbol, v);
  return strprintf("%s loads but exports no %s%d..v%d symbol", n.c_str(), kind.symbol, kind.oldest, kind.newest);
}

// What the variable (null: unset) names. Null when nothing loads; a library of version 0
// when one loads without a table (NCCL then looks no further).
const PluginLibrary* loadByName(const PluginKind& kind, const char* spec) {
  std::string tried;
  for (const std::string& n : pluginLibrariesFor(kind, spec)) {
    dlerror();
    const bool inProgram = kind.staticPlugin && strcasecmp(n.c_str(), "STATIC_PLUGIN") == 0;
    void* h = dlopen(inProgram ? nullptr : n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* err = dlerror();
      tried += strprintf("%s%s (%s)", tried.empty() ? "" : "; ", n.c_str(), err ? err : "not found");
      continue;
    }
    auto* lib = new PluginLibrary;  // lives as long as the process
    if (findTable(kind, h, n, lib)) {
      LOOM_INFO(kind.logSubsys | kLogInit, "%s: loaded %s", kind.log, lib->describe().c_str());
      return lib;
    }
    lib->why = noTable(kind, h, n);
    if (spec) LOOM_WARN("%s: %s: no plugin", kind.log, lib->why.c_str());
    else LOOM_INFO(kind.logSubsys | kLogInit, "%s: %s", kind.log, lib->why.c_str());
    dlclose(h);
    return lib;
  }
  if (spec)
    LOOM_WARN("%s: %s=%s: could not load %s; looking in the net plugins' libraries", kind.log, kind.variable, spec,
              tried.c_str());
  else
    LOOM_INFO(kind.logSubsys | kLogInit, "%s: %s; looking in the net plugins' libraries", kind.log, tried.c_str());
  return nullptr;
}

// The table of a net plugin's library (loaded already), or null.
const PluginLibrary* loadFromNetPlugin(const PluginKind& kind, const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) return nullptr;
  auto* lib = new PluginLibrary;
  if (findTable(kind, h, path, lib)) {
    LOOM_INFO(kind.logSubsys | kLogInit, "%s: loaded %s from the net plugin's library", kind.log,
              lib->describe().c_str());
    return lib;
  }
  dlclose(h);
  delete lib;
  return nullptr;
}

}  // namespace

std::string PluginLibrary::describe() const { return strprintf("%s (v%d, %s)", name.c_str(), version, path.c_str()); }

std::vector<std::string> pluginLibrariesFor(const PluginKind& kind, const char* spec) {
  if (!spec || !*spec) return {std::string(kind.prefix) + ".so"};
  return pluginLibraryNames(spec, kind.prefix);
}

const PluginLibrary* processPlugin(const PluginKind& kind, std::string* why) {
  static std::mutex mu;
  // Per kind (its symbol) and value ("\x01": unset); per kind and net plugin library.
  static auto* byName = new std::map<std::pair<std::string, std::string>, const PluginLibrary*>;
  static auto* byNetPlugin = new std::map<std::pair<std::string, std::string>, const PluginLibrary*>;
  const std::string value = kind.knob->get();
  const bool set = kind.knob->isSet() && !value.empty();  // empty: unset, as NCCL
  if (set && strcasecmp(value.c_str(), "none") == 0) {
    if (why) *why = strprintf("none (%s=none)", kind.variable);
    return nullptr;
  }
  std::lock_guard<std::mutex> g(mu);
  const auto key = std::make_pair(std::string(kind.symbol), set ? value : std::string("\x01"));
  auto it = byName->find(key);
  if (it == byName->end()) it = byName->emplace(key, loadByName(kind, set ? value.c_str() : nullptr)).first;
  if (it->second && !it->second->version && why) *why = "none: " + it->second->why;
  if (it->second) return it->second->version ? it->second : nullptr;
  // As NCCL: the net plugin's library, when no library of the kind loads.
  for (const auto& net : processNetPlugins().plugins) {
    const auto netKey = std::make_pair(std::string(kind.symbol), net->path());
    auto n = byNetPlugin->find(netKey);
    if (n == byNetPlugin->end()) n = byNetPlugin->emplace(netKey, loadFromNetPlugin(kind, net->path())).first;
    if (n->second) return n->second;
  }
  if (why)
    *why = strprintf("none: %s does not load and no net plugin library exports one",
                     set ? value.c_str() : (std::string(kind.prefix) + ".so").c_str());
  return nullptr;
}

std::string describeProcessPlugin(const PluginKind& kind, std::string* path) {
  std::string why;
  const PluginLibrary* lib = processPlugin(kind, &why);
  *path = lib ? lib->path : "";
  return lib ? lib->describe() : why;
}

}  // namespace loom
