// Internal to kernels/: the table of CPU loops one instruction set provides. Each
// reduce_<isa>.cc builds the loops of kernels/cpu_loops.h for its target and fills a table;
// reduce.cc picks the table once and Reducer copies pointers out of it.
#pragma once

#include "kernels/reduce.h"

namespace loom {

struct CpuKernelTable {
  RedBinaryFn binary[kNumDataTypes][4] = {};  // a OP b for Sum, Prod, Max, Min
  RedBinaryFn preSum[kNumDataTypes] = {};     // a + scale(b)
  RedUnaryFn pre[kNumDataTypes] = {};         // scale(x): PreMulSum's pre-op
  RedUnaryFn post[kNumDataTypes] = {};        // SumPostDiv's post-op (ints divide, floats scale)
};

void fillGenericKernels(CpuKernelTable* table);
void fillAvx2Kernels(CpuKernelTable* table);    // call only where avx2 and f16c exist
void fillAvx512Kernels(CpuKernelTable* table);  // likewise avx512f/bw/vl and f16c

}  // namespace loom
