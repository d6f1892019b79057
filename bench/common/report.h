// nccl-tests' text output, line for line (src/util.cu of nccl-tests 2.19): header block,
// column headers, one row per size, footer. Pure string builders, so the format is
// unit-tested; the runner decides who prints (global rank 0 only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/common/options.h"

namespace loom::bench {

// nccl-tests' getFloatStr: the value in `width` columns, with as many decimals as fit.
std::string floatStr(double value, int width);

struct HeaderInfo {
  std::string programName;
  int ncclLibraryVersion = 0;
  std::string launcher;  // Loom's own line: how ranks were started
  std::string memory;
  int totalRanks = 0;
  std::string split;  // NCCL_TESTS_SPLIT's line, "" without one
};
std::string formatHeader(const Options& o, const HeaderInfo& info);
// "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s"
std::string formatDeviceLine(int rank, int group, int pid, const std::string& host, int device,
                             const std::string& busId, const std::string& description);
std::string formatColumnHeader(const Options& o);
std::string formatRowPreamble(size_t bytes, size_t count, const char* type, const char* op,
                              int root);
// `wrong` < 0 prints N/A (no check).
std::string formatRowBody(double timeUs, double algBw, double busBw, int64_t wrong);
struct IterStats {
  double min = 0, max = 0, avg = 0, p50 = 0, p95 = 0, p99 = 0, stdev = 0;
};
IterStats computeIterStats(std::vector<double> seconds);
std::string formatIterStats(const IterStats& s);
std::string formatTimestamp();  // "%21s" of "%Y-%m-%d %H:%M:%S"
std::string formatFooter(int errors, double avgBusBw, double checkAvgBw,
                         const std::string& programName);

}  // namespace loom::bench
