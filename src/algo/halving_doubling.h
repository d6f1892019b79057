// Recursive halving-doubling all-reduce (Rabenseifner): reduce-scatter by recursive
// halving, then all-gather by recursive doubling, with the usual fix-up when the number
// of ranks is not a power of two (the first 2*rem ranks pair up; one of each pair sits
// out the core exchange and receives the final result).
#pragma once

#include "algo/plan.h"

namespace loom {

// exchangeChunk: the most one rank sends before it receives in a pairwise exchange; it
// must fit in a connection FIFO (slotBytes * depth / 2 or less) so exchanges never stall.
Plan halvingDoublingAllReduce(int nranks, int rank, size_t count, size_t eltSize,
                              size_t exchangeChunk);

}  // namespace loom
