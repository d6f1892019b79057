// CPU loops for any x86-64 (or other) CPU: baseline vector width, no F16C.

// fp-contract=off: a pre-op's product is rounded before the sum, as on the device (never
// fused). no-trapping-math: lets the vectoriser evaluate both arms of the conversions'
// selects; nothing here reads FP exception flags. Set before the includes so that it also
// governs kernels/arith.h's inline functions as inlined here.
#pragma GCC optimize("fp-contract=off", "no-trapping-math")

#include "kernels/arith.h"
#include "kernels/cpu_kernels.h"

#define LOOM_CPU_NS cpu_generic
#include "kernels/cpu_loops.h"

namespace loom {

void fillGenericKernels(CpuKernelTable* table) { cpu_generic::fillAllTypes(table); }

}  // namespace loom
