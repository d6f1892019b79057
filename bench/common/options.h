// nccl-tests' command line (src/common.cu of nccl-tests 2.19), plus Loom's additions:
//   --nranks N / -np N     fork N local ranks (processes), like `mpirun -np N`
//   -M host|device|auto    memory kind of the buffers (-M 0/1 keeps nccl-tests' meaning:
//   --memory_kind KIND     memory usage report)
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "bench/common/datatypes.h"

namespace loom::bench {

enum class MemoryKind { kAuto, kHost, kDevice };

struct Options {
  int nThreads = 1;
  int nGpus = 1;
  size_t minBytes = 32u << 20;
  size_t maxBytes = 32u << 20;
  size_t stepBytes = 1u << 20;
  size_t stepFactor = 1;
  int iters = 20;
  int aggIters = 1;
  int warmupIters = 1;
  int runCycles = 1;  // 0 = forever
  int parallelInit = 0;
  int datacheck = 1;
  const OpInfo* op = nullptr;      // nullptr = all ("-o all")
  const TypeInfo* type = nullptr;  // nullptr = all ("-d all")
  int root = 0;                    // -1 = all
  int blocking = 0;
  int streamNull = 0;
  int timeoutSec = 0;
  int cudaGraphLaunches = 0;
  int reportCputime = 0;
  int reportTimestamps = 0;
  std::string outputFile;
  int average = 1;  // 0 rank 0, 1 avg, 2 min, 3 max
  int localRegister = 0;
  int ctaPolicy = -1;
  int deviceImpl = 0;
  int deviceCtaCount = 16;
  int memoryReport = 0;
  MemoryKind memoryKind = MemoryKind::kAuto;
  int unalign = 0;
  int perIterTiming = 0;
  int perIterSkip = 0;
  int nranks = 0;  // built-in launcher: processes to fork (0: not asked for)
  bool help = false;
  // Messages nccl-tests prints while parsing ("invalid type x, defaulting to float ..").
  std::vector<std::string> notes;
};

// Parses argv[1..argc). Throws BenchError(kInvalidUsage) with nccl-tests' message on an
// invalid option or value. Defaults: float, sum, as nccl-tests.
Options parseOptions(int argc, const char* const* argv);
std::string usage(const char* programName);

// nccl-tests' size syntax: a number with an optional K/M/G suffix (binary units).
// Returns -1 on a malformed value.
double parseSize(const char* text);

const char* memoryKindName(MemoryKind kind);

}  // namespace loom::bench
