// LOOM_CPU_ISA: which instruction set the CPU reduction loops use. kernels/ sits below base
// and reads no configuration, so the knob lives here and reaches the kernels as their CPU
// ISA chooser, installed while the library loads and asked at the first reduction.
#include <string>

#include "base/config.h"
#include "base/log.h"
#include "kernels/reduce.h"

namespace loom {
namespace {

StringKnob kCpuIsa("LOOM_CPU_ISA", "", "auto",
                   "Instruction set of the CPU reduction loops: auto (the best this CPU has), "
                   "generic, avx2 or avx512");

CpuIsa chooseFromKnob(CpuIsa best) {
  std::string want = kCpuIsa.get();
  if (want == "auto" || want.empty()) return best;
  for (int i = 0; i < kNumCpuIsas; ++i) {
    if (want != cpuIsaName(CpuIsa(i))) continue;
    if (cpuIsaSupported(CpuIsa(i))) return CpuIsa(i);
    LOOM_WARN("LOOM_CPU_ISA=%s: this CPU lacks it; using %s", want.c_str(), cpuIsaName(best));
    return best;
  }
  LOOM_WARN("LOOM_CPU_ISA=%s is not one of auto, generic, avx2, avx512; using %s", want.c_str(),
            cpuIsaName(best));
  return best;
}

[[maybe_unused]] const bool kInstalled = (setCpuIsaChooser(&chooseFromKnob), true);

}  // namespace
}  // namespace loom
