// nccl-tests' output format, character for character.
#include "bench/common/report.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace loom::bench {
namespace {

TEST(BenchReport, FloatStrFitsWidthLikeNcclTests) {
  EXPECT_EQ(floatStr(3.14159, 7), "   3.14");
  EXPECT_EQ(floatStr(0, 6), "  0.00");
  EXPECT_EQ(floatStr(1234.567, 7), "1234.57");
  EXPECT_EQ(floatStr(12345.67, 7), "12345.7");
  EXPECT_EQ(floatStr(1234567.0, 7), "1234567");
  EXPECT_EQ(floatStr(123456789.0, 7), "1.2e+08");
  EXPECT_EQ(floatStr(999.999, 6), "1000.0");
  EXPECT_EQ(floatStr(123456.0, 6), "123456");
  EXPECT_EQ(floatStr(1234567.0, 6), " 1e+06");
}

TEST(BenchReport, RowColumns) {
  std::string row = formatRowPreamble(1048576, 262144, "float", "sum", -1) +
                    formatRowBody(123.456, 8.49, 8.49, 0) + formatRowBody(120.0, 8.73, 8.73, -1);
  EXPECT_EQ(row,
            "     1048576        262144     float     sum      -1   123.46    8.49    8.49       0"
            "   120.00    8.73    8.73    N/A");
  std::istringstream in(row);
  std::vector<std::string> fields;
  for (std::string f; in >> f;) fields.push_back(f);
  EXPECT_EQ(fields.size(), 13u);
}

TEST(BenchReport, ColumnHeaderLines) {
  Options o;
  std::string h = formatColumnHeader(o);
  EXPECT_EQ(h,
            "#\n"
            "#                                                              out-of-place           "
            "            in-place          \n"
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong "
            "    time   algbw   busbw  #wrong \n"
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)         "
            "    (us)  (GB/s)  (GB/s)         \n");
  o.reportCputime = 1;
  EXPECT_NE(formatColumnHeader(o).find("cputime   algbw"), std::string::npos);
  o.perIterTiming = 1;
  EXPECT_NE(formatColumnHeader(o).find("i_min    i_max    i_p99    i_cv%"), std::string::npos);
}

TEST(BenchReport, HeaderBlock) {
  Options o;
  o.minBytes = 8;
  o.maxBytes = 128u << 20;
  o.stepFactor = 4;
  HeaderInfo info{"all_reduce_perf", 22809, "mpirun (Open MPI)", "host", 2, ""};
  std::string h = formatHeader(o, info);
  EXPECT_NE(h.find("# Collective test starting: all_reduce_perf\n"), std::string::npos);
  EXPECT_NE(h.find("# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 4(factor) warmup "
                   "iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n"),
            std::string::npos);
  EXPECT_EQ(h.rfind("# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809\n", 0), 0u);
  o.stepFactor = 1;
  o.blocking = 1;
  h = formatHeader(o, info);
  EXPECT_NE(h.find("step: 1048576(bytes)"), std::string::npos);
  EXPECT_NE(h.find("# Blocking Enabled: wait and barrier after each inner iteration (-m) \n"),
            std::string::npos);
  EXPECT_EQ(formatDeviceLine(1, 0, 4242, "node7", -1, "host", "host memory, CPU"),
            "#  Rank  1 Group  0 Pid   4242 on      node7 device -1 [host] host memory, CPU\n");
}

TEST(BenchReport, Footer) {
  EXPECT_EQ(formatFooter(0, 12.3456, -1, "all_reduce_perf"),
            "# Out of bounds values : 0 OK\n"
            "# Avg bus bandwidth    : 12.3456 \n"
            "#\n"
            "# Collective test concluded: all_reduce_perf\n");
  std::string failed = formatFooter(3, 1.0, 5.0, "reduce_perf");
  EXPECT_NE(failed.find("# Out of bounds values : 3 FAILED\n"), std::string::npos);
  EXPECT_NE(failed.find("# Avg bus bandwidth    : 1 FAILED\n"), std::string::npos);
  EXPECT_NE(formatFooter(0, 5.0, 5.0, "x").find("# Avg bus bandwidth    : 5 OK\n"),
            std::string::npos);
}

TEST(BenchReport, IterStatsNearestRankPercentile) {
  std::vector<double> t;
  for (int i = 1; i <= 10; ++i) t.push_back(i * 1e-6);
  IterStats s = computeIterStats(t);
  EXPECT_DOUBLE_EQ(s.min, 1e-6);
  EXPECT_DOUBLE_EQ(s.max, 10e-6);
  EXPECT_DOUBLE_EQ(s.p99, 10e-6);  // fewer than 100 samples: p99 is the max
  EXPECT_DOUBLE_EQ(s.p50, 6e-6);
  EXPECT_DOUBLE_EQ(s.avg, 5.5e-6);
  EXPECT_EQ(formatIterStats(s).substr(0, 18), "     1.00    10.00");
}

}  // namespace
}  // namespace loom::bench
