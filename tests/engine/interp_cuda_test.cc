// The device executor's kernel (kernels/cuda/interp_kernel.cuh, libloom-cuda-kernels.so)
// on a GPU, without a communicator: every rank of a job is its own launch on its own
// stream on GPU 0 (ranks sharing a device), one block per channel, over FIFOs laid out in
// device memory as the executor lays them out (tail, slot sizes and slots on the receiving
// rank's side, the head on the sender's). Each rank's output must be bit-identical to the
// interpreter's on host threads (interp_harness.h), which CI holds bit-identical to the
// CPU executor. On a GPU it runs the real module (scripts/gpu_check.sh); in CI, with
// LOOM_CUDA_DRIVER_LIBRARY and LOOM_CUDA_KERNELS_LIBRARY naming the stand-ins (test aids,
// tests/engine/stand_in_*.cc), it runs the stand-in's launch: the same interpreter on a
// host thread per channel over the stand-in's device memory, so the launch ABI, the FIFO
// layout in device memory, statuses, the abort word and the counters' write-back are
// checked without a GPU. Skipped where there is neither.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype_ref.h"
#include "interp_harness.h"
#include "kernels/cuda/cuda_kernels_abi.h"

namespace loom {
namespace {

using namespace interptest;
using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUstream = void*;
using CUcontext = void*;
constexpr CUresult kNotReady = 600;  // CUDA_ERROR_NOT_READY

// GPU 0 through the driver (dlopen'd, as Loom does) and the kernels module.
class Gpu {
 public:
  static Gpu& get() {
    static Gpu* g = new Gpu();  // leaked: the module's runtime may outlive static destructors
    return *g;
  }
  const std::string& why() const { return why_; }

  // Device memory for one run, carved from one allocation and zeroed by zero().
  CUdeviceptr take(size_t bytes) {
    used_ = (used_ + 255) / 256 * 256;
    if (used_ + bytes > kArena) throw std::runtime_error("interp_cuda_test: arena too small");
    CUdeviceptr p = arena_ + used_;
    used_ += bytes;
    return p;
  }
  void reset() { used_ = 0; }
  void zero() { check(memsetD8_(arena_, 0, used_), "cuMemsetD8"); }
  void put(CUdeviceptr dst, const void* src, size_t bytes) {
    if (bytes) check(htod_(dst, src, bytes), "cuMemcpyHtoD");
  }
  void get(void* dst, CUdeviceptr src, size_t bytes) {
    if (bytes) check(dtoh_(dst, src, bytes), "cuMemcpyDtoH");
  }
  // Every copy and memset above done (they may return before the device holds the bytes).
  void settle() { check(ctxSync_(), "cuCtxSynchronize"); }
  CUstream stream(int i) { return streams_.at(i); }
  volatile uint32_t* abortWord() { return abort_; }
  int launch(const loomCudaInterpArgs& a, int channels, CUstream s) {
    return launch_(&a, channels, static_cast<loomCudaStream_t>(s));
  }
  CUresult query(CUstream s) { return query_(s); }

 private:
  static constexpr size_t kArena = size_t{256} << 20;

  // The driver and the module as Loom finds them: LOOM_CUDA_DRIVER_LIBRARY and
  // LOOM_CUDA_KERNELS_LIBRARY name others (in CI, the stand-ins).
  static const char* knob(const char* name, const char* otherwise) {
    const char* v = getenv(name);
    return v && *v ? v : otherwise;
  }

  Gpu() {
    const char* driver = knob("LOOM_CUDA_DRIVER_LIBRARY", "libcuda.so.1");
    void* lib = dlopen(driver, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      why_ = std::string("no CUDA driver here (") + driver + "), so no GPU to run kernels on";
      return;
    }
    auto bind = [&](auto& fn, const char* name) { return sym(lib, fn, name); };
    CUresult (*init)(unsigned) = nullptr;
    CUresult (*count)(int*) = nullptr;
    CUresult (*retain)(CUcontext*, int) = nullptr;
    CUresult (*setCurrent)(CUcontext) = nullptr;
    CUresult (*alloc)(CUdeviceptr*, size_t) = nullptr;
    CUresult (*allocHost)(void**, size_t) = nullptr;
    CUresult (*streamCreate)(CUstream*, unsigned) = nullptr;
    if (!(bind(init, "cuInit") && bind(count, "cuDeviceGetCount") &&
          bind(retain, "cuDevicePrimaryCtxRetain") && bind(setCurrent, "cuCtxSetCurrent") &&
          bind(alloc, "cuMemAlloc_v2") && bind(allocHost, "cuMemAllocHost_v2") &&
          bind(streamCreate, "cuStreamCreate") && bind(memsetD8_, "cuMemsetD8_v2") &&
          bind(htod_, "cuMemcpyHtoD_v2") && bind(dtoh_, "cuMemcpyDtoH_v2") &&
          bind(ctxSync_, "cuCtxSynchronize") && bind(query_, "cuStreamQuery"))) {
      why_ = std::string(driver) + " lacks a function the test needs";
      return;
    }
    int n = 0;
    if (init(0) != 0 || count(&n) != 0 || n < 1) {
      why_ = "the CUDA driver reports no usable GPU";
      return;
    }
    CUcontext ctx = nullptr;
    if (retain(&ctx, 0) != 0 || setCurrent(ctx) != 0) {
      why_ = "no context on GPU 0";
      return;
    }
    const char* named = knob("LOOM_CUDA_KERNELS_LIBRARY", nullptr);
    const char* module = named ? named : LOOM_CUDA_KERNELS_LIBRARY;
    void* mod = dlopen(module, RTLD_NOW | RTLD_LOCAL);
    if (!mod && !named) mod = dlopen(LOOM_CUDA_KERNELS_BUILT, RTLD_NOW | RTLD_LOCAL);
    int (*abi)() = nullptr;
    if (!mod || !sym(mod, abi, "loomCudaKernelsAbiVersion") ||
        !sym(mod, launch_, "loomCudaInterpLaunch") || abi() != LOOM_CUDA_KERNELS_ABI_VERSION) {
      // A GPU without Loom's kernels is a broken build, not a machine to skip on.
      broken_ = std::string("cannot use ") + module + ": " + (mod ? "wrong ABI" : dlerror());
      return;
    }
    void* host = nullptr;
    if (alloc(&arena_, kArena) != 0 || allocHost(&host, 4096) != 0) {
      broken_ = "cannot allocate the test's memory on GPU 0";
      return;
    }
    abort_ = static_cast<volatile uint32_t*>(host);
    *abort_ = 0;
    streams_.resize(8);
    for (auto& s : streams_)
      if (streamCreate(&s, 1 /* non-blocking */) != 0) broken_ = "cuStreamCreate failed";
  }
  template <typename Fn>
  static bool sym(void* lib, Fn*& fn, const char* name) {
    fn = reinterpret_cast<Fn*>(dlsym(lib, name));
    return fn != nullptr;
  }
  void check(CUresult r, const char* what) {
    if (r != 0) throw std::runtime_error(std::string(what) + " failed: CUDA error " + std::to_string(r));
  }

 public:
  std::string broken_;

 private:
  std::string why_;
  CUresult (*memsetD8_)(CUdeviceptr, unsigned char, size_t) = nullptr;
  CUresult (*htod_)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*dtoh_)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*ctxSync_)() = nullptr;
  CUresult (*query_)(CUstream) = nullptr;
  loomCudaInterpLaunch_t launch_ = nullptr;
  CUdeviceptr arena_ = 0;
  size_t used_ = 0;
  volatile uint32_t* abort_ = nullptr;
  std::vector<CUstream> streams_;
};

#define NEED_GPU()                                               \
  do {                                                           \
    if (!Gpu::get().why().empty()) GTEST_SKIP() << Gpu::get().why(); \
    ASSERT_EQ(Gpu::get().broken_, "");                           \
  } while (0)

// One job: every rank's plan, inputs and outputs (as bytes).
struct Job {
  std::vector<Plan> plans;
  size_t count = 0;
  Reducer red;
  std::vector<std::vector<char>> in, out;
};

// What the GPU run gives: each rank's output, and whether every launch finished (else the
// abort word stopped them after `patience`) with a zero status.
struct GpuResult {
  bool finished = true;
  std::vector<uint32_t> status;
  std::vector<std::vector<char>> out;
};

// Runs every rank of `job` as a launch of its own; only the ranks in `launch` (all when
// empty), so that a test can leave a peer missing.
GpuResult runOnGpu(const Job& job, size_t slotBytes, int depth, bool ll, std::vector<int> launch = {},
                   std::chrono::milliseconds patience = std::chrono::seconds(10)) {
  Gpu& g = Gpu::get();
  const int n = static_cast<int>(job.plans.size());
  if (launch.empty())
    for (int r = 0; r < n; ++r) launch.push_back(r);
  g.reset();
  struct Conn {
    CUdeviceptr ctrl, slots, head;
  };
  std::map<std::tuple<int, int, int>, Conn> conns;  // (from, to, conn)
  auto conn = [&](int from, int to, int c) {
    auto it = conns.find({from, to, c});
    if (it != conns.end()) return it->second;
    Conn x{g.take(sizeof(FifoCtrl)), g.take(slotBytes * depth), g.take(128)};
    conns[{from, to, c}] = x;
    return x;
  };
  const size_t stageBytes = (llCapacity(slotBytes) + 15) / 16 * 16;
  struct Rank {
    CUdeviceptr plan, send, recv, scratch, fifos, status, stage;
    std::vector<loomCudaFifo> table;
    int channels;
  };
  std::vector<Rank> ranks(n);
  const auto flat = flatten(job.plans);
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks[r];
    k.plan = g.take(flat[r]->bytes());
    k.send = g.take(std::max<size_t>(job.in[r].size(), 1));
    k.recv = g.take(std::max<size_t>(job.out[r].size(), 1));
    k.scratch = g.take(job.plans[r].scratchBytes + 64);
    k.channels = static_cast<int>(job.plans[r].channels.size());
    k.stage = g.take(2 * stageBytes * std::max(k.channels, 1));
    k.status = g.take(sizeof(uint32_t));
    std::vector<std::pair<int, int>> sends, recvs;
    job.plans[r].peers(&sends, &recvs);
    for (auto [p, c] : sends) {
      Conn x = conn(r, p, c);
      k.table.push_back({p, c, 1, depth, reinterpret_cast<void*>(x.ctrl), reinterpret_cast<void*>(x.slots),
                         slotBytes, reinterpret_cast<uint64_t*>(g.take(8)), reinterpret_cast<uint64_t*>(x.head)});
    }
    for (auto [p, c] : recvs) {
      Conn x = conn(p, r, c);
      k.table.push_back({p, c, 0, depth, reinterpret_cast<void*>(x.ctrl), reinterpret_cast<void*>(x.slots),
                         slotBytes, reinterpret_cast<uint64_t*>(g.take(8)), reinterpret_cast<uint64_t*>(x.head)});
    }
    k.fifos = g.take(std::max<size_t>(k.table.size(), 1) * sizeof(loomCudaFifo));
  }
  // Everything starts zeroed (FIFO counters, LL slots, statuses), then gets its contents.
  g.zero();
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks[r];
    g.put(k.plan, flat[r]->data(), flat[r]->bytes());
    g.put(k.send, job.in[r].data(), job.in[r].size());
    g.put(k.recv, job.out[r].data(), job.out[r].size());
    g.put(k.fifos, k.table.data(), k.table.size() * sizeof(loomCudaFifo));
  }
  g.settle();
  *g.abortWord() = 0;
  GpuResult res;
  res.status.assign(n, 0);
  std::vector<int> launched;
  for (int r : launch) {
    Rank& k = ranks[r];
    if (k.channels == 0) continue;
    loomCudaInterpArgs a{};
    a.plan = reinterpret_cast<const void*>(k.plan);
    a.count = job.count;
    a.elt = job.red.eltSize;
    a.sendbuf = reinterpret_cast<const void*>(k.send);
    a.recvbuf = reinterpret_cast<void*>(k.recv);
    a.scratch = reinterpret_cast<void*>(k.scratch);
    a.fifos = reinterpret_cast<const loomCudaFifo*>(k.fifos);
    a.nFifos = static_cast<int>(k.table.size());
    a.dtype = job.red.dtype;
    a.kind = static_cast<int>(job.red.kind);
    a.scalarBits = job.red.scalarBits;
    a.abortWord = const_cast<const uint32_t*>(g.abortWord());
    a.status = reinterpret_cast<uint32_t*>(k.status);
    a.proto = ll ? LOOM_CUDA_INTERP_PROTO_LL : LOOM_CUDA_INTERP_PROTO_SIMPLE;
    a.llStaging = reinterpret_cast<void*>(k.stage);
    a.llStageBytes = stageBytes;
    int rc = g.launch(a, k.channels, g.stream(r));
    if (rc != 0) throw std::runtime_error("loomCudaInterpLaunch returned " + std::to_string(rc));
    launched.push_back(r);
  }
  auto deadline = std::chrono::steady_clock::now() + patience;
  for (int r : launched) {
    CUresult q;
    while ((q = g.query(g.stream(r))) == kNotReady && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (q == kNotReady) res.finished = false;
    else if (q != 0) throw std::runtime_error("the kernel failed: CUDA error " + std::to_string(q));
  }
  if (!res.finished) *g.abortWord() = 1;  // stops every kernel at its next wait
  g.settle();
  res.out.resize(n);
  for (int r = 0; r < n; ++r) {
    g.get(&res.status[r], ranks[r].status, sizeof(uint32_t));
    res.out[r].resize(job.out[r].size());
    g.get(res.out[r].data(), ranks[r].recv, res.out[r].size());
  }
  return res;
}

// The same job on host threads, the same protocol (with LL, some connections move plain
// slots there: interp_harness.h's TableEnv): the reference.
std::vector<std::vector<char>> runOnHost(const Job& job, size_t slotBytes, int depth, bool ll = false) {
  const int n = static_cast<int>(job.plans.size());
  std::vector<std::vector<char>> out = job.out;
  std::vector<std::vector<char>> scratch(n);
  std::vector<TableEnv> envs(n);
  for (int r = 0; r < n; ++r) {
    scratch[r].resize(job.plans[r].scratchBytes + 64);
    envs[r].rank = r;
    envs[r].sendbuf = job.in[r].data();
    envs[r].recvbuf = out[r].data();
    envs[r].scratch = scratch[r].data();
  }
  EXPECT_TRUE(runInterp(job.plans, job.count, job.red, envs, slotBytes, depth, ll));
  return out;
}

// A job of `coll` over `count` elements of dtype (values the type holds exactly).
Job makeJob(const JobContexts& j, Collective coll, Algorithm algo, int channels, size_t count,
            const Reducer& red, int root) {
  const int n = j.nranks();
  CollRequest req{coll, count, red.eltSize, root};
  Selection sel = selectionFor(req, j[0], algo);
  sel.channels = channels;
  Job job;
  job.count = count;
  job.red = red;
  const size_t inCount = coll == Collective::kReduceScatter ? count * n : count;
  const size_t outCount = coll == Collective::kAllGather ? count * n : count;
  const auto t = static_cast<ncclDataType_t>(red.dtype);
  for (int r = 0; r < n; ++r) {
    job.plans.push_back(buildPlan(req, j[r], sel));
    job.in.emplace_back(inCount * red.eltSize);
    job.out.emplace_back(outCount * red.eltSize);
    for (size_t i = 0; i < inCount; ++i)
      loomtest::encode(t, loomtest::isUnsigned(t) ? double((r + i) % 5) : double(int((r * 7 + i) % 5) - 2),
                       job.in[r].data() + i * red.eltSize);
    for (size_t i = 0; i < outCount; ++i) loomtest::encode(t, 3.0, job.out[r].data() + i * red.eltSize);
  }
  return job;
}

std::string firstDifference(const std::vector<char>& got, const std::vector<char>& want, size_t elt) {
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) return "element " + std::to_string(i / elt) + " differs";
  return "";
}

constexpr size_t kSlot = 4096;
constexpr int kDepth = 4;

class InterpCuda : public testing::TestWithParam<bool> {};

// Every algorithm of 5 collectives on 1-8 ranks (one and two hosts), 1 and 2 channels,
// edge counts; float32 sum.
TEST_P(InterpCuda, EveryAlgorithmMatchesTheHostInterpreter) {
  NEED_GPU();
  const bool ll = GetParam();
  const std::vector<std::vector<int>> layouts = {{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0},
                                                 {0, 0, 1, 1}};
  size_t runs = 0;
  for (const auto& hostOf : layouts) {
    JobContexts j = job(hostOf, ll ? llCapacity(kSlot) : kSlot, kDepth);
    const int n = j.nranks();
    for (Collective coll : kColls)
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{5000}, size_t{100003}})
        for (int a = 0; a < kAlgoCount; ++a)
          for (int channels : {1, 2}) {
            const Algorithm algo = static_cast<Algorithm>(a);
            if (!canServe(algo, CollRequest{coll, count, 4, n - 1}, j[0])) continue;
            const Reducer red = Reducer::make(ncclFloat32, ncclSum, n);
            Job jb = makeJob(j, coll, algo, channels, count, red, n - 1);
            const std::string where = std::string(collectiveName(coll)) + "/" + algorithmName(algo) + " count " +
                                      std::to_string(count) + " on " + std::to_string(n) + " ranks, " +
                                      std::to_string(channels) + " channel(s)";
            GpuResult got = runOnGpu(jb, kSlot, kDepth, ll);
            ASSERT_TRUE(got.finished) << where << ": a kernel never finished (stopped by the abort word)";
            const auto want = runOnHost(jb, kSlot, kDepth, ll);
            for (int r = 0; r < n; ++r) {
              ASSERT_EQ(got.status[r], 0u) << where << ": rank " << r << " status";
              ASSERT_EQ(firstDifference(got.out[r], want[r], 4), "") << where << ": rank " << r;
            }
            ++runs;
          }
  }
  EXPECT_GT(runs, 300u);
}

INSTANTIATE_TEST_SUITE_P(Protocols, InterpCuda, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool>& info) { return info.param ? "LL" : "Simple"; });

// Every data type and reduction (PreMulSum too) through the algorithms of all-reduce,
// reduce-scatter and reduce on 3 ranks: the kernel's arithmetic is the CPU loops' bit for bit.
TEST(InterpCudaTypes, EveryTypeAndReductionMatchesTheHostInterpreter) {
  NEED_GPU();
  JobContexts j = job({0, 0, 0}, kSlot, kDepth);
  const int n = j.nranks();
  size_t runs = 0;
  for (ncclDataType_t t : loomtest::kAllTypes)
    for (int op = 0; op <= ncclNumOps; ++op)  // ncclNumOps: PreMulSum by 2
      for (Collective coll : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kReduce})
        for (int a = 0; a < kAlgoCount; ++a) {
          const Algorithm algo = static_cast<Algorithm>(a);
          const size_t count = 1003;
          if (!canServe(algo, CollRequest{coll, count, loomtest::typeSize(t), n - 1}, j[0])) continue;
          alignas(8) char two[8] = {};
          loomtest::encode(t, 2.0, two);
          const Reducer red = op == ncclNumOps ? Reducer::preMulSum(t, two) : Reducer::make(t, op, n);
          Job jb = makeJob(j, coll, algo, 2, count, red, n - 1);
          const std::string where = std::string(loomtest::typeName(t)) + " " +
                                    (op == ncclNumOps ? "premulsum" : loomtest::opName(ncclRedOp_t(op))) + " " +
                                    collectiveName(coll) + "/" + algorithmName(algo);
          GpuResult got = runOnGpu(jb, kSlot, kDepth, false);
          ASSERT_TRUE(got.finished) << where << ": a kernel never finished";
          const auto want = runOnHost(jb, kSlot, kDepth);
          for (int r = 0; r < n; ++r) {
            ASSERT_EQ(got.status[r], 0u) << where << ": rank " << r << " status";
            ASSERT_EQ(firstDifference(got.out[r], want[r], red.eltSize), "") << where << ": rank " << r;
          }
          ++runs;
        }
  EXPECT_GT(runs, 200u);
}

// A kernel whose peer never launches waits; the abort word stops it, and the stream is free.
TEST(InterpCudaAbort, TheAbortWordStopsAKernelWaitingForAMissingPeer) {
  NEED_GPU();
  JobContexts j = job({0, 0}, kSlot, kDepth);
  const Reducer red = Reducer::make(ncclFloat32, ncclSum, 2);
  Job jb = makeJob(j, Collective::kAllReduce, Algorithm::kRing, 1, 100000, red, 1);
  const auto t0 = std::chrono::steady_clock::now();
  GpuResult got = runOnGpu(jb, kSlot, kDepth, false, {0}, std::chrono::milliseconds(500));  // no rank 1
  EXPECT_FALSE(got.finished);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  // The GPU is usable afterwards: the whole job runs.
  *Gpu::get().abortWord() = 0;
  GpuResult again = runOnGpu(jb, kSlot, kDepth, false);
  ASSERT_TRUE(again.finished);
  const auto want = runOnHost(jb, kSlot, kDepth);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(firstDifference(again.out[r], want[r], 4), "") << "rank " << r;
}

}  // namespace
}  // namespace loom
