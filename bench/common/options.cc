#include "bench/common/options.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "bench/common/bench_error.h"

namespace loom::bench {

double parseSize(const char* text) {
  double size;
  char suffix[2] = {0, 0};
  int n = sscanf(text, "%lf %1s", &size, suffix);
  if (n < 1 || size < 0) return -1.0;
  double units = 1;
  if (n == 2) {
    switch (suffix[0]) {
      case 'G':
      case 'g':
        units = 1024.0 * 1024 * 1024;
        break;
      case 'M':
      case 'm':
        units = 1024.0 * 1024;
        break;
      case 'K':
      case 'k':
        units = 1024.0;
        break;
      default:
        return -1.0;
    }
  }
  return size * units;
}

const char* memoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kDevice:
      return "device";
    default:
      return "auto";
  }
}

namespace {

struct Flag {
  char shortName;
  const char* longName;
  std::function<void(Options&, const char* value)> apply;
};

long parseInt(const char* value, const char* flagName) {
  errno = 0;
  char* end = nullptr;
  long v = strtol(value, &end, 0);
  if (errno != 0 || end == value || *end != '\0')
    benchFail(Status::kInvalidUsage, "invalid value '%s' for %s: expected an integer", value,
              flagName);
  return v;
}

size_t parseBytes(const char* value, const char* what) {
  double parsed = parseSize(value);
  if (parsed < 0) benchFail(Status::kInvalidUsage, "invalid size specified for '%s'", what);
  return static_cast<size_t>(parsed);
}

MemoryKind parseMemoryKind(const char* value) {
  if (!strcmp(value, "host")) return MemoryKind::kHost;
  if (!strcmp(value, "device")) return MemoryKind::kDevice;
  if (!strcmp(value, "auto")) return MemoryKind::kAuto;
  benchFail(Status::kInvalidUsage, "invalid memory kind '%s': expected host, device or auto",
            value);
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> kFlags = {
      {'t', "nthreads", [](Options& o, const char* v) { o.nThreads = parseInt(v, "-t"); }},
      {'g', "ngpus", [](Options& o, const char* v) { o.nGpus = parseInt(v, "-g"); }},
      {'b', "minbytes", [](Options& o, const char* v) { o.minBytes = parseBytes(v, "minbytes"); }},
      {'e', "maxbytes", [](Options& o, const char* v) { o.maxBytes = parseBytes(v, "maxbytes"); }},
      {'i', "stepbytes",
       [](Options& o, const char* v) { o.stepBytes = parseBytes(v, "stepBytes"); }},
      {'f', "stepfactor", [](Options& o, const char* v) { o.stepFactor = parseInt(v, "-f"); }},
      {'n', "iters", [](Options& o, const char* v) { o.iters = parseInt(v, "-n"); }},
      {'m', "agg_iters", [](Options& o, const char* v) { o.aggIters = parseInt(v, "-m"); }},
      {'w', "warmup_iters", [](Options& o, const char* v) { o.warmupIters = parseInt(v, "-w"); }},
      {'N', "run_cycles", [](Options& o, const char* v) { o.runCycles = parseInt(v, "-N"); }},
      {'p', "parallel_init", [](Options& o, const char* v) { o.parallelInit = parseInt(v, "-p"); }},
      {'c', "check", [](Options& o, const char* v) { o.datacheck = parseInt(v, "-c"); }},
      {'o', "op",
       [](Options& o, const char* v) {
         if (!strcmp(v, "all")) {
           o.op = nullptr;
         } else if (const OpInfo* op = findOp(v)) {
           o.op = op;
         } else {
           o.notes.push_back(formatString("invalid op %s, defaulting to sum .. ", v));
           o.op = findOp("sum");
         }
       }},
      {'d', "datatype",
       [](Options& o, const char* v) {
         if (!strcmp(v, "all")) {
           o.type = nullptr;
         } else if (const TypeInfo* t = findType(v)) {
           o.type = t;
         } else {
           o.notes.push_back(formatString("invalid type %s, defaulting to float .. ", v));
           o.type = findType("float");
         }
       }},
      {'r', "root",
       [](Options& o, const char* v) { o.root = strcmp(v, "all") ? parseInt(v, "-r") : -1; }},
      {'z', "blocking", [](Options& o, const char* v) { o.blocking = parseInt(v, "-z"); }},
      {'y', "stream_null", [](Options& o, const char* v) { o.streamNull = parseInt(v, "-y"); }},
      {'T', "timeout", [](Options& o, const char* v) { o.timeoutSec = parseInt(v, "-T"); }},
      {'G', "cudagraph",
       [](Options& o, const char* v) { o.cudaGraphLaunches = parseInt(v, "-G"); }},
      {'C', "report_cputime",
       [](Options& o, const char* v) { o.reportCputime = parseInt(v, "-C"); }},
      {'S', "report_timestamps",
       [](Options& o, const char* v) { o.reportTimestamps = parseInt(v, "-S"); }},
      {'J', "output_file", [](Options& o, const char* v) { o.outputFile = v; }},
      {'a', "average", [](Options& o, const char* v) { o.average = parseInt(v, "-a"); }},
      {'R', "local_register",
       [](Options& o, const char* v) { o.localRegister = parseInt(v, "-R"); }},
      {'x', "cta_policy", [](Options& o, const char* v) { o.ctaPolicy = parseInt(v, "-x"); }},
      {'D', "device_implementation",
       [](Options& o, const char* v) { o.deviceImpl = parseInt(v, "-D"); }},
      {'V', "device_cta_count",
       [](Options& o, const char* v) {
         o.deviceCtaCount = parseInt(v, "-V");
         if (o.deviceCtaCount <= 0 || o.deviceCtaCount > 128) {
           o.notes.push_back(formatString(
               "device_cta_count (-V) must be positive and less than 128, got %d. Using "
               "default value 16.",
               o.deviceCtaCount));
           o.deviceCtaCount = 16;
         }
       }},
      {'M', "memory",
       [](Options& o, const char* v) {
         // nccl-tests: -M 0/1 is the memory usage report. Loom: -M host|device|auto.
         if (v[0] >= '0' && v[0] <= '9')
           o.memoryReport = parseInt(v, "-M");
         else
           o.memoryKind = parseMemoryKind(v);
       }},
      {0, "memory_kind", [](Options& o, const char* v) { o.memoryKind = parseMemoryKind(v); }},
      {'u', "unalign", [](Options& o, const char* v) { o.unalign = parseInt(v, "-u"); }},
      {'I', "per_iter_timing",
       [](Options& o, const char* v) { o.perIterTiming = parseInt(v, "-I"); }},
      {'K', "per_iter_skip", [](Options& o, const char* v) { o.perIterSkip = parseInt(v, "-K"); }},
      {0, "nranks", [](Options& o, const char* v) { o.nranks = parseInt(v, "--nranks"); }},
  };
  return kFlags;
}

const Flag* findShort(char c) {
  for (const Flag& f : flags())
    if (f.shortName == c) return &f;
  return nullptr;
}

const Flag* findLong(const std::string& name) {
  for (const Flag& f : flags())
    if (name == f.longName) return &f;
  return nullptr;
}

}  // namespace

Options parseOptions(int argc, const char* const* argv) {
  Options o;
  o.op = findOp("sum");
  o.type = findType("float");
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    auto takeValue = [&](const char* inlineValue, const char* name) -> const char* {
      if (inlineValue) return inlineValue;
      if (i + 1 >= argc) benchFail(Status::kInvalidUsage, "option '%s' requires an argument", name);
      return argv[++i];
    };
    if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
      o.help = true;
    } else if (!strcmp(arg, "-np")) {  // mpirun's spelling; getopt would read "-n p"
      o.nranks = parseInt(takeValue(nullptr, "-np"), "-np");
    } else if (!strncmp(arg, "--", 2) && arg[2]) {
      std::string name = arg + 2;
      const char* inlineValue = nullptr;
      if (size_t eq = name.find('='); eq != std::string::npos) {
        inlineValue = arg + 2 + eq + 1;
        name.resize(eq);
      }
      const Flag* flag = findLong(name);
      if (!flag) benchFail(Status::kInvalidUsage, "unrecognized option '--%s'", name.c_str());
      flag->apply(o, takeValue(inlineValue, arg));
    } else if (arg[0] == '-' && arg[1]) {
      const Flag* flag = findShort(arg[1]);
      if (!flag) benchFail(Status::kInvalidUsage, "invalid option '%c'", arg[1]);
      flag->apply(o, takeValue(arg[2] ? arg + 2 : nullptr, arg));
    } else {
      benchFail(Status::kInvalidUsage, "unexpected argument '%s'", arg);
    }
  }
  if (o.minBytes > o.maxBytes)
    benchFail(Status::kInvalidUsage, "invalid sizes for 'minbytes' and 'maxbytes': %llu > %llu",
              (unsigned long long)o.minBytes, (unsigned long long)o.maxBytes);
  if (o.nThreads < 1)
    benchFail(Status::kInvalidUsage, "invalid number of threads (-t %d)", o.nThreads);
  if (o.nGpus < 1)
    benchFail(Status::kInvalidUsage, "invalid number of GPUs per thread (-g %d)", o.nGpus);
  if (o.iters < 1) benchFail(Status::kInvalidUsage, "invalid iteration count (-n %d)", o.iters);
  if (o.aggIters < 1)
    benchFail(Status::kInvalidUsage, "invalid aggregation count (-m %d)", o.aggIters);
  if (o.warmupIters < 0)
    benchFail(Status::kInvalidUsage, "invalid warmup count (-w %d)", o.warmupIters);
  if (o.runCycles < 0) benchFail(Status::kInvalidUsage, "invalid cycle count (-N %d)", o.runCycles);
  if (o.datacheck < 0) benchFail(Status::kInvalidUsage, "invalid check count (-c %d)", o.datacheck);
  if (o.average < 0 || o.average > 3)
    benchFail(Status::kInvalidUsage, "invalid average mode (-a %d): expected 0, 1, 2 or 3",
              o.average);
  if (o.blocking < 0 || o.blocking > 3)
    benchFail(Status::kInvalidUsage, "invalid blocking mode (-z %d): expected 0, 1, 2 or 3",
              o.blocking);
  if (o.unalign < 0) benchFail(Status::kInvalidUsage, "invalid unalign (-u %d)", o.unalign);
  if (o.perIterSkip < 0 || (o.perIterTiming && o.perIterSkip >= o.iters))
    benchFail(Status::kInvalidUsage, "per_iter_skip (-K %d) must be in [0, iters (%d))",
              o.perIterSkip, o.iters);
  if (o.root < -1) benchFail(Status::kInvalidUsage, "invalid root (-r %d)", o.root);
  if (o.nranks < 0)
    benchFail(Status::kInvalidUsage, "invalid number of ranks (--nranks %d)", o.nranks);
  if (o.stepFactor < 1) o.stepFactor = 1;
  if (o.stepFactor <= 1 && o.stepBytes == 0 && o.minBytes != o.maxBytes)
    benchFail(Status::kInvalidUsage, "stepbytes (-i) must be positive when stepfactor (-f) is 1");
  return o;
}

std::string usage(const char* programName) {
  return formatString(
      "USAGE: %s \n\t"
      "[-t,--nthreads <num threads>] \n\t"
      "[-g,--ngpus <gpus per thread>] \n\t"
      "[-b,--minbytes <min size in bytes>] \n\t"
      "[-e,--maxbytes <max size in bytes>] \n\t"
      "[-i,--stepbytes <increment size>] \n\t"
      "[-f,--stepfactor <increment factor>] \n\t"
      "[-n,--iters <iteration count>] \n\t"
      "[-m,--agg_iters <aggregated iteration count>] \n\t"
      "[-w,--warmup_iters <warmup iteration count>] \n\t"
      "[-N,--run_cycles <cycle count> run & print each cycle (default: 1; 0=infinite)] \n\t"
      "[-p,--parallel_init <0/1>] \n\t"
      "[-c,--check <check iteration count>] \n\t"
      "[-o,--op <sum/prod/min/max/avg/mulsum/all>] \n\t"
      "[-d,--datatype <nccltype/all>] \n\t"
      "[-r,--root <root/all>] \n\t"
      "[-z,--blocking <0/1/2/3> 1=barrier after each inner iter (-m), 2=no barrier, 3=wait and "
      "barrier after each outer iter (-n)] \n\t"
      "[-y,--stream_null <0/1>] \n\t"
      "[-T,--timeout <time in seconds>] \n\t"
      "[-G,--cudagraph <num graph launches>] \n\t"
      "[-C,--report_cputime <0/1>] \n\t"
      "[-S,--report_timestamps <0/1> report timestamps (default 0)] \n\t"
      "[-J,--output_file <file> write output to filepath, if accessible. Infer type from suffix "
      "(only json supported presently.)] \n\t"
      "[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>] \n\t"
      "[-R,--local_register <0/1/2> enable local (1) or symmetric (2) buffer registration on "
      "send/recv buffers (default: disable (0))] \n\t"
      "[-x,--cta_policy <0/1/2> set CTA policy (default: do not set)] \n\t"
      "[-D,--device_implementation <implementation number> (GPU only)] \n\t"
      "[-V,--device_cta_count <number> (GPU only, default: 16)] \n\t"
      "[-M,--memory <0/1> enable memory usage report (default: 0)] \n\t"
      "[-M,--memory_kind <host/device/auto> buffer memory (Loom; default: auto = host without "
      "a GPU)] \n\t"
      "[-u,--unalign <index of first element> Misalign source and destination buffers "
      "(default: 0)] \n\t"
      "[-I,--per_iter_timing <0/1> per-iteration timing (default: 0)] \n\t"
      "[-K,--per_iter_skip <count> exclude leading samples from -I summary stats (default: 0)] "
      "\n\t"
      "[-np,--nranks <num processes> fork this many local ranks (Loom; also LOOM_BENCH_NRANKS)] "
      "\n\t"
      "[-h,--help]\n"
      "Launch ranks with mpirun, srun, torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT), -t "
      "(threads) or -np (forked processes); NCCL_COMM_ID=<host>:<port> overrides the "
      "rendezvous address.\n",
      programName);
}

}  // namespace loom::bench
