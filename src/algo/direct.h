// Direct (one-shot) algorithms for small messages: every rank sends its whole input to
// every other rank and reduces all inputs itself, in rank order, so every rank computes
// bitwise the same result with one network latency.
#pragma once

#include "algo/plan.h"

namespace loom {

// Only for messages that fit in one connection FIFO (see fitsDirect).
Plan directAllReduce(int nranks, int rank, size_t count, size_t eltSize);

}  // namespace loom
