#include "bench/common/json_report.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <ctime>

#include "bench/common/bench_error.h"

namespace loom::bench {

std::string jsonEscape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '/':
        out += "\\/";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c >= 0x7f)
          out += formatString("\\u%04x", c);
        else
          out += static_cast<char>(c);
    }
  }
  return out;
}

void JsonWriter::beforeValue() {
  if (afterKey_) {
    afterKey_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) fputc(',', f_);
    first_.back() = false;
  }
}
void JsonWriter::beginObject() {
  beforeValue();
  fputc('{', f_);
  first_.push_back(true);
}
void JsonWriter::endObject() {
  fputc('}', f_);
  first_.pop_back();
}
void JsonWriter::beginList() {
  beforeValue();
  fputc('[', f_);
  first_.push_back(true);
}
void JsonWriter::endList() {
  fputc(']', f_);
  first_.pop_back();
}
void JsonWriter::key(const char* k) {
  beforeValue();
  fprintf(f_, "\"%s\":", jsonEscape(k).c_str());
  afterKey_ = true;
}
void JsonWriter::str(const std::string& v) {
  beforeValue();
  fprintf(f_, "\"%s\"", jsonEscape(v).c_str());
}
void JsonWriter::integer(long long v) {
  beforeValue();
  fprintf(f_, "%lld", v);
}
void JsonWriter::number(double v) {
  beforeValue();
  if (std::isnan(v) || std::isinf(v))
    fprintf(f_, "\"nan\"");
  else
    fprintf(f_, "%lf", v);
}
void JsonWriter::boolean(bool v) {
  beforeValue();
  fputs(v ? "true" : "false", f_);
}
void JsonWriter::null() {
  beforeValue();
  fputs("null", f_);
}

namespace {
std::string now() {
  char buf[64];
  time_t t = time(nullptr);
  struct tm tmv;
  localtime_r(&t, &tmv);
  strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tmv);
  return buf;
}
}  // namespace

std::string JsonReport::open(const std::string& path, int argc, const char* const* argv,
                             int ncclVersion) {
  std::string tryPath = path;
  for (int attempt = 0;; ++attempt) {
    file_ = fopen(tryPath.c_str(), "wx");
    if (file_) break;
    if (errno != EEXIST)
      return formatString("# skipping json output; %s not accessible\n", tryPath.c_str());
    tryPath = formatString("%s.%d", path.c_str(), attempt);
  }
  w_ = std::make_unique<JsonWriter>(file_);
  w_->beginObject();
  w_->key("version");
  w_->integer(3);
  w_->key("start_time");
  w_->str(now());
  w_->key("args");
  w_->beginList();
  for (int i = 0; i < argc; ++i) w_->str(argv[i]);
  w_->endList();
  // nccl-tests records the whole environment; Loom records only the variables that steer
  // the library and the launch, so tokens and secrets never land in a report file.
  w_->key("env");
  w_->beginList();
  for (char** e = environ; e && *e; ++e) {
    std::string var = *e;
    for (const char* prefix :
         {"NCCL_", "LOOM_", "OMPI_COMM_WORLD_", "SLURM_PROCID", "SLURM_NTASKS",
          "RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MASTER_ADDR=", "MASTER_PORT="}) {
      if (var.rfind(prefix, 0) == 0) {
        w_->str(var);
        break;
      }
    }
  }
  w_->endList();
  w_->key("nccl_version");
  w_->integer(ncclVersion);
  return formatString("# Writing JSON output to %s\n", tryPath.c_str());
}

void JsonReport::config(const Options& o) {
  if (!w_) return;
  w_->key("config");
  w_->beginObject();
  w_->key("nthreads");
  w_->integer(o.nThreads);
  w_->key("ngpus");
  w_->integer(o.nGpus);
  w_->key("minimum_bytes");
  w_->integer(o.minBytes);
  w_->key("maximum_bytes");
  w_->integer(o.maxBytes);
  if (o.stepFactor > 1) {
    w_->key("step_factor");
    w_->integer(o.stepFactor);
  } else {
    w_->key("step_bytes");
    w_->integer(o.stepBytes);
  }
  w_->key("warmup_iters");
  w_->integer(o.warmupIters);
  w_->key("iterations");
  w_->integer(o.iters);
  w_->key("aggregated_iterations");
  w_->integer(o.aggIters);
  w_->key("validation");
  w_->integer(o.datacheck);
  w_->key("graph");
  w_->integer(o.cudaGraphLaunches);
  w_->key("blocking_collectives");
  w_->boolean(o.blocking != 0);
  w_->key("per_iter_timing");
  w_->boolean(o.perIterTiming != 0);
  w_->key("per_iter_skip");
  w_->integer(o.perIterSkip);
  w_->key("parallel_init");
  w_->boolean(o.parallelInit != 0);
}

void JsonReport::devices(const std::vector<DeviceRecord>& devs) {
  if (!w_) return;
  w_->key("devices");
  w_->beginList();
  for (const DeviceRecord& d : devs) {
    w_->beginObject();
    w_->key("rank");
    w_->integer(d.rank);
    w_->key("group");
    w_->integer(d.group);
    w_->key("pid");
    w_->integer(d.pid);
    w_->key("hostname");
    w_->str(d.host);
    w_->key("device");
    w_->integer(d.device);
    w_->key("device_hex");
    w_->str(d.busId);
    w_->key("device_info");
    w_->str(d.info);
    w_->endObject();
  }
  w_->endList();
  w_->endObject();  // config
}

void JsonReport::beginResults() {
  if (!w_) return;
  w_->key("results");
  w_->beginList();
}

void JsonReport::beginRow(size_t bytes, size_t count, const char* type, const char* op, int root) {
  if (!w_) return;
  w_->beginObject();
  w_->key("size");
  w_->integer(bytes);
  w_->key("count");
  w_->integer(count);
  w_->key("type");
  w_->str(type);
  w_->key("redop");
  w_->str(op);
  w_->key("root");
  w_->str(formatString("%6i", root));
}

void JsonReport::placement(bool outOfPlace, bool cputime, double timeUs, double algBw, double busBw,
                           int64_t wrong, const IterStats* st, const std::vector<double>* times,
                           int skipped) {
  if (!w_) return;
  w_->key(outOfPlace ? "out_of_place" : "in_place");
  w_->beginObject();
  w_->key(cputime ? "cpu_time" : "time");
  w_->number(timeUs);
  w_->key("alg_bw");
  w_->number(algBw);
  w_->key("bus_bw");
  w_->number(busBw);
  w_->key("nwrong");
  if (wrong < 0)
    w_->null();
  else
    w_->number(double(wrong));
  w_->endObject();
  if (st && times) {
    w_->key(outOfPlace ? "out_of_place_per_iter" : "in_place_per_iter");
    w_->beginObject();
    w_->key("skipped_iterations");
    w_->integer(skipped);
    w_->key("min_us");
    w_->number(st->min * 1e6);
    w_->key("max_us");
    w_->number(st->max * 1e6);
    w_->key("avg_us");
    w_->number(st->avg * 1e6);
    w_->key("p50_us");
    w_->number(st->p50 * 1e6);
    w_->key("p95_us");
    w_->number(st->p95 * 1e6);
    w_->key("p99_us");
    w_->number(st->p99 * 1e6);
    w_->key("stdev_us");
    w_->number(st->stdev * 1e6);
    w_->key("cv_pct");
    w_->number(st->avg > 0 ? st->stdev / st->avg * 100 : 0);
    w_->key("times_us");
    w_->beginList();
    for (double t : *times) w_->number(t * 1e6);
    w_->endList();
    w_->endObject();
  }
}

void JsonReport::endRow(int iters) {
  if (!w_) return;
  w_->key("actual_iterations");
  w_->integer(iters);
  w_->key("experiment_name");
  w_->str("");
  w_->endObject();
}

void JsonReport::footer(int errors, double avgBusBw, double checkAvgBw) {
  if (!w_) return;
  w_->endList();  // results
  w_->key("out_of_bounds");
  w_->beginObject();
  w_->key("count");
  w_->integer(errors);
  w_->key("okay");
  w_->boolean(errors == 0);
  w_->endObject();
  w_->key("average_bus_bandwidth");
  w_->beginObject();
  w_->key("bandwidth");
  w_->number(avgBusBw);
  w_->key("okay");
  if (checkAvgBw == -1)
    w_->str("unchecked");
  else
    w_->boolean(avgBusBw >= checkAvgBw * 0.9);
  w_->endObject();
}

void JsonReport::close(const std::string& lastError) {
  if (!w_) return;
  w_->key("errors");
  w_->beginList();
  if (!lastError.empty()) w_->str(lastError);
  w_->endList();
  w_->key("end_time");
  w_->str(now());
  w_->endObject();
  fputc('\n', file_);
  fclose(file_);
  file_ = nullptr;
  w_.reset();
}

JsonReport::~JsonReport() {
  if (file_) fclose(file_);
}

}  // namespace loom::bench
