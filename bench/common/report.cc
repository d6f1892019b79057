#include "bench/common/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "bench/common/bench_error.h"

namespace loom::bench {

namespace {
constexpr const char* kNcclTestsVersion = "2.19.6";  // the output format we reproduce
constexpr const char* kTimeFormat = "%Y-%m-%d %H:%M:%S";
}  // namespace

std::string floatStr(double value, int width) {
  char buf[64];
  if (snprintf(buf, sizeof buf, "%*.2f", width, value) <= width) return buf;
  if (snprintf(buf, sizeof buf, "%*.1f", width, value) <= width) return buf;
  if (snprintf(buf, sizeof buf, "%*.0f", width, value) <= width) return buf;
  snprintf(buf, sizeof buf, width >= 7 ? "%*.1e" : "%*.0e", width, value);
  return std::string(buf).substr(0, width);
}

std::string formatHeader(const Options& o, const HeaderInfo& info) {
  std::string s;
  s += formatString("# nccl-tests version %s nccl-headers=%d nccl-library=%d\n", kNcclTestsVersion,
                    NCCL_VERSION_CODE, info.ncclLibraryVersion);
  s += formatString("# Collective test starting: %s\n", info.programName.c_str());
  s += formatString(
      "# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
      "agg iters: %d validation: %d graph: %d unalign: %d\n",
      o.nThreads, o.nGpus, o.minBytes, o.maxBytes, o.stepFactor > 1 ? o.stepFactor : o.stepBytes,
      o.stepFactor > 1 ? "factor" : "bytes", o.warmupIters, o.iters, o.aggIters, o.datacheck,
      o.cudaGraphLaunches, o.unalign);
  if (o.blocking == 1)
    s += "# Blocking Enabled: wait and barrier after each inner iteration (-m) \n";
  if (o.blocking == 2)
    s += "# Blocking Enabled: wait after each inner iteration (-m), no barrier \n";
  if (o.blocking == 3)
    s += "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes "
         "barrier \n";
  if (o.perIterTiming) {
    s += "# Per-Iteration Report: host wall-clock timing; i_* uses max over ranks";
    if (o.perIterSkip) s += formatString("; summary skips first %d iterations", o.perIterSkip);
    s += " \n";
  }
  if (o.parallelInit)
    s += "# Parallel Init Enabled: threads call into NcclInitRank concurrently \n";
  s += formatString("# Loom: %d ranks, %s, %s buffers\n", info.totalRanks, info.launcher.c_str(),
                    info.memory.c_str());
  if (!info.split.empty()) s += "# Loom: " + info.split + "\n";
  s += "#\n";
  return s;
}

std::string formatDeviceLine(int rank, int group, int pid, const std::string& host, int device,
                             const std::string& busId, const std::string& description) {
  return formatString("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s\n", rank, group,
                      pid, host.c_str(), device, busId.c_str(), description.c_str());
}

std::string formatColumnHeader(const Options& o) {
  const char* tsLbl = o.reportTimestamps ? "timestamp" : "";
  const int tsPad = o.reportTimestamps ? 19 : 0;
  const char* tsFmt = o.reportTimestamps ? kTimeFormat : "";
  const char* timeStr = o.reportCputime ? "cputime" : "time";
  std::string s = "#\n";
  if (o.perIterTiming) {
    s += formatString(
        "# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                  "
        "              in-place (+ per-iteration)\n",
        "", "", "", "", "");
    s += formatString(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  "
        "%7s  %7s  %7s  %7s %*s\n",
        "size", "count", "type", "redop", "root", timeStr, "algbw", "busbw", "#wrong", "i_min",
        "i_max", "i_p99", "i_cv%", timeStr, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99",
        "i_cv%", tsPad, tsLbl);
    s += formatString(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  "
        "%7s  %7s  %7s  %7s %*s\n",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)",
        "(%)", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)", tsPad, tsFmt);
  } else {
    s += formatString(
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place      "
        "    \n",
        "", "", "", "", "");
    s += formatString("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n",
                      "size", "count", "type", "redop", "root", timeStr, "algbw", "busbw", "#wrong",
                      timeStr, "algbw", "busbw", "#wrong", tsPad, tsLbl);
    s += formatString("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n",
                      "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
                      "(GB/s)", "(GB/s)", "", tsPad, tsFmt);
  }
  return s;
}

std::string formatRowPreamble(size_t bytes, size_t count, const char* type, const char* op,
                              int root) {
  return formatString("%12zu  %12zu  %8s  %6s  %6i", bytes, count, type, op, root);
}

std::string formatRowBody(double timeUs, double algBw, double busBw, int64_t wrong) {
  std::string t = floatStr(timeUs, 7), a = floatStr(algBw, 6), b = floatStr(busBw, 6);
  if (wrong < 0) return formatString("  %7s  %6s  %6s    N/A", t.c_str(), a.c_str(), b.c_str());
  return formatString("  %7s  %6s  %6s  %6g", t.c_str(), a.c_str(), b.c_str(), double(wrong));
}

IterStats computeIterStats(std::vector<double> seconds) {
  IterStats s;
  if (seconds.empty()) return s;
  std::sort(seconds.begin(), seconds.end());
  const int n = static_cast<int>(seconds.size());
  auto percentile = [&](int p) { return seconds[std::min(n - 1, (n * p + 99) / 100 - 1)]; };
  s.min = seconds.front();
  s.max = seconds.back();
  s.p50 = seconds[n / 2];
  s.p95 = percentile(95);
  s.p99 = percentile(99);
  double sum = 0;
  for (double v : seconds) sum += v;
  s.avg = sum / n;
  double var = 0;
  for (double v : seconds) var += (v - s.avg) * (v - s.avg);
  s.stdev = std::sqrt(var / n);
  return s;
}

std::string formatIterStats(const IterStats& s) {
  double cv = s.avg > 0 ? s.stdev / s.avg * 100.0 : 0.0;
  return formatString("  %7s  %7s  %7s  %7s", floatStr(s.min * 1e6, 7).c_str(),
                      floatStr(s.max * 1e6, 7).c_str(), floatStr(s.p99 * 1e6, 7).c_str(),
                      floatStr(cv, 7).c_str());
}

std::string formatTimestamp() {
  char buf[128];
  time_t now = time(nullptr);
  struct tm tmv;
  localtime_r(&now, &tmv);
  strftime(buf, sizeof buf, kTimeFormat, &tmv);
  return formatString("%21s", buf);
}

std::string formatFooter(int errors, double avgBusBw, double checkAvgBw,
                         const std::string& programName) {
  std::string s;
  s += formatString("# %-20s : %d %s\n", "Out of bounds values", errors, errors ? "FAILED" : "OK");
  s += formatString("# %-20s : %g %s\n", "Avg bus bandwidth", avgBusBw,
                    checkAvgBw == -1 ? "" : (avgBusBw < checkAvgBw * 0.9 ? "FAILED" : "OK"));
  s += "#\n";
  s += formatString("# Collective test concluded: %s\n", programName.c_str());
  return s;
}

}  // namespace loom::bench
