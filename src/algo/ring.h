// Ring algorithms. A ring is an order of the communicator's ranks; each rank sends to its
// successor and receives from its predecessor.
#pragma once

#include <cstddef>
#include <vector>

#include "algo/plan.h"

namespace loom {

struct Ring {
  std::vector<int> order;  // ranks in ring order
  int pos = 0;             // this rank's index in order

  int size() const { return static_cast<int>(order.size()); }
  int at(int i) const { int n = size(); return order[((i % n) + n) % n]; }
  int next() const { return at(pos + 1); }
  int prev() const { return at(pos - 1); }
  // How many hops after `rank` this rank sits along the ring.
  int distanceFrom(int rank) const {
    int p = 0;
    while (order[p] != rank) ++p;
    return ((pos - p) % size() + size()) % size();
  }

  static Ring identity(int nranks, int rank);
};

// counts are elements of eltSize bytes. chunkBytes bounds what one ring step carries (0:
// no bound, one step per share); for all-reduce, all-gather and reduce-scatter it must fit
// in half a connection FIFO (every rank sends before it receives). With `channels` > 1
// each channel carries its share of the buffer over connections of its own (index =
// channel), so the shares pipeline side by side. The plans are size-free (see Loop in
// plan.h): they take no count, and run any.
// rings: channel c runs on rings[c % rings.size()] (all of the same ranks).
Plan ringAllReduce(const std::vector<Ring>& rings, size_t eltSize, size_t chunkBytes, int channels = 1);
Plan ringAllGather(const std::vector<Ring>& rings, int rank, size_t eltSize, size_t chunkBytes,
                   int channels = 1);
Plan ringReduceScatter(const std::vector<Ring>& rings, int rank, size_t eltSize,
                       size_t chunkBytes, int channels = 1);
// A chain from (or to) the root. chunkBytes 0: one step per message, which the executor
// still streams slot by slot.
Plan ringBroadcast(const std::vector<Ring>& rings, int rank, int root, size_t eltSize,
                   size_t chunkBytes = 0, int channels = 1);
Plan ringReduce(const std::vector<Ring>& rings, int rank, int root, size_t eltSize,
                size_t chunkBytes = 0, int channels = 1);

}  // namespace loom
