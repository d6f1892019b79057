// Memory kinds at the C API: every collective and point-to-point call classifies its
// buffers and refuses CUDA memory without touching a byte of it when nothing serves it
// (LOOM_NCCL_FALLBACK=off and LOOM_STAGED_PATH=0 here; tests/dispatch covers the fallback
// serving device buffers through stock NCCL, staged_test.cc Loom's staged path).
// The same tests run against the stand-in driver (engine_mem_kind_stand_in_test) and the
// real one (engine_mem_kind_cuda_test, skipped where there is no GPU).
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "base/mem_kind.h"
#include "core/rank_harness.h"
#include "device_memory.h"

namespace loomtest {
namespace {

constexpr size_t kCount = 4096;  // floats: several pages of device memory
constexpr size_t kBytes = kCount * sizeof(float);

// A one-rank communicator of the calling thread (bound to its current device).
class OneRank {
 public:
  OneRank() {
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) == ncclSuccess && ncclCommInitRank(&comm_, 1, id, 0) != ncclSuccess)
      comm_ = nullptr;
  }
  ~OneRank() {
    if (comm_) ncclCommDestroy(comm_);
  }
  OneRank(const OneRank&) = delete;
  OneRank& operator=(const OneRank&) = delete;
  ncclComm_t get() const { return comm_; }
  int device() const {
    int dev = -2;
    return ncclCommCuDevice(comm_, &dev) == ncclSuccess ? dev : -2;
  }

 private:
  ncclComm_t comm_ = nullptr;
};

using Call = std::function<ncclResult_t(void* send, void* recv, ncclComm_t comm)>;
struct EntryPoint {
  const char* label;   // what the test calls
  const char* fn;      // the call the message must name
  const char* buffer;  // the buffer the message must name
  Call call;
};

// Every collective and point-to-point entry point, on a one-rank communicator (root and
// peer 0), with float buffers of kCount elements.
std::vector<EntryPoint> entryPoints() {
  const size_t n = kCount;
  return {
      {"ncclAllReduce", "ncclAllReduce", "sendbuff",
       [n](void* s, void* r, ncclComm_t c) {
         return ncclAllReduce(s, r, n, ncclFloat, ncclSum, c, nullptr);
       }},
      {"ncclBroadcast", "ncclBroadcast", "sendbuff (root)",
       [n](void* s, void* r, ncclComm_t c) {
         return ncclBroadcast(s, r, n, ncclFloat, 0, c, nullptr);
       }},
      {"ncclBcast", "ncclBroadcast", "sendbuff (root)",
       [n](void* s, void*, ncclComm_t c) { return ncclBcast(s, n, ncclFloat, 0, c, nullptr); }},
      {"ncclReduce", "ncclReduce", "sendbuff",
       [n](void* s, void* r, ncclComm_t c) {
         return ncclReduce(s, r, n, ncclFloat, ncclSum, 0, c, nullptr);
       }},
      {"ncclAllGather", "ncclAllGather", "sendbuff",
       [n](void* s, void* r, ncclComm_t c) { return ncclAllGather(s, r, n, ncclFloat, c, nullptr); }},
      {"ncclReduceScatter", "ncclReduceScatter", "sendbuff",
       [n](void* s, void* r, ncclComm_t c) {
         return ncclReduceScatter(s, r, n, ncclFloat, ncclSum, c, nullptr);
       }},
      {"ncclAlltoAll", "ncclAlltoAll", "sendbuff",
       [n](void* s, void* r, ncclComm_t c) { return ncclAlltoAll(s, r, n, ncclFloat, c, nullptr); }},
      {"ncclGather", "ncclGather", "sendbuff",
       [n](void* s, void* r, ncclComm_t c) { return ncclGather(s, r, n, ncclFloat, 0, c, nullptr); }},
      {"ncclScatter", "ncclScatter", "sendbuff (root)",
       [n](void* s, void* r, ncclComm_t c) { return ncclScatter(s, r, n, ncclFloat, 0, c, nullptr); }},
      {"ncclSend", "ncclSend", "sendbuff",
       [n](void* s, void*, ncclComm_t c) { return ncclSend(s, n, ncclFloat, 0, c, nullptr); }},
      {"ncclRecv", "ncclRecv", "recvbuff",
       [n](void*, void* r, ncclComm_t c) { return ncclRecv(r, n, ncclFloat, 0, c, nullptr); }},
  };
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Suite names differ per executable (CMakeLists.txt), so CTest names stay unique.
class MEM_KINDS_SUITE : public testing::Test {
 protected:
  void SetUp() override {
    setenv("LOOM_NCCL_FALLBACK", "off", 1);  // read at each communicator's init
    setenv("LOOM_STAGED_PATH", "0", 1);
    mem_ = makeDeviceMemory();
    if (std::string why = mem_->unavailable(); !why.empty()) {
#ifdef LOOM_STAND_IN_CUDA_PATH
      FAIL() << why;  // the stand-in is always there: its absence is a bug
#else
      GTEST_SKIP() << why;
#endif
    }
  }
  std::unique_ptr<DeviceMemory> mem_;
};

TEST_F(MEM_KINDS_SUITE, ClassifiesEachKindOfMemory) {
  char* d0 = static_cast<char*>(mem_->allocDevice(kBytes, 0, 0x5a));
  loom::MemInfo info = loom::classifyPointer(d0);
  EXPECT_EQ(info.kind, loom::MemKind::kDevice);
  EXPECT_EQ(info.device, 0);
  info = loom::classifyPointer(d0 + kBytes / 2 + 3);  // an interior pointer
  EXPECT_EQ(info.kind, loom::MemKind::kDevice);
  EXPECT_EQ(info.device, 0);
  if (mem_->deviceCount() >= 2) {
    info = loom::classifyPointer(mem_->allocDevice(kBytes, 1, 0x5a));
    EXPECT_EQ(info.kind, loom::MemKind::kDevice);
    EXPECT_EQ(info.device, 1);
  }
  EXPECT_EQ(loom::classifyPointer(mem_->allocManaged(kBytes, 0)).kind, loom::MemKind::kDevice)
      << "managed memory may live on a GPU: it must never be touched by the CPU executor";
  EXPECT_EQ(loom::classifyPointer(mem_->allocPinned(kBytes)).kind, loom::MemKind::kHost);
  int onStack = 0;
  std::vector<float> onHeap(kCount);
  EXPECT_EQ(loom::classifyPointer(&onStack).kind, loom::MemKind::kHost);
  EXPECT_EQ(loom::classifyPointer(onHeap.data()).kind, loom::MemKind::kHost);
  EXPECT_EQ(loom::classifyPointer(&onStack).device, -1);
  EXPECT_STREQ(loom::memKindName(loom::MemKind::kDevice), "device");
  EXPECT_STREQ(loom::memKindName(loom::MemKind::kHost), "host");
}

TEST_F(MEM_KINDS_SUITE, EveryEntryPointRefusesDeviceBuffers) {
  void* send = mem_->allocDevice(kBytes, 0, 0x11);
  void* recv = mem_->allocDevice(kBytes, 0, 0x22);
  mem_->makeCurrent(0);
  OneRank comm;
  ASSERT_NE(comm.get(), nullptr) << ncclGetLastError(nullptr);
  EXPECT_EQ(comm.device(), 0) << "the communicator takes the current device";
  for (const EntryPoint& e : entryPoints()) {
    SCOPED_TRACE(e.label);
    EXPECT_EQ(e.call(send, recv, comm.get()), ncclInvalidUsage);
    std::string msg = ncclGetLastError(comm.get());
    EXPECT_TRUE(msg.rfind(e.fn, 0) == 0) << msg;
    EXPECT_TRUE(contains(msg, e.buffer)) << msg;
    EXPECT_TRUE(contains(msg, "CUDA device memory")) << msg;
    EXPECT_TRUE(contains(msg, "not supported")) << msg;
    EXPECT_EQ(std::string(ncclGetLastError(nullptr)), msg) << "the thread's last error too";
  }
  EXPECT_TRUE(mem_->holds(send, kBytes, 0x11)) << "a refused call wrote to sendbuff";
  EXPECT_TRUE(mem_->holds(recv, kBytes, 0x22)) << "a refused call wrote to recvbuff";

  // Nothing was queued: the communicator still runs host calls.
  std::vector<float> in(kCount, 2.5f), out(kCount, 0.0f);
  ASSERT_EQ(ncclAllReduce(in.data(), out.data(), kCount, ncclFloat, ncclSum, comm.get(), nullptr),
            ncclSuccess)
      << ncclGetLastError(comm.get());
  EXPECT_EQ(out, in);
}

TEST_F(MEM_KINDS_SUITE, EmptyDeviceBuffersAreNotLookedAt) {
  void* dev = mem_->allocDevice(kBytes, 0, 0x66);
  mem_->makeCurrent(0);
  OneRank comm;
  ASSERT_NE(comm.get(), nullptr) << ncclGetLastError(nullptr);
  // A zero count is a valid no-op in NCCL, whatever the pointers.
  EXPECT_EQ(ncclAllReduce(dev, dev, 0, ncclFloat, ncclSum, comm.get(), nullptr), ncclSuccess)
      << ncclGetLastError(comm.get());
  EXPECT_EQ(ncclAllGather(dev, dev, 0, ncclFloat, comm.get(), nullptr), ncclSuccess)
      << ncclGetLastError(comm.get());
  EXPECT_EQ(ncclSend(dev, 0, ncclFloat, 0, comm.get(), nullptr), ncclSuccess)
      << ncclGetLastError(comm.get());
  EXPECT_TRUE(mem_->holds(dev, kBytes, 0x66));
}

TEST_F(MEM_KINDS_SUITE, MixedKindsAreInvalidArgument) {
  void* dev = mem_->allocDevice(kBytes, 0, 0x33);
  mem_->makeCurrent(0);
  OneRank comm;
  ASSERT_NE(comm.get(), nullptr) << ncclGetLastError(nullptr);
  std::vector<float> host(kCount, 7.0f);

  EXPECT_EQ(ncclAllReduce(dev, host.data(), kCount, ncclFloat, ncclSum, comm.get(), nullptr),
            ncclInvalidArgument);
  std::string msg = ncclGetLastError(comm.get());
  EXPECT_TRUE(msg.rfind("ncclAllReduce", 0) == 0) << msg;
  EXPECT_TRUE(contains(msg, "sendbuff") && contains(msg, "recvbuff")) << msg;
  EXPECT_TRUE(contains(msg, "is device memory") && contains(msg, "is host memory")) << msg;

  EXPECT_EQ(ncclReduceScatter(host.data(), dev, kCount, ncclFloat, ncclSum, comm.get(), nullptr),
            ncclInvalidArgument);
  msg = ncclGetLastError(comm.get());
  EXPECT_TRUE(msg.rfind("ncclReduceScatter", 0) == 0) << msg;
  EXPECT_TRUE(contains(msg, "sendbuff") && contains(msg, "recvbuff")) << msg;
  EXPECT_TRUE(contains(msg, "is host memory") && contains(msg, "is device memory")) << msg;

  EXPECT_EQ(host, std::vector<float>(kCount, 7.0f)) << "a refused call wrote to the host buffer";
  EXPECT_TRUE(mem_->holds(dev, kBytes, 0x33));
}

TEST_F(MEM_KINDS_SUITE, BufferOfAnotherDeviceIsInvalidArgument) {
  if (mem_->deviceCount() < 2) GTEST_SKIP() << "needs two GPUs; this machine has one";
  void* send = mem_->allocDevice(kBytes, 1, 0x44);
  void* recv = mem_->allocDevice(kBytes, 1, 0x45);
  mem_->makeCurrent(0);
  OneRank comm;
  ASSERT_NE(comm.get(), nullptr) << ncclGetLastError(nullptr);
  ASSERT_EQ(comm.device(), 0);
  EXPECT_EQ(ncclAllReduce(send, recv, kCount, ncclFloat, ncclSum, comm.get(), nullptr),
            ncclInvalidArgument);
  std::string msg = ncclGetLastError(comm.get());
  EXPECT_TRUE(msg.rfind("ncclAllReduce", 0) == 0) << msg;
  EXPECT_TRUE(contains(msg, "sendbuff")) << msg;
  EXPECT_TRUE(contains(msg, "CUDA device 1") && contains(msg, "uses CUDA device 0")) << msg;
  EXPECT_EQ(ncclRecv(recv, kCount, ncclFloat, 0, comm.get(), nullptr), ncclInvalidArgument);
  msg = ncclGetLastError(comm.get());
  EXPECT_TRUE(msg.rfind("ncclRecv", 0) == 0 && contains(msg, "recvbuff")) << msg;
  EXPECT_TRUE(mem_->holds(send, kBytes, 0x44));
  EXPECT_TRUE(mem_->holds(recv, kBytes, 0x45));
}

TEST_F(MEM_KINDS_SUITE, CommunicatorTakesTheCurrentDevice) {
  int want = mem_->deviceCount() >= 2 ? 1 : 0;
  mem_->makeCurrent(want);
  OneRank bound;
  ASSERT_NE(bound.get(), nullptr) << ncclGetLastError(nullptr);
  EXPECT_EQ(bound.device(), want);

  mem_->makeCurrent(-1);
  OneRank hostOnly;
  ASSERT_NE(hostOnly.get(), nullptr) << ncclGetLastError(nullptr);
  EXPECT_EQ(hostOnly.device(), -1) << "no current context: a host-only communicator";
  // A host-only communicator has no device to mismatch: device memory is unsupported.
  void* dev = mem_->allocDevice(kBytes, want, 0x55);
  EXPECT_EQ(ncclAllReduce(dev, dev, kCount, ncclFloat, ncclSum, hostOnly.get(), nullptr),
            ncclInvalidUsage);
  EXPECT_TRUE(contains(ncclGetLastError(hostOnly.get()), "not supported"))
      << ncclGetLastError(hostOnly.get());
  EXPECT_TRUE(mem_->holds(dev, kBytes, 0x55));
}

// ncclMemAlloc gives memory of the calling thread's current device, as NCCL's does (nccl-tests
// fills it with cudaMemset), and host memory when no device is current; ncclMemFree takes
// both back.
TEST_F(MEM_KINDS_SUITE, MemAllocGivesMemoryOfTheCurrentDevice) {
  mem_->makeCurrent(0);
  void* dev = nullptr;
  ASSERT_EQ(ncclMemAlloc(&dev, kBytes), ncclSuccess) << ncclGetLastError(nullptr);
  loom::MemInfo info = loom::classifyPointer(dev);
  EXPECT_EQ(info.kind, loom::MemKind::kDevice);
  EXPECT_EQ(info.device, 0);
  std::vector<unsigned char> pattern(kBytes, 0x3c);
  mem_->toDevice(dev, pattern.data(), kBytes);
  EXPECT_TRUE(mem_->holds(dev, kBytes, 0x3c));
  EXPECT_EQ(ncclMemFree(dev), ncclSuccess) << ncclGetLastError(nullptr);

  mem_->makeCurrent(-1);
  void* host = nullptr;
  ASSERT_EQ(ncclMemAlloc(&host, kBytes), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(loom::classifyPointer(host).kind, loom::MemKind::kHost);
  std::memset(host, 0x7e, kBytes);
  EXPECT_EQ(static_cast<unsigned char*>(host)[kBytes - 1], 0x7e);
  EXPECT_EQ(ncclMemFree(host), ncclSuccess);
}

// Where stock NCCL serves a communicator's device memory, ncclMemAlloc's memory (stock's
// cuMem allocation) takes its symmetric windows and registrations, and collectives on it
// are exact (api/registration.cc, mem_alloc.cc). On a GPU with a stock NCCL
// (LOOM_NCCL_LIBRARY, as scripts/gpu_check.sh sets it) every step must succeed; on the
// stand-in, whose stock NCCL (the machine's, if any) finds no GPU, the windows are refused
// saying why.
TEST_F(MEM_KINDS_SUITE, StockWindowsOnMemAllocMemory) {
  unsetenv("LOOM_NCCL_FALLBACK");  // auto: stock NCCL where it can serve
  mem_->makeCurrent(0);
  OneRank one;
  setenv("LOOM_NCCL_FALLBACK", "off", 1);
  ASSERT_NE(one.get(), nullptr) << ncclGetLastError(nullptr);
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(ncclMemAlloc(&a, kBytes), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_EQ(ncclMemAlloc(&b, kBytes), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(loom::classifyPointer(a).kind, loom::MemKind::kDevice);
  ncclWindow_t wa = nullptr;
  ncclResult_t rc = ncclCommWindowRegister(one.get(), a, kBytes, &wa, NCCL_WIN_COLL_SYMMETRIC);
  const std::string why = rc == ncclSuccess ? "" : ncclGetLastError(one.get());
#ifdef LOOM_STAND_IN_CUDA_PATH
  EXPECT_EQ(rc, ncclInvalidUsage);
  EXPECT_NE(why.find("symmetric memory windows are stock NCCL's"), std::string::npos) << why;
#else
  const bool stock = getenv("LOOM_NCCL_LIBRARY") != nullptr;
  if (!stock && rc != ncclSuccess) {
    EXPECT_NE(why.find("symmetric memory windows are stock NCCL's"), std::string::npos) << why;
  } else {
    ASSERT_EQ(rc, ncclSuccess) << why;
    ncclWindow_t wb = nullptr;
    ASSERT_EQ(ncclCommWindowRegister(one.get(), b, kBytes, &wb, NCCL_WIN_COLL_SYMMETRIC),
              ncclSuccess) << ncclGetLastError(one.get());
    void* h = nullptr;
    ASSERT_EQ(ncclCommRegister(one.get(), a, kBytes, &h), ncclSuccess) << ncclGetLastError(one.get());
    std::vector<float> in(kCount), out(kCount, -1);
    for (size_t i = 0; i < kCount; ++i) in[i] = static_cast<float>(i % 251);
    mem_->toDevice(a, in.data(), kBytes);
    void* stream = mem_->createStream();
    ASSERT_EQ(ncclAllReduce(a, b, kCount, ncclFloat, ncclSum, one.get(),
                            static_cast<cudaStream_t>(stream)),
              ncclSuccess) << ncclGetLastError(one.get());
    mem_->syncStream(stream);
    mem_->fromDevice(out.data(), b, kBytes);
    EXPECT_EQ(out, in);
    EXPECT_EQ(ncclCommDeregister(one.get(), h), ncclSuccess) << ncclGetLastError(one.get());
    EXPECT_EQ(ncclCommWindowDeregister(one.get(), wb), ncclSuccess) << ncclGetLastError(one.get());
    EXPECT_EQ(ncclCommWindowDeregister(one.get(), wa), ncclSuccess) << ncclGetLastError(one.get());
  }
#endif
  EXPECT_EQ(ncclMemFree(a), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclMemFree(b), ncclSuccess) << ncclGetLastError(nullptr);
}

// Host memory, pageable and pinned, keeps working on device-bound communicators, and a
// refused device call in the middle leaves the ranks in step. Runs without a GPU too.
TEST(MEM_KINDS_HOST_SUITE, HostBuffersGiveExactResults) {
  constexpr int kRanks = 3;
  constexpr size_t kN = 100000;
  setenv("LOOM_STAGED_PATH", "0", 1);  // device calls are refused (read at init)
  std::unique_ptr<DeviceMemory> mem = makeDeviceMemory();
  bool gpu = mem->unavailable().empty();
  std::vector<int32_t*> pinned(kRanks, nullptr);
  std::vector<void*> dev(kRanks, nullptr);
  if (gpu)
    for (int r = 0; r < kRanks; ++r) {
      pinned[r] = static_cast<int32_t*>(mem->allocPinned(kN * sizeof(int32_t)));
      dev[r] = mem->allocDevice(kN * sizeof(int32_t), 0, 0x77);
    }
  RankOptions opt;
  opt.beforeInit = [&](int) {
    if (gpu) mem->makeCurrent(0);
  };
  auto failures = runRanks(
      Mode::kThreads, kRanks,
      [&](int rank, int nranks, ncclComm_t comm) -> std::string {
        int device = -2;
        RANK_NCCL(ncclCommCuDevice(comm, &device));
        RANK_CHECK(device == (gpu ? 0 : -1), "cudaDev %d", device);
        if (gpu) {
          ncclResult_t r = ncclAllReduce(dev[rank], dev[rank], kN, ncclInt32, ncclSum, comm, nullptr);
          RANK_CHECK(r == ncclInvalidUsage, "device all-reduce returned %d", r);
        }
        std::vector<int32_t> pageable(kN);
        for (size_t i = 0; i < kN; ++i) pageable[i] = rank * 1000 + static_cast<int32_t>(i % 977);
        std::vector<int32_t> out(kN, -1);
        RANK_NCCL(ncclAllReduce(pageable.data(), out.data(), kN, ncclInt32, ncclSum, comm, nullptr));
        for (size_t i = 0; i < kN; ++i) {
          int32_t want = 1000 * (nranks * (nranks - 1) / 2) + nranks * static_cast<int32_t>(i % 977);
          RANK_CHECK(out[i] == want, "pageable: [%zu] = %d, want %d", i, out[i], want);
        }
        if (pinned[rank]) {
          int32_t* p = pinned[rank];
          for (size_t i = 0; i < kN; ++i) p[i] = (rank + 1) * static_cast<int32_t>(i % 31);
          RANK_NCCL(ncclAllReduce(p, p, kN, ncclInt32, ncclSum, comm, nullptr));  // in place
          for (size_t i = 0; i < kN; ++i) {
            int32_t want = (nranks * (nranks + 1) / 2) * static_cast<int32_t>(i % 31);
            RANK_CHECK(p[i] == want, "pinned: [%zu] = %d, want %d", i, p[i], want);
          }
        }
        return "";
      },
      opt);
  EXPECT_TRUE(failures.empty()) << joinFailures(failures);
  for (int r = 0; r < kRanks && gpu; ++r)
    EXPECT_TRUE(mem->holds(dev[r], kN * sizeof(int32_t), 0x77));
}

}  // namespace
}  // namespace loomtest
