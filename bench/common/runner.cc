#include "bench/common/runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>

#include "bench/common/rank_runner.h"
#include "bench/common/report.h"

namespace loom::bench {

namespace {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string hostName() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  // nccl-tests prints the name up to the first dot.
  if (char* dot = strchr(buf, '.')) *dot = '\0';
  return buf;
}

std::string cpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "CPU";
}

size_t memAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

std::string memString(double bytes) {
  const char* unit = " B";
  if (bytes >= 1024.0 * 1024 * 1024) {
    unit = " GB";
    bytes /= 1024.0 * 1024 * 1024;
  } else if (bytes >= 1024.0 * 1024) {
    unit = " MB";
    bytes /= 1024.0 * 1024;
  } else if (bytes >= 1024.0) {
    unit = " KB";
    bytes /= 1024.0;
  }
  int precision = bytes < 10 ? 2 : bytes < 100 ? 1 : 0;
  return formatString("%.*f%s", precision, bytes, unit);
}

constexpr size_t kDeviceLineBytes = 256;

}  // namespace

// ---------------- Watchdog ----------------

Watchdog::Watchdog(int timeoutSec, int nThreads, std::function<void(int)> onTimeout)
    : timeoutSec_(timeoutSec), onTimeout_(std::move(onTimeout)), edges_(nThreads) {
  for (auto& e : edges_) e.store(0, std::memory_order_relaxed);
  if (timeoutSec_ > 0) thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::enter(int thread) {
  auto& e = edges_[thread];
  e.store(e.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}
void Watchdog::leave(int thread) { enter(thread); }

// A thread is stuck when it has been seen in the same call (same odd count) for longer
// than the timeout.
void Watchdog::loop() {
  std::vector<uint64_t> seen(edges_.size(), 0);
  std::vector<int64_t> sinceNs(edges_.size(), 0);
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; })) {
    const int64_t now = nowNs();
    for (size_t t = 0; t < edges_.size(); ++t) {
      uint64_t e = edges_[t].load(std::memory_order_relaxed);
      if (e % 2 == 0 || e != seen[t]) {
        seen[t] = e;
        sinceNs[t] = now;
        continue;
      }
      if (now - sinceNs[t] > int64_t(timeoutSec_) * 1000000000) {
        lock.unlock();
        onTimeout_(static_cast<int>(t));  // does not return
      }
    }
  }
}

// ---------------- BenchProcess ----------------

BenchProcess::BenchProcess(const RunInputs& in) : in_(in), maxBytes_(in.opts.maxBytes) {
  resolveMemory();
  applyPlatformNotes();
  limitToMemory();
  watchdog_ = std::make_unique<Watchdog>(in_.opts.timeoutSec, in_.opts.nThreads, [this](int t) {
    fatal(t, Status::kTimeout,
          formatString("%s: Test timeout (%ds): a call did not complete", hostName().c_str(),
                       in_.opts.timeoutSec));
  });
}

BenchProcess::~BenchProcess() = default;

void BenchProcess::print(int thread, const std::string& text) {
  if (!isPrinter(thread)) return;
  fputs(text.c_str(), stdout);
  fflush(stdout);
}

// -M: device buffers where asked for, or (auto) where the CUDA driver has a GPU.
void BenchProcess::resolveMemory() {
  const Options& o = in_.opts;
  if (o.memoryKind == MemoryKind::kHost) return;
  std::string why;
  cuda_ = CudaDriver::get(&why);
  if (!cuda_ && o.memoryKind == MemoryKind::kDevice)
    benchFail(Status::kInvalidUsage, "-M device: %s; run with host buffers (-M host)", why.c_str());
}

// Options that need a GPU: say what happens instead, as nccl-tests does for options its
// NCCL cannot honour.
void BenchProcess::applyPlatformNotes() {
  Options& o = in_.opts;
  for (const std::string& n : o.notes) notes_.push_back(n + "\n");
  if (o.nGpus > 1) {
    notes_.push_back(formatString(
        "# -g %d: one GPU per rank; running 1 rank per thread (use -t N for threads or "
        "-np N for processes)\n",
        o.nGpus));
    o.nGpus = 1;
  }
  if (o.cudaGraphLaunches > 0 && !(cuda_ && cuda_->hasGraphs() && !o.streamNull)) {
    notes_.push_back(formatString(
        cuda_ ? "Option -G (CUDA graph) needs a stream of the rank's own (not -y) and a driver "
                "with graphs; ignoring it\n"
              : "Option -G (CUDA graph) needs device buffers; ignoring it with host buffers\n"));
    o.cudaGraphLaunches = 0;
  }
  if (o.cudaGraphLaunches > 0 && (o.blocking || o.perIterTiming)) {
    notes_.push_back(formatString("# -G: the graph's calls are timed together; ignoring %s\n",
                                  o.blocking ? "-z" : "-I"));
    o.blocking = 0;
    o.perIterTiming = 0;
  }
  if (o.streamNull && !cuda_) notes_.push_back("# -y: host buffers use no CUDA stream; ignoring\n");
  if (o.localRegister == 2 && !cuda_) {
    notes_.push_back(
        "Option -R 2 (symmetric) needs device buffers. Defaulting to local registration\n");
    o.localRegister = 1;
  }
  if (o.memoryReport && !cuda_)
    notes_.push_back(
        "# -M 1: host buffers; the memory report counts the benchmark's host buffers\n");
}

void BenchProcess::limitToMemory() {
  Options& o = in_.opts;
  size_t avail = memAvailableBytes();
  if (!avail) return;
  size_t ranksHere = size_t(std::max(1, in_.placement.localSize)) * o.nThreads;
  // Two buffers per rank; leave a tenth of the memory (and 256 MiB) to everything else.
  size_t reserve = avail / 10 + (256u << 20);
  if (avail <= reserve) return;
  size_t memMax = (avail - reserve) / (2 * ranksHere);
  if (maxBytes_ > memMax) {
    maxBytes_ = memMax;
    if (o.minBytes > maxBytes_) o.minBytes = maxBytes_;
    notes_.push_back(
        formatString("#\n# Reducing maxBytes to %zu due to memory limitation\n", maxBytes_));
  }
}

std::string BenchProcess::deviceDescription(int thread) const {
  if (cuda_) return cuda_->name(deviceOf(thread)) + ", device memory";
  return "host memory, " + cpuModel();
}

void BenchProcess::abortAll() {
  std::call_once(abortOnce_, [this] {
    for (ncclComm_t c : groups_)
      if (c) ncclCommAbort(c);
    for (ncclComm_t c : comms_)
      if (c) ncclCommAbort(c);
  });
}

void BenchProcess::fatal(int thread, Status status, const std::string& message) {
  fflush(stdout);
  fprintf(stderr, "%s: rank %d (%s pid %d): %s\n", in_.programName.c_str(), rankOf(thread),
          hostName().c_str(), static_cast<int>(getpid()), message.c_str());
  fflush(stderr);
  // Abort from a helper thread with a deadline: a wedged library must not keep us alive.
  auto done = std::async(std::launch::async, [this] { abortAll(); });
  done.wait_for(std::chrono::seconds(5));
  _exit(static_cast<int>(status));
}

void BenchProcess::initComms() {
  const Options& o = in_.opts;
  const int n = nThreads();
  comms_.assign(n, nullptr);
  groups_.assign(n, nullptr);
  if (nProcs() == 1 && !o.parallelInit && o.ctaPolicy < 0) {
    Watchdog::Busy busy(*watchdog_, 0);
    std::vector<int> devs;
    for (int t = 0; cuda_ && t < n; ++t) devs.push_back(deviceOf(t));
    BENCH_NCCL(ncclCommInitAll(comms_.data(), n, cuda_ ? devs.data() : nullptr), nullptr);
    return;
  }
  ncclUniqueId id;
  BENCH_NCCL(ncclGetUniqueId(&id), nullptr);
  auto initRank = [&](int t) {
    Watchdog::Busy joining(*watchdog_, t);
    if (cuda_) cuda_->makeCurrent(deviceOf(t));  // the communicator takes the current device
    if (o.ctaPolicy >= 0) {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.CTAPolicy = o.ctaPolicy;
      BENCH_NCCL(ncclCommInitRankConfig(&comms_[t], nranks(), id, rankOf(t), &config), nullptr);
    } else {
      BENCH_NCCL(ncclCommInitRank(&comms_[t], nranks(), id, rankOf(t)), nullptr);
    }
  };
  if (n == 1) {
    initRank(0);
    return;
  }
  // Each thread joins on its own; InitRank blocks until all ranks have.
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      try {
        initRank(t);
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < n; ++t)
    if (!errors[t].empty())
      benchFail(Status::kNcclError, "rank %d: %s", rankOf(t), errors[t].c_str());
}

int BenchProcess::run() {
  const Options& o = in_.opts;
  ncclGetVersion(&version_);
  for (const std::string& note : notes_) print(0, note);
  if (!o.outputFile.empty() && proc() == 0)
    print(0, json_.open(o.outputFile, in_.argc, in_.argv, version_));

  {
    Rendezvous rendezvous(in_.placement);
    try {
      initComms();
    } catch (const BenchError& e) {
      fatal(0, e.status(), e.what());
    }
    rendezvous.release();
  }

  errorCounts_.assign(nThreads(), 0);
  avgBusBw_.assign(nThreads(), 0);
  // nccl-tests runs thread 0 on the main thread.
  std::vector<std::thread> threads;
  for (int t = 1; t < nThreads(); ++t) threads.emplace_back([this, t] { rankMain(t); });
  rankMain(0);
  for (auto& th : threads) th.join();

  if (errorCounts_[0] || avgBusBw_[0] < minBusBw() * 0.9)
    return static_cast<int>(Status::kNumResults);
  return 0;
}

double BenchProcess::minBusBw() {
  const char* env = getenv("NCCL_TESTS_MIN_BW");
  return env ? atof(env) : -1;
}

void BenchProcess::rankMain(int t) {
  try {
    // NCCL_TESTS_SPLIT: the test runs on this rank's group; the job's communicator keeps the
    // control traffic (barriers, times), so the groups run side by side and report as one.
    if (in_.split.active()) {
      Watchdog::Busy busy(*watchdog_, t);
      BENCH_NCCL(ncclCommSplit(comms_[t], color(), rankOf(t), &groups_[t], nullptr), comms_[t]);
    }
    RankRunner runner(*this, t, groups_[t] ? groups_[t] : comms_[t], comms_[t]);
    // Gather every rank's device line: each writes its slot, a byte-wise sum joins them.
    std::vector<uint8_t> lines(kDeviceLineBytes * nranks(), 0), all(lines.size(), 0);
    std::string mine =
        formatDeviceLine(rankOf(t), color(), static_cast<int>(getpid()), hostName(),
                         cuda_ ? deviceOf(t) : -1, cuda_ ? "cuda" : "host", deviceDescription(t));
    memcpy(lines.data() + kDeviceLineBytes * rankOf(t), mine.data(),
           std::min(mine.size(), kDeviceLineBytes - 1));
    {
      Watchdog::Busy busy(*watchdog_, t);
      BENCH_NCCL(ncclAllReduce(lines.data(), all.data(), all.size(), ncclUint8, ncclSum, comms_[t],
                               nullptr),
                 comms_[t]);
    }
    if (isPrinter(t)) printHeader(all);
    runner.run();
    errorCounts_[t] = static_cast<int>(runner.sumAll(runner.errors()));
    avgBusBw_[t] = runner.bwCount() ? runner.bwSum() / runner.bwCount() : 0;
    if (isPrinter(t)) printFooter(t);
    runner.barrier();
  } catch (const BenchError& e) {
    fatal(t, e.status(), e.what());
  } catch (const std::exception& e) {
    fatal(t, Status::kInternalError, e.what());
  }
  if (groups_[t]) {
    if (ncclResult_t res = ncclCommDestroy(groups_[t]); res != ncclSuccess)
      fatal(t, Status::kNcclError,
            formatString("ncclCommDestroy (NCCL_TESTS_SPLIT group) failed: %s",
                         ncclGetErrorString(res)));
    groups_[t] = nullptr;
  }
  if (ncclResult_t res = ncclCommDestroy(comms_[t]); res != ncclSuccess)
    fatal(t, Status::kNcclError,
          formatString("ncclCommDestroy failed: %s", ncclGetErrorString(res)));
  comms_[t] = nullptr;
}

void BenchProcess::printHeader(const std::vector<uint8_t>& deviceLines) {
  const Options& o = in_.opts;
  HeaderInfo info{in_.programName, version_, in_.placement.launcher, cuda_ ? "device" : "host",
                  nranks(), splitLine()};
  std::string header = formatHeader(o, info) + "# Using devices\n";
  std::vector<DeviceRecord> records;
  for (int r = 0; r < nranks(); ++r) {
    const char* line = reinterpret_cast<const char*>(deviceLines.data() + kDeviceLineBytes * r);
    std::string text(line, strnlen(line, kDeviceLineBytes));
    header += text;
    DeviceRecord d{};
    char host[256] = {}, bus[64] = {}, infoText[256] = {};
    sscanf(text.c_str(), "#  Rank %d Group %d Pid %d on %255s device %d [%63[^]]] %255[^\n]",
           &d.rank, &d.group, &d.pid, host, &d.device, bus, infoText);
    d.host = host;
    d.busId = bus;
    d.info = infoText;
    records.push_back(d);
  }
  print(0, header);
  json_.config(o);
  json_.devices(records);
  print(0, formatColumnHeader(o));
  json_.beginResults();
}

std::string BenchProcess::splitLine() const {
  if (!in_.split.active()) return "";
  std::string sizes;
  const std::vector<int> groups = in_.split.groupSizes(nProcs());
  for (int n : groups) sizes += (sizes.empty() ? "" : ", ") + std::to_string(n * nThreads());
  return formatString("%s: %zu group%s of %s ranks (color = process %c %ld), each running the "
                      "test on a communicator of its own, side by side; times are averaged over "
                      "every rank, bandwidths are those of rank 0's group",
                      in_.split.spec.c_str(), groups.size(), groups.size() == 1 ? "" : "s",
                      sizes.c_str(), in_.split.op, in_.split.value);
}

void BenchProcess::printFooter(int t) {
  const Options& o = in_.opts;
  print(t, formatFooter(errorCounts_[t], avgBusBw_[t], minBusBw(), in_.programName));
  json_.footer(errorCounts_[t], avgBusBw_[t], minBusBw());
  if (o.memoryReport) {
    std::string bytes = memString(2.0 * (maxBytes_ + 8.0 * o.unalign));
    print(t, formatString("# %-20s : User-Allocated %s | Total  %s (per rank)\n",
                          "Host memory usage", bytes.c_str(), bytes.c_str()));
  }
  print(t, "#\n");
  const char* last = ncclGetLastError(nullptr);
  std::string lastError = last ? last : "";
  print(t, lastError.empty() ? "\n" : "# error: " + lastError + "\n");
  json_.close(lastError);
}

// ---------------- benchMain ----------------

int benchMain(int argc, char** argv, const Collective& collective) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* slash = strrchr(argv[0], '/');
  std::string program = slash ? slash + 1 : argv[0];
  RunInputs in;
  in.coll = &collective;
  in.programName = program;
  in.argc = argc;
  in.argv = argv;
  try {
    in.opts = parseOptions(argc, argv);
    if (in.opts.help) {
      fputs(usage(program.c_str()).c_str(), stdout);
      return 0;
    }
    if (in.opts.deviceImpl > 0)
      benchFail(Status::kInvalidUsage,
                "device implementation (-D %d) needs device buffers and NCCL's device API, which "
                "host buffers do not have",
                in.opts.deviceImpl);
    if (in.opts.nranks == 0)
      if (const char* n = getenv("LOOM_BENCH_NRANKS"); n && *n) in.opts.nranks = atoi(n);
    in.split = parseTestSplit();
    in.placement = detectPlacement(processEnv());
    if (in.opts.nranks > 1 && in.placement.kind != LaunchKind::kForkChild) {
      if (in.placement.nProcs > 1)
        benchFail(Status::kInvalidUsage,
                  "--nranks/-np %d cannot be combined with an external launcher (%s started %d "
                  "processes)",
                  in.opts.nranks, in.placement.launcher.c_str(), in.placement.nProcs);
      if (std::optional<int> parentExit = forkRanks(in.opts.nranks)) return *parentExit;
      in.placement = detectPlacement(processEnv());
    }
    if (in.split.active() && in.opts.root == -1) {
      std::vector<int> sizes = in.split.groupSizes(in.placement.nProcs);
      if (std::adjacent_find(sizes.begin(), sizes.end(), std::not_equal_to<>()) != sizes.end())
        benchFail(Status::kInvalidUsage,
                  "-r -1 (every root) with %s: its groups differ in size, so they would run "
                  "different numbers of roots; give one root or a split into equal groups",
                  in.split.spec.c_str());
    }
    BenchProcess process(in);
    return process.run();
  } catch (const BenchError& e) {
    fflush(stdout);
    fprintf(stderr, "%s: %s\n", program.c_str(), e.what());
    if (e.status() == Status::kInvalidUsage)
      fprintf(stderr, "Run '%s -h' for usage.\n", program.c_str());
    return static_cast<int>(e.status());
  }
}

}  // namespace loom::bench
