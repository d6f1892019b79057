// Which instruction set the reductions use by default: kernels/ reads no configuration, so
// LOOM_CPU_ISA reaches it through the chooser src/base installs. The choice is made once
// per process, so each case runs in a fresh one (a death test re-executes this binary).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

#include "kernels/reduce.h"

namespace loom {
namespace {

// In a fresh process with LOOM_CPU_ISA=value (unset for nullptr): prints the ISA the
// reductions use by default and exits.
void reportDefaultIsa(const char* value) {
  if (value) setenv("LOOM_CPU_ISA", value, 1);
  else unsetenv("LOOM_CPU_ISA");
  fprintf(stderr, "default=%s made=%s\n", cpuIsaName(activeCpuIsa()),
          cpuIsaName(Reducer::make(7 /* float */, 0 /* sum */, 2).isa));
  _exit(0);
}

std::string expectLine(CpuIsa isa) {
  return std::string("default=") + cpuIsaName(isa) + " made=" + cpuIsaName(isa);
}

class CpuIsaChoice : public testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CpuIsaChoice, KnobPicksTheLoops) {
  EXPECT_EXIT(reportDefaultIsa("generic"), testing::ExitedWithCode(0),
              expectLine(CpuIsa::kGeneric));
  if (cpuIsaSupported(CpuIsa::kAvx2)) {
    EXPECT_EXIT(reportDefaultIsa("avx2"), testing::ExitedWithCode(0), expectLine(CpuIsa::kAvx2));
  }
}

TEST_F(CpuIsaChoice, AutoUnknownOrMissingMeanTheBest) {
  EXPECT_EXIT(reportDefaultIsa(nullptr), testing::ExitedWithCode(0), expectLine(bestCpuIsa()));
  EXPECT_EXIT(reportDefaultIsa("auto"), testing::ExitedWithCode(0), expectLine(bestCpuIsa()));
  EXPECT_EXIT(reportDefaultIsa("bogus"), testing::ExitedWithCode(0), expectLine(bestCpuIsa()));
  for (int i = 0; i < kNumCpuIsas; ++i) {
    if (cpuIsaSupported(CpuIsa(i))) continue;
    EXPECT_EXIT(reportDefaultIsa(cpuIsaName(CpuIsa(i))), testing::ExitedWithCode(0),
                expectLine(bestCpuIsa()));
  }
}

// The chooser alone, without the knob: a pick this CPU lacks is ignored.
TEST_F(CpuIsaChoice, ChooserPickOutsideTheCpuIsIgnored) {
  auto run = [](CpuIsaChooser chooser) {
    setCpuIsaChooser(chooser);
    fprintf(stderr, "default=%s\n", cpuIsaName(activeCpuIsa()));
    _exit(0);
  };
  EXPECT_EXIT(run([](CpuIsa) { return CpuIsa::kGeneric; }), testing::ExitedWithCode(0),
              "default=generic");
  EXPECT_EXIT(run([](CpuIsa) { return CpuIsa(kNumCpuIsas); }), testing::ExitedWithCode(0),
              std::string("default=") + cpuIsaName(bestCpuIsa()));
}

}  // namespace
}  // namespace loom
