// The nine collectives, one file each under bench/ (all_reduce.cc, ...).
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "bench/common/collective.h"

namespace loom::bench {

const Collective& allReduceCollective();
const Collective& allGatherCollective();
const Collective& reduceScatterCollective();
const Collective& broadcastCollective();
const Collective& reduceCollective();
const Collective& allToAllCollective();
const Collective& sendRecvCollective();
const Collective& gatherCollective();
const Collective& scatterCollective();

struct NamedCollective {
  const char* tool;  // "all_reduce_perf"
  const Collective& (*get)();
};
const std::vector<NamedCollective>& allCollectives();

}  // namespace loom::bench
