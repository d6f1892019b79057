#include "bench/common/collectives.h"

namespace loom::bench {

const std::vector<NamedCollective>& allCollectives() {
  static const std::vector<NamedCollective> kAll = {
      {"all_reduce_perf", allReduceCollective},
      {"all_gather_perf", allGatherCollective},
      {"reduce_scatter_perf", reduceScatterCollective},
      {"broadcast_perf", broadcastCollective},
      {"reduce_perf", reduceCollective},
      {"alltoall_perf", allToAllCollective},
      {"sendrecv_perf", sendRecvCollective},
      {"gather_perf", gatherCollective},
      {"scatter_perf", scatterCollective},
  };
  return kAll;
}

}  // namespace loom::bench
