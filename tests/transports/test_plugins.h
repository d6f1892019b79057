// Loom's test net plugins (tests/transports/test_net_plugin.cc), one per ABI version.
#pragma once

#include <string>

#include "transports/net/plugin_api.h"

namespace loomtest {

inline std::string testPluginPath(const std::string& which) {  // "6".."11", "multi"
  return std::string(LOOM_TEST_NET_PLUGIN_DIR) + "/libnccl-net-loomtest-" +
         (which == "multi" ? which : "v" + which) + ".so";
}

// The plugin of ABI version `v`, loaded once.
inline std::shared_ptr<loom::PluginApi> testPlugin(int v) {
  static std::shared_ptr<loom::PluginApi> loaded[12];
  if (!loaded[v]) {
    loom::PluginLoad l = loom::loadNetPlugins(testPluginPath(std::to_string(v)).c_str());
    if (l.plugins.size() == 1) loaded[v] = l.plugins[0];
  }
  return loaded[v];
}

}  // namespace loomtest
