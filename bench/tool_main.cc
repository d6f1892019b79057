// main() of every *_perf tool; CMake compiles it once per tool with LOOM_BENCH_COLLECTIVE
// naming the tool's collective (see bench/CMakeLists.txt).
#include "bench/common/collectives.h"
#include "bench/common/runner.h"

#ifndef LOOM_BENCH_COLLECTIVE
#error "LOOM_BENCH_COLLECTIVE must name a collective factory, e.g. allReduceCollective"
#endif

int main(int argc, char** argv) {
  return loom::bench::benchMain(argc, argv, loom::bench::LOOM_BENCH_COLLECTIVE());
}
