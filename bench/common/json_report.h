// -J <file>.json: nccl-tests' JSON report (format version 3): config, devices, one record
// per size with out_of_place / in_place results, out_of_bounds, average_bus_bandwidth.
// Only the printing rank writes it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/common/options.h"
#include "bench/common/report.h"

namespace loom::bench {

class JsonWriter {
 public:
  explicit JsonWriter(FILE* f) : f_(f) {}
  void beginObject();
  void endObject();
  void beginList();
  void endList();
  void key(const char* k);
  void str(const std::string& v);
  void integer(long long v);
  void number(double v);
  void boolean(bool v);
  void null();

 private:
  void beforeValue();
  FILE* f_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool afterKey_ = false;
};

std::string jsonEscape(const std::string& s);

struct DeviceRecord {
  int rank, group, pid, device;
  std::string host, busId, info;
};

class JsonReport {
 public:
  // Opens `path` (nccl-tests: never overwrite; try path.0, path.1, ...). Returns the line
  // to print ("# Writing JSON output to ..." or "# skipping json output; ...").
  std::string open(const std::string& path, int argc, const char* const* argv, int ncclVersion);
  bool active() const { return file_ != nullptr; }
  void config(const Options& o);
  void devices(const std::vector<DeviceRecord>& devs);
  void beginResults();
  void beginRow(size_t bytes, size_t count, const char* type, const char* op, int root);
  void placement(bool outOfPlace, bool cputime, double timeUs, double algBw, double busBw,
                 int64_t wrong, const IterStats* iterStats, const std::vector<double>* iterTimes,
                 int skipped);
  void endRow(int iters);
  void footer(int errors, double avgBusBw, double checkAvgBw);
  void close(const std::string& lastError);
  JsonReport() = default;
  JsonReport(const JsonReport&) = delete;
  JsonReport& operator=(const JsonReport&) = delete;
  ~JsonReport();

 private:
  FILE* file_ = nullptr;
  std::unique_ptr<JsonWriter> w_;
};

}  // namespace loom::bench
