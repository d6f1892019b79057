// The all-reduce sweep: a private job of `nranks` ranks as threads of this process, each
// with its own communicator (ncclGetUniqueId + ncclCommInitRank, as a job's ranks do), on
// host memory. Every rank checks every element of its result, and the fastest iteration of
// each size is held against the cost model's prediction for this host.
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "algo/select.h"
#include "algo/simulate.h"
#include "base/config.h"
#include "base/error.h"
#include "base/host.h"
#include "doctor.h"

namespace loom::doctor {
namespace {

const size_t kSizes[] = {8, 1 << 10, 64 << 10, 1 << 20, 4 << 20};
constexpr int kSizeCount = sizeof(kSizes) / sizeof(kSizes[0]);
// Waking a parked thread costs tens of microseconds on a busy host whatever the model says.
constexpr double kAllowanceUs = 50;

std::atomic<bool> leftRunning{false};

struct Shared {
  explicit Shared(int n) : nranks(n), barrier(n) {}
  const int nranks;
  ncclUniqueId id{};
  std::barrier<> barrier;
  int iters[kSizeCount] = {};
  std::vector<double> times[kSizeCount];  // [iteration * nranks + rank], microseconds
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  std::string error;  // the first failure, with its rank
};

float expected(size_t i, int nranks) {
  return static_cast<float>(nranks * (nranks + 1) / 2 + nranks * static_cast<int>(i % 13));
}

// Every element, or the first that differs.
std::string verify(const std::vector<float>& out, size_t count, int nranks) {
  for (size_t i = 0; i < count; ++i)
    if (out[i] != expected(i, nranks))
      return strprintf("element %zu is %g, expected %g", i, static_cast<double>(out[i]),
                       static_cast<double>(expected(i, nranks)));
  return "";
}

void rankMain(std::shared_ptr<Shared> sh, int rank) {
  ncclComm_t comm = nullptr;
  std::string err;
  auto nccl = [&](ncclResult_t rc, const char* what) {
    if (rc != ncclSuccess)
      LOOM_THROW(kInternalError, "%s: %s (%s)", what, ncclGetErrorString(rc), ncclGetLastError(comm));
  };
  bool inBarrier = true;
  try {
    nccl(ncclCommInitRank(&comm, sh->nranks, sh->id, rank), "ncclCommInitRank");
    const size_t maxCount = kSizes[kSizeCount - 1] / sizeof(float);
    std::vector<float> in(maxCount), out(maxCount);
    for (size_t i = 0; i < maxCount; ++i) in[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 13));
    for (int s = 0; s < kSizeCount; ++s) {
      const size_t count = kSizes[s] / sizeof(float);
      std::fill(out.begin(), out.begin() + static_cast<long>(count), -1.0f);
      for (int w = 0; w < 2; ++w)  // the first call selects and plans
        nccl(ncclAllReduce(in.data(), out.data(), count, ncclFloat, ncclSum, comm, nullptr), "ncclAllReduce");
      if (std::string bad = verify(out, count, sh->nranks); !bad.empty())
        LOOM_THROW(kInternalError, "wrong result at %s: %s", humanBytes(static_cast<double>(kSizes[s])).c_str(),
                   bad.c_str());
      for (int it = 0; it < sh->iters[s]; ++it) {
        if (it == sh->iters[s] - 1) std::fill(out.begin(), out.begin() + static_cast<long>(count), -1.0f);
        sh->barrier.arrive_and_wait();  // all ranks start each iteration together
        auto t0 = std::chrono::steady_clock::now();
        nccl(ncclAllReduce(in.data(), out.data(), count, ncclFloat, ncclSum, comm, nullptr), "ncclAllReduce");
        auto t1 = std::chrono::steady_clock::now();
        sh->times[s][static_cast<size_t>(it * sh->nranks + rank)] =
            std::chrono::duration<double, std::micro>(t1 - t0).count();
      }
      if (std::string bad = verify(out, count, sh->nranks); !bad.empty())
        LOOM_THROW(kInternalError, "wrong result at %s (timed run): %s",
                   humanBytes(static_cast<double>(kSizes[s])).c_str(), bad.c_str());
    }
    inBarrier = false;
    sh->barrier.arrive_and_drop();
    nccl(ncclCommDestroy(comm), "ncclCommDestroy");
    comm = nullptr;
  } catch (const std::exception& e) {  // Loom's errors, and bad_alloc for the buffers
    err = strprintf("rank %d: %s", rank, e.what());
    if (comm) ncclCommAbort(comm);  // peers waiting on this rank fail instead of hanging
    if (inBarrier) sh->barrier.arrive_and_drop();
  }
  std::lock_guard<std::mutex> lock(sh->mu);
  if (sh->error.empty()) sh->error = err;
  ++sh->finished;
  sh->cv.notify_all();
}

// The FIFO shape the engine would use (loom-topo reads it the same way).
std::pair<size_t, int> fifoShape() {
  size_t slot = 256 << 10;
  int depth = 8;
  if (const KnobBase* k = findKnob("LOOM_SLOT_BYTES"); k && k->type() == KnobType::kSize)
    slot = static_cast<const SizeKnob*>(k)->get();
  if (const KnobBase* k = findKnob("LOOM_FIFO_DEPTH"); k && k->type() == KnobType::kInt)
    depth = static_cast<int>(static_cast<const IntKnob*>(k)->get());
  return {slot, depth};
}

}  // namespace

bool sweepLeftThreads() { return leftRunning.load(); }

Check runSweep(const Host& host, const SweepOptions& opt) {
  const int n = opt.nranks;
  Check c("allreduce-" + std::to_string(n));
  c.fact("ranks", jsonNumber(n));
  if (!host.bootstrapOk) return c.set(Status::kSkip, "needs a usable bootstrap interface (see interface)");
  if (!host.sys) return c.set(Status::kSkip, "needs the topology (see gpus)");
  // A private job on this host: NCCL_COMM_ID names the real job's rendezvous, and a hang
  // must become an error well within the doctor's own time limit.
  unsetenv("NCCL_COMM_ID");
  unsetenv("LOOM_COMM_ID");
  const std::string limit = std::to_string(std::max(1, static_cast<int>(opt.timeoutS / 2)));
  setenv("LOOM_TIMEOUT", limit.c_str(), 1);
  setenv("LOOM_BOOTSTRAP_TIMEOUT", limit.c_str(), 1);

  std::vector<double> predicted(kSizeCount);
  std::vector<std::string> algos(kSizeCount);
  auto sh = std::make_shared<Shared>(n);
  try {
    const auto [slot, depth] = fifoShape();
    JobContexts job(JobContexts::contiguous(n, 1), algo::buildNodeModel(*host.sys, n, true), slot, depth);
    for (int s = 0; s < kSizeCount; ++s) {
      CollRequest req{Collective::kAllReduce, kSizes[s] / sizeof(float), sizeof(float), 0};
      predicted[s] = estimateMicros({req}, job[0]);
      algos[s] = algorithmName(select(req, job[0]).algorithm);
      // About 20 ms of timed calls per size, at least 5 and at most 40.
      sh->iters[s] = std::clamp(static_cast<int>(20000 / std::max(predicted[s], 1.0)), 5, 40);
      sh->times[s].assign(static_cast<size_t>(sh->iters[s] * n), 0);
    }
  } catch (const Error& e) {
    return c.set(Status::kFail, std::string("cannot start: ") + e.what(), "fix what the knobs check reports");
  }
  if (ncclResult_t rc = ncclGetUniqueId(&sh->id); rc != ncclSuccess)
    return c.set(Status::kFail, std::string("ncclGetUniqueId: ") + ncclGetLastError(nullptr),
                 "fix what the interface check reports");

  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(rankMain, sh, r);
  {
    std::unique_lock<std::mutex> lock(sh->mu);
    const bool done =
        sh->cv.wait_for(lock, std::chrono::duration<double>(opt.timeoutS), [&] { return sh->finished == n; });
    if (!done) {
      for (auto& t : threads) t.detach();  // they hold `sh`; the process exits soon after
      leftRunning = true;
      return c.set(Status::kFail, strprintf("%d ranks did not finish within %g s", n - sh->finished, opt.timeoutS),
                   "rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL to see where it stops");
    }
  }
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  c.fact("seconds", jsonNumber(seconds));
  if (!sh->error.empty())
    return c.set(Status::kFail, std::to_string(n) + " ranks (threads): " + sh->error,
                 sh->error.find("wrong result") != std::string::npos
                     ? "results are corrupted: report it with loom-info's output and this line"
                     : "rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL to see what failed");

  std::string sizesJson = "[", slow;
  double worstRatio = 0;
  std::string worst;
  c.detail.push_back(strprintf("%10s %-16s %6s %12s %12s %12s %7s", "size", "algorithm", "iters", "model us", "best us",
                               "median us", "x model"));
  for (int s = 0; s < kSizeCount; ++s) {
    // One iteration takes as long as its slowest rank.
    std::vector<double> iterUs(static_cast<size_t>(sh->iters[s]));
    for (int it = 0; it < sh->iters[s]; ++it)
      for (int r = 0; r < n; ++r)
        iterUs[static_cast<size_t>(it)] =
            std::max(iterUs[static_cast<size_t>(it)], sh->times[s][static_cast<size_t>(it * n + r)]);
    std::sort(iterUs.begin(), iterUs.end());
    const double best = iterUs.front(), median = iterUs[iterUs.size() / 2];
    const double ratio = predicted[s] > 0 ? best / predicted[s] : 0;
    const std::string size = humanBytes(static_cast<double>(kSizes[s]));
    if (ratio > worstRatio)
      worstRatio = ratio, worst = strprintf("%s: %.1f us vs %.1f us", size.c_str(), best, predicted[s]);
    if (best > opt.factor * predicted[s] + kAllowanceUs) slow += (slow.empty() ? "" : ", ") + size;
    c.detail.push_back(strprintf("%10s %-16s %6d %12.1f %12.1f %12.1f %7.1f", size.c_str(), algos[s].c_str(),
                                 sh->iters[s], predicted[s], best, median, ratio));
    sizesJson += strprintf(
        "%s{\"bytes\":%zu,\"algorithm\":%s,\"iterations\":%d,\"predictedUs\":%s,\"bestUs\":%s,"
        "\"medianUs\":%s,\"ratio\":%s,\"correct\":true}",
        s ? "," : "", kSizes[s], jsonString(algos[s]).c_str(), sh->iters[s], jsonNumber(predicted[s]).c_str(),
        jsonNumber(best).c_str(), jsonNumber(median).c_str(), jsonNumber(ratio).c_str());
  }
  c.fact("factor", jsonNumber(opt.factor));
  c.fact("sizes", sizesJson + "]");
  std::string found = strprintf(
      "%d ranks (threads), %d sizes %s..%s, every result exact; fastest run vs model up to %.1fx (%s); "
      "limit %gx + %g us",
      n, kSizeCount, humanBytes(static_cast<double>(kSizes[0])).c_str(),
      humanBytes(static_cast<double>(kSizes[kSizeCount - 1])).c_str(), worstRatio, worst.c_str(), opt.factor,
      kAllowanceUs);
  if (!slow.empty()) {
    double load[1] = {0};
    if (getloadavg(load, 1) == 1)
      found += strprintf("; too slow at %s (load average %.2f on %d CPUs)", slow.c_str(), load[0], hostCpus());
    else
      found += "; too slow at " + slow;
    return c.set(
        Status::kFail, found,
        "if the host is busy, rerun when idle (or raise --factor); else look for CPU contention (top), a small "
        "affinity mask, or knobs that force a slow path (NCCL_ALGO, NCCL_SHM_DISABLE, LOOM_SLOT_BYTES)");
  }
  return c.set(Status::kPass, found);
}

}  // namespace loom::doctor
