// Hierarchical collectives for communicators that span hosts: the fast intra-host links
// do the bulk of the work and each host's network traffic is split across its local ranks
// (one rail per local rank), so every host sends 2(N-1)/N of the buffer over the network
// for an all-reduce on N hosts instead of the flat ring's 2(n-1)/n on n ranks.
//
//   AllReduce      intra-host reduce-scatter -> inter-host all-reduce per rail ->
//                  intra-host all-gather. Hosts may hold different numbers of ranks: the
//                  buffer is cut into R = min(ranks per host) parts, local rank j < R owns
//                  part j, and local ranks >= R only relay inside their host.
//   ReduceScatter  intra-host reduce-scatter of every rail's blocks -> inter-host
//                  reduce-scatter per rail. Local rank o's block travels on rail o % R,
//                  so on hosts with more than R ranks a rail rank finishes several blocks
//                  and hands them to their owners.
//   AllGather      the mirror: blocks of ranks beyond R go to their rail's rank ->
//                  inter-host all-gather per rail -> intra-host all-gather.
//   Broadcast      part k of R goes from the root to local rank k of its host and down a
//                  chain of hosts along rail k -> intra-host all-gather.
//   Reduce         intra-host reduce-scatter -> part k up a chain of hosts along rail k to
//                  the root's host, and on to the root.
// Every rail carries 1/R of the data, so hosts with one NIC per rail use all of them.
#pragma once

#include <cstddef>
#include <vector>

#include "algo/plan.h"

namespace loom {

// Which ranks share a host. hosts[h] lists host h's ranks in rank order; hosts are
// ordered by their lowest rank. Every rank of the communicator appears exactly once.
struct HostLayout {
  std::vector<std::vector<int>> hosts;
  int host = 0;   // this rank's host
  int local = 0;  // this rank's index within hosts[host]

  int nhosts() const { return static_cast<int>(hosts.size()); }
  int minLocal() const;      // fewest ranks on one host
  int maxLocal() const;      // most ranks on one host
  static HostLayout single(int nranks, int rank);
};

// chunkBytes bounds one pipeline step, as for the ring algorithms. With `channels` > 1
// each channel carries its share of the buffer (of every per-rank block, for all-gather
// and reduce-scatter) through all phases on connections of its own.
Plan hierarchicalAllReduce(const HostLayout& l, size_t count, size_t eltSize, size_t chunkBytes,
                           int channels = 1);
Plan hierarchicalReduceScatter(const HostLayout& l, size_t count, size_t eltSize,
                               size_t chunkBytes, int channels = 1);
Plan hierarchicalAllGather(const HostLayout& l, size_t count, size_t eltSize, size_t chunkBytes,
                           int channels = 1);
Plan hierarchicalBroadcast(const HostLayout& l, int root, size_t count, size_t eltSize,
                           size_t chunkBytes, int channels = 1);
Plan hierarchicalReduce(const HostLayout& l, int root, size_t count, size_t eltSize,
                        size_t chunkBytes, int channels = 1);

}  // namespace loom
