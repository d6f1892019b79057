// CPU loops for any x86-64 (or other) CPU: baseline vector width, no F16C.
#include "kernels/arith.h"
#include "kernels/cpu_kernels.h"

// A pre-op's product must be rounded before the sum, as on the device: never fuse.
#pragma GCC optimize("fp-contract=off")
#define LOOM_CPU_NS cpu_generic
#include "kernels/cpu_loops.h"

namespace loom {

void fillGenericKernels(CpuKernelTable* table) { cpu_generic::fillAllTypes(table); }

}  // namespace loom
