// Helpers shared by the topology tests.
#pragma once

#include <string>

#include "topo/load.h"
#include "topo/system.h"

namespace loom::topo::test {

inline std::string fixture(const std::string& name) {
  std::string path = LOOM_TOPO_FIXTURES;
  path += '/';
  path += name;
  return path;
}
inline System loadFixture(const std::string& name) { return loadSystemFile(fixture(name)); }

}  // namespace loom::topo::test
