// Loom's staged path (src/engine/staged.h): device buffers served by the host engine, in
// the order of the caller's stream, while the call returns at once (ranks of one process
// on one device: once the ranks' calls have run on the host). The same tests run
// against the stand-in driver (engine_staged_stand_in_test: device memory is PROT_NONE
// pages that only the driver's copies reach) and the real one (engine_staged_cuda_test,
// skipped where there is no GPU). LOOM_NCCL_FALLBACK=off: stock NCCL serves nothing here.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <dirent.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "algo/select.h"
#include "api/comm.h"
#include "base/log.h"
#include "core/core_util.h"
#include "core/rank_harness.h"
#include "device_memory.h"
#include "engine/device_exec.h"

namespace loomtest {
namespace {

constexpr const char* kSkip = "skip: ";

const bool kEnvSet = [] {
  setenv("LOOM_NCCL_FALLBACK", "off", 1);
  setenv("LOOM_STAGED_PATH", "1", 1);
  return true;
}();

// Device memory of this process, made on first use: a forked rank makes its own (CUDA
// does not survive a fork), so a test using processes never touches it in the parent.
// Such tests come first: run as one binary (not through CTest), the tests with thread ranks
// load the driver in the parent, and a child forked after that has no working streams.
DeviceMemory& mem() {
  static std::unique_ptr<DeviceMemory> m = makeDeviceMemory();
  return *m;
}

// Skips the test when this process has no device memory; for tests whose ranks are threads.
#define NEED_DEVICE()                                                  \
  do {                                                                 \
    ASSERT_TRUE(kEnvSet);                                              \
    if (std::string why = mem().unavailable(); !why.empty()) {         \
      STAND_IN_MUST_WORK(why);                                         \
      GTEST_SKIP() << why;                                             \
    }                                                                  \
  } while (0)
#ifdef LOOM_STAND_IN_CUDA_PATH
#define STAND_IN_MUST_WORK(why) FAIL() << why  // the stand-in is always there
#else
#define STAND_IN_MUST_WORK(why) (void)0
#endif

// For rank bodies in forked processes: "skip: why" when there is no device memory.
std::string deviceOrSkip() {
  std::string why = mem().unavailable();
  return why.empty() ? "" : kSkip + why;
}

// Fails or skips the test after runRanks.
void verdict(const std::vector<std::string>& failures) {
  bool allSkipped = !failures.empty();
  for (const auto& f : failures) allSkipped &= f.find(kSkip) != std::string::npos;
#ifndef LOOM_STAND_IN_CUDA_PATH
  if (allSkipped) GTEST_SKIP() << failures[0];
#endif
  EXPECT_TRUE(failures.empty()) << joinFailures(failures);
}

// The device of the rank a thread runs (threadsOnOwnDevices); 0 for every other.
thread_local int tRankDevice = 0;
void useRankDevice() {
  if (tRankDevice == 0) mem().makeCurrent(0);
  else mem().makeThreadCurrent(tRankDevice);
}

// `n` ranks as threads of this process: each with device 0 current, or (ownDevices) rank r
// on device r where there are as many (the stand-in has 4), else sharing them
// (threadsShareDevices).
bool threadsShareDevices(int n) { return mem().deviceCount() < n; }
std::vector<std::string> threadsOnDevices(int n, const RankFn& fn, bool ownDevices) {
  RankOptions opt;
  auto use = [ownDevices](int rank) {
    tRankDevice = ownDevices ? rank % std::max(1, mem().deviceCount()) : 0;
    useRankDevice();
  };
  opt.beforeInit = use;
  return runRanks(
      Mode::kThreads, n,
      [&fn, use](int rank, int nranks, ncclComm_t comm) {
        use(rank);
        return fn(rank, nranks, comm);
      },
      opt);
}
std::vector<std::string> threadsOnDevice0(int n, const RankFn& fn) { return threadsOnDevices(n, fn, false); }
std::vector<std::string> threadsOnOwnDevices(int n, const RankFn& fn) { return threadsOnDevices(n, fn, true); }

// `n` ranks as forked processes, each with device 0 current once it has device memory; a
// rank whose process has none reports "skip: why" instead of running `fn`. With `hostOf`,
// rank r poses as host hostOf(r) (LOOM_HOSTID): across hosts (engine/device_net.h), ranks of
// one host reach each other through CUDA IPC, ranks of others through a network backend
// (NCCL_NET's; unset, Loom's TCP backend), pumped by the executor's proxy thread.
std::vector<std::string> processesOnHosts(int n, int (*hostOf)(int), const RankFn& fn, int timeoutSec = 120) {
  RankOptions opt;
  opt.timeoutSec = timeoutSec;
  opt.beforeInit = [hostOf](int rank) {
    if (hostOf) setenv("LOOM_HOSTID", ("devhost" + std::to_string(hostOf(rank))).c_str(), 1);
    if (mem().unavailable().empty()) mem().makeCurrent(0);
  };
  return runRanks(
      Mode::kProcesses, n,
      [&fn](int rank, int nranks, ncclComm_t comm) -> std::string {
        RANK_TRY(deviceOrSkip());
        return fn(rank, nranks, comm);
      },
      opt);
}
std::vector<std::string> processesOnDevice0(int n, const RankFn& fn, int timeoutSec = 120) {
  return processesOnHosts(n, nullptr, fn, timeoutSec);
}

// An int32 device buffer holding `host`, on the rank's device.
int32_t* devInts(const std::vector<int32_t>& host) {
  size_t bytes = std::max<size_t>(host.size(), 1) * sizeof(int32_t);
  auto* p = static_cast<int32_t*>(mem().allocDevice(bytes, tRankDevice, 0xEE));
  if (!host.empty()) mem().toDevice(p, host.data(), host.size() * sizeof(int32_t));
  return p;
}
std::vector<int32_t> hostInts(const int32_t* dev, size_t n) {
  std::vector<int32_t> h(n);
  mem().fromDevice(h.data(), dev, n * sizeof(int32_t));
  return h;
}

// Rank r's input element i of operation `op`.
int32_t in(int op, int r, size_t i) { return op * 100000 + r * 1000 + static_cast<int32_t>(i % 997); }
std::vector<int32_t> inputs(int op, int r, size_t n) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = in(op, r, i);
  return v;
}

// The driver's graph calls, for the capture tests (stand-in or real driver alike).
struct GraphApi {
  int (*begin)(void* stream, int mode);
  int (*end)(void* stream, void** graph);
  int (*instantiate)(void** exec, void* graph, unsigned long long flags);
  int (*launch)(void* exec, void* stream);
  int (*execDestroy)(void* exec);
  int (*destroy)(void* graph);
  void* lib = nullptr;
  bool bind() {
    const char* path = getenv("LOOM_CUDA_DRIVER_LIBRARY");
    void* h = lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return false;
    begin = reinterpret_cast<decltype(begin)>(dlsym(h, "cuStreamBeginCapture_v2"));
    end = reinterpret_cast<decltype(end)>(dlsym(h, "cuStreamEndCapture"));
    instantiate = reinterpret_cast<decltype(instantiate)>(dlsym(h, "cuGraphInstantiateWithFlags"));
    launch = reinterpret_cast<decltype(launch)>(dlsym(h, "cuGraphLaunch"));
    execDestroy = reinterpret_cast<decltype(execDestroy)>(dlsym(h, "cuGraphExecDestroy"));
    destroy = reinterpret_cast<decltype(destroy)>(dlsym(h, "cuGraphDestroy"));
    return begin && end && instantiate && launch && execDestroy && destroy;
  }
};

std::string expectInts(const char* what, const std::vector<int32_t>& got,
                       const std::vector<int32_t>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    RANK_CHECK(got[i] == want[i], "%s: [%zu] = %d, want %d", what, i, got[i], want[i]);
  return "";
}

// NCCL_DEBUG=INFO (COLL) into one file per process under a fresh directory while it lives
// (set before forking ranks: each child logs to its own file); count() adds up the lines
// that hold a text over every file.
class CollLogs {
 public:
  CollLogs() {
    char tmpl[] = "/tmp/loom-staged-logs-XXXXXX";
    dir_ = mkdtemp(tmpl) ? tmpl : "";
    setenv("NCCL_DEBUG", "INFO", 1);
    setenv("NCCL_DEBUG_SUBSYS", "COLL", 1);
    setenv("NCCL_DEBUG_FILE", (dir_ + "/%p.log").c_str(), 1);
    loom::logReset();
  }
  ~CollLogs() {
    unsetenv("NCCL_DEBUG");
    unsetenv("NCCL_DEBUG_SUBSYS");
    unsetenv("NCCL_DEBUG_FILE");
    loom::logReset();
    for (const std::string& f : files()) unlink(f.c_str());
    rmdir(dir_.c_str());
  }
  int count(const std::string& what) const {
    int n = 0;
    for (const std::string& f : files()) {
      std::ifstream in(f);
      for (std::string line; std::getline(in, line);) n += line.find(what) != std::string::npos;
    }
    return n;
  }
  // Every line of every file, for a failure's message.
  std::string all() const {
    std::string out;
    for (const std::string& f : files()) {
      std::ifstream in(f);
      for (std::string line; std::getline(in, line);) out += line + "\n";
    }
    return out;
  }

 private:
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR* d = opendir(dir_.c_str())) {
      while (dirent* e = readdir(d))
        if (e->d_name[0] != '.') out.push_back(dir_ + "/" + e->d_name);
      closedir(d);
    }
    return out;
  }
  std::string dir_;
};

// How many of everyCollective's five collectives go direct on a board of rank processes:
// the copies always, the reductions with a kernels module that works (its stand-in here, as
// CTest's ProcessesWithKernelsModule entry sets), none with LOOM_LOCAL_DIRECT=0.
[[maybe_unused]] int directCollectivesExpected() {  // the stand-in's suites use it
  const char* off = getenv("LOOM_LOCAL_DIRECT");
  if (off && std::string(off) == "0") return 0;
  const char* kern = getenv("LOOM_CUDA_KERNELS_LIBRARY");
  const char* fail = getenv("LOOM_STAND_IN_KERNELS_FAIL");
  return kern && *kern && !(fail && *fail) ? 5 : 2;
}

// Every collective and point-to-point call on device buffers, queued on one stream without
// a sync between them (each reads the previous one's results where that is checkable),
// then one sync and exact checks.
std::string everyCollective(int rank, int n, ncclComm_t comm) {
  useRankDevice();
  void* stream = mem().createStream();
  auto s = static_cast<cudaStream_t>(stream);
  const size_t k = 1003;  // odd, not a multiple of the rank count
  // all-reduce (sum), in place, then an all-gather of its result's first k elements.
  int32_t* ar = devInts(inputs(1, rank, k));
  RANK_NCCL(ncclAllReduce(ar, ar, k, ncclInt32, ncclSum, comm, s));
  int32_t* ag = devInts(std::vector<int32_t>(k * n, -1));
  RANK_NCCL(ncclAllGather(ar, ag, k, ncclInt32, comm, s));
  // broadcast from the last rank; reduce (max) to rank 0; reduce-scatter (sum).
  int root = n - 1;
  int32_t* bc = devInts(rank == root ? inputs(2, rank, k) : std::vector<int32_t>(k, -1));
  RANK_NCCL(ncclBroadcast(bc, bc, k, ncclInt32, root, comm, s));
  int32_t* rdIn = devInts(inputs(3, rank, k));
  int32_t* rdOut = devInts(std::vector<int32_t>(k, -1));
  RANK_NCCL(ncclReduce(rdIn, rdOut, k, ncclInt32, ncclMax, 0, comm, s));
  int32_t* rsIn = devInts(inputs(4, rank, k * n));
  int32_t* rsOut = devInts(std::vector<int32_t>(k, -1));
  RANK_NCCL(ncclReduceScatter(rsIn, rsOut, k, ncclInt32, ncclSum, comm, s));
  // all-to-all, then send/receive around the ring.
  int32_t* a2aIn = devInts(inputs(5, rank, k * n));
  int32_t* a2aOut = devInts(std::vector<int32_t>(k * n, -1));
  RANK_NCCL(ncclAlltoAll(a2aIn, a2aOut, k, ncclInt32, comm, s));
  int32_t* p2pIn = devInts(inputs(6, rank, k));
  int32_t* p2pOut = devInts(std::vector<int32_t>(k, -1));
  RANK_NCCL(ncclGroupStart());
  RANK_NCCL(ncclSend(p2pIn, k, ncclInt32, (rank + 1) % n, comm, s));
  RANK_NCCL(ncclRecv(p2pOut, k, ncclInt32, (rank + n - 1) % n, comm, s));
  RANK_NCCL(ncclGroupEnd());
  mem().syncStream(stream);

  std::vector<int32_t> want(k);
  for (size_t i = 0; i < k; ++i) {
    want[i] = 0;
    for (int r = 0; r < n; ++r) want[i] += in(1, r, i);
  }
  RANK_TRY(expectInts("all-reduce", hostInts(ar, k), want));
  std::vector<int32_t> wantAg;
  for (int r = 0; r < n; ++r) wantAg.insert(wantAg.end(), want.begin(), want.end());
  RANK_TRY(expectInts("all-gather of the all-reduce", hostInts(ag, k * n), wantAg));
  RANK_TRY(expectInts("broadcast", hostInts(bc, k), inputs(2, root, k)));
  if (rank == 0) RANK_TRY(expectInts("reduce (max)", hostInts(rdOut, k), inputs(3, n - 1, k)));
  else RANK_TRY(expectInts("reduce, off the root", hostInts(rdOut, k), std::vector<int32_t>(k, -1)));
  for (size_t i = 0; i < k; ++i) {
    want[i] = 0;
    for (int r = 0; r < n; ++r) want[i] += in(4, r, rank * k + i);
  }
  RANK_TRY(expectInts("reduce-scatter", hostInts(rsOut, k), want));
  std::vector<int32_t> wantA2a(k * n);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < k; ++i) wantA2a[p * k + i] = in(5, p, rank * k + i);
  RANK_TRY(expectInts("all-to-all", hostInts(a2aOut, k * n), wantA2a));
  RANK_TRY(expectInts("receive", hostInts(p2pOut, k), inputs(6, (rank + n - 1) % n, k)));
  RANK_TRY(expectInts("send buffer unchanged", hostInts(p2pIn, k), inputs(6, rank, k)));
  ncclResult_t async = ncclSuccess;
  RANK_NCCL(ncclCommGetAsyncError(comm, &async));
  RANK_CHECK(async == ncclSuccess, "async error %d", async);
  return "";
}

// Collectives that ranks on one device move between their buffers where they can: an
// all-gather or broadcast in place or not, with nothing to move, after an all-reduce on the
// same streams; a group of two collectives per rank goes to the host engine on every rank
// alike.
std::string copyBetweenBuffers(int rank, int n, ncclComm_t comm) {
  auto s = static_cast<cudaStream_t>(mem().createStream());
  const size_t k = 517;
  // In place: this rank's block of the output is its input.
  int32_t* ag = devInts(std::vector<int32_t>(k * n, -1));
  mem().toDevice(ag + rank * k, inputs(1, rank, k).data(), k * sizeof(int32_t));
  RANK_NCCL(ncclAllGather(ag + rank * k, ag, k, ncclInt32, comm, s));
  // Out of place, after an all-reduce that wrote its input.
  int32_t* x = devInts(inputs(2, rank, k));
  RANK_NCCL(ncclAllReduce(x, x, k, ncclInt32, ncclSum, comm, s));
  int32_t* ag2 = devInts(std::vector<int32_t>(k * n, -1));
  RANK_NCCL(ncclAllGather(x, ag2, k, ncclInt32, comm, s));
  // Broadcast from rank 1, in place; then one with nothing to move.
  int32_t* bc = devInts(rank == 1 ? inputs(3, 1, k) : std::vector<int32_t>(k, -1));
  RANK_NCCL(ncclBroadcast(bc, bc, k, ncclInt32, 1, comm, s));
  RANK_NCCL(ncclBroadcast(bc, bc, 0, ncclInt32, 1, comm, s));
  // Two collectives in one group: the host engine, on every rank.
  int32_t* bc2 = devInts(rank == 0 ? inputs(4, 0, k) : std::vector<int32_t>(k, -1));
  int32_t* agIn = devInts(inputs(5, rank, k));
  int32_t* ag3 = devInts(std::vector<int32_t>(k * n, -1));
  RANK_NCCL(ncclGroupStart());
  RANK_NCCL(ncclBroadcast(bc2, bc2, k, ncclInt32, 0, comm, s));
  RANK_NCCL(ncclAllGather(agIn, ag3, k, ncclInt32, comm, s));
  RANK_NCCL(ncclGroupEnd());
  mem().syncStream(s);
  std::vector<int32_t> want, want2, sum(k, 0), want3;
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < k; ++i) sum[i] += in(2, r, i);
  for (int r = 0; r < n; ++r) {
    std::vector<int32_t> b = inputs(1, r, k);
    want.insert(want.end(), b.begin(), b.end());
    want2.insert(want2.end(), sum.begin(), sum.end());
    std::vector<int32_t> c = inputs(5, r, k);
    want3.insert(want3.end(), c.begin(), c.end());
  }
  RANK_TRY(expectInts("in-place all-gather", hostInts(ag, k * n), want));
  RANK_TRY(expectInts("all-gather of the all-reduce", hostInts(ag2, k * n), want2));
  RANK_TRY(expectInts("broadcast", hostInts(bc, k), inputs(3, 1, k)));
  RANK_TRY(expectInts("grouped broadcast", hostInts(bc2, k), inputs(4, 0, k)));
  RANK_TRY(expectInts("grouped all-gather", hostInts(ag3, k * n), want3));
  return "";
}

// Ranks on one device may group their calls differently, as NCCL allows: a rank that groups
// a collective with a send, or two collectives, sends those collectives to the host engine
// on every rank (nobody waits for a meeting it cannot lead), and the ranks' later
// collectives still meet in step.
std::string groupDifferently(int rank, int n, ncclComm_t comm) {
  auto s = static_cast<cudaStream_t>(mem().createStream());
  const size_t k = 301;
  int32_t* a = devInts(inputs(1, rank, k));
  int32_t* b = devInts(inputs(2, rank, k));
  int32_t* c = devInts(inputs(3, rank, k));
  int32_t* p2p = devInts(std::vector<int32_t>(k, -1));
  if (rank == 0) {  // the all-reduce of a grouped with a send here, a receive on rank 1
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclAllReduce(a, a, k, ncclInt32, ncclSum, comm, s));
    RANK_NCCL(ncclSend(c, k, ncclInt32, 1, comm, s));
    RANK_NCCL(ncclGroupEnd());
  } else if (rank == 1) {
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclAllReduce(a, a, k, ncclInt32, ncclSum, comm, s));
    RANK_NCCL(ncclRecv(p2p, k, ncclInt32, 0, comm, s));
    RANK_NCCL(ncclGroupEnd());
  } else {
    RANK_NCCL(ncclAllReduce(a, a, k, ncclInt32, ncclSum, comm, s));
  }
  if (rank == 1) {  // two collectives in one group here, one by one elsewhere
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclAllReduce(b, b, k, ncclInt32, ncclSum, comm, s));
    RANK_NCCL(ncclAllReduce(c, c, k, ncclInt32, ncclMax, comm, s));
    RANK_NCCL(ncclGroupEnd());
  } else {
    RANK_NCCL(ncclAllReduce(b, b, k, ncclInt32, ncclSum, comm, s));
    RANK_NCCL(ncclAllReduce(c, c, k, ncclInt32, ncclMax, comm, s));
  }
  RANK_NCCL(ncclAllReduce(b, b, k, ncclInt32, ncclSum, comm, s));  // in step again
  mem().syncStream(s);
  std::vector<int32_t> wa(k, 0), wb(k, 0), wc(k, 0);
  for (size_t i = 0; i < k; ++i)
    for (int r = 0; r < n; ++r) {
      wa[i] += in(1, r, i);
      wb[i] += in(2, r, i) * n;
      wc[i] = std::max(wc[i], in(3, r, i));
    }
  RANK_TRY(expectInts("all-reduce beside a send", hostInts(a, k), wa));
  RANK_TRY(expectInts("two all-reduces of b", hostInts(b, k), wb));
  RANK_TRY(expectInts("all-reduce (max) of c", hostInts(c, k), wc));
  if (rank == 1) RANK_TRY(expectInts("receive", hostInts(p2p, k), inputs(3, 0, k)));
  return "";
}

TEST(STAGED_SUITE, EveryCollectiveInProcesses) {
  ASSERT_TRUE(kEnvSet);
  for (int n : {1, 2, 3}) {
    SCOPED_TRACE(n);
    verdict(processesOnDevice0(n, everyCollective));
  }
}

// Ranks that are processes on one device meet for each collective on a board in shared
// memory (engine/device_board.h): the last to arrive maps the others' buffers with CUDA IPC
// and moves the data on its stream, every stream ordered by interprocess events. Each
// direct collective is logged once, by its leader: the count shows which went direct.
TEST(STAGED_SUITE, ProcessesOnOneDeviceMeetOnABoard) {
  ASSERT_TRUE(kEnvSet);
  for (int n : {2, 3}) {
    SCOPED_TRACE(n);
    CollLogs logs;
    verdict(processesOnDevice0(n, everyCollective));
    if (::testing::Test::IsSkipped()) return;  // no device here
    const int direct = logs.count("through CUDA IPC");
    std::cout << n << " rank processes: " << direct << " of 5 collectives went direct\n";
#ifdef LOOM_STAND_IN_CUDA_PATH
    EXPECT_EQ(direct, directCollectivesExpected()) << logs.all();
#else  // a real GPU: the reductions too where the kernels module was built
    EXPECT_TRUE(direct == 2 || direct == 5) << direct;
#endif
  }
}

// The copies between buffers (in place, after an all-reduce, a broadcast with nothing to
// move) and a group of two collectives, which every rank sends to the host engine.
TEST(STAGED_SUITE, ProcessesOnOneDeviceCopyBetweenTheirBuffers) {
  ASSERT_TRUE(kEnvSet);
  CollLogs logs;
  verdict(processesOnDevice0(3, copyBetweenBuffers));
  if (::testing::Test::IsSkipped()) return;  // no device here
  const char* off = getenv("LOOM_LOCAL_DIRECT");
  const bool direct = !(off && std::string(off) == "0");
  // Two all-gathers and a broadcast with data to move (the empty one never reaches the
  // engine), and the all-reduce with a kernels module.
  const int copies = direct ? 3 : 0;
  const int got = logs.count("through CUDA IPC");
#ifdef LOOM_STAND_IN_CUDA_PATH
  EXPECT_EQ(got, copies + (directCollectivesExpected() == 5 ? 1 : 0)) << logs.all();
#else
  EXPECT_TRUE(got == copies || got == copies + (direct ? 1 : 0)) << got << "\n" << logs.all();
#endif
}

// Rank processes that group the same collectives differently stay in step: a meeting that
// one rank cannot attend goes to the host engine on every rank, and nobody waits for it.
TEST(STAGED_SUITE, ProcessesOnOneDeviceMayGroupDifferently) {
  ASSERT_TRUE(kEnvSet);
  verdict(processesOnDevice0(3, groupDifferently));
}

// A peer process that exits while a rank waits for it on the board breaks the board: the
// call fails (or, where the rank did not wait, its staged work reports it), and every later
// direct call on the communicator fails alike; nothing hangs.
TEST(STAGED_SUITE, DeadPeerBreaksTheBoard) {
  ASSERT_TRUE(kEnvSet);
  verdict(processesOnDevice0(
      2,
      [](int rank, int, ncclComm_t comm) -> std::string {
        if (rank == 1) _exit(0);  // dies without a word
        mem().makeCurrent(0);
        void* stream = mem().createStream();
        auto s = static_cast<cudaStream_t>(stream);
        int32_t* a = devInts(inputs(1, 0, 1000));
        int32_t* g = devInts(std::vector<int32_t>(2000, -1));
        auto t0 = std::chrono::steady_clock::now();
        ncclResult_t rc = ncclAllGather(a, g, 1000, ncclInt32, comm, s);
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        RANK_CHECK(secs < 30, "the call took %.1f s to fail", secs);
        if (rc == ncclSuccess) {  // went to the staged path: the async error says it
          mem().syncStream(stream);
          ncclResult_t async = ncclSuccess;
          RANK_NCCL(ncclCommGetAsyncError(comm, &async));
          RANK_CHECK(async == ncclRemoteError || async == ncclSystemError, "async error %d: %s",
                     async, ncclGetLastError(comm));
        } else {
          RANK_CHECK(rc == ncclRemoteError, "all-gather: %d (%s)", rc, ncclGetLastError(comm));
          std::string why = ncclGetLastError(comm);
          RANK_CHECK(why.find("exited") != std::string::npos, "the error does not say the "
                     "peer exited: %s", why.c_str());
          rc = ncclBroadcast(a, a, 1000, ncclInt32, 0, comm, s);
          RANK_CHECK(rc == ncclRemoteError, "a later broadcast: %d (%s)", rc,
                     ncclGetLastError(comm));
        }
        ncclCommAbort(comm);
        _exit(0);  // the harness would destroy the aborted communicator again
      },
      60));
}

// ncclCommAbort from another thread ends a rank's wait on the board for a silent peer: the
// call fails at once, saying so, instead of waiting for LOOM_TIMEOUT.
TEST(STAGED_SUITE, AbortEndsAWaitOnTheBoard) {
  ASSERT_TRUE(kEnvSet);
  verdict(processesOnDevice0(
      2,
      [](int rank, int, ncclComm_t comm) -> std::string {
        if (rank == 1) {  // silent: never calls, stays until rank 0 is done
          std::this_thread::sleep_for(std::chrono::seconds(4));
          _exit(0);
        }
        mem().makeCurrent(0);
        void* stream = mem().createStream();
        int32_t* a = devInts(inputs(1, 0, 1000));
        int32_t* g = devInts(std::vector<int32_t>(2000, -1));
        std::thread aborter([comm] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          ncclCommAbort(comm);
        });
        auto t0 = std::chrono::steady_clock::now();
        ncclResult_t rc = ncclAllGather(a, g, 1000, ncclInt32, comm, static_cast<cudaStream_t>(stream));
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        aborter.join();
#ifdef LOOM_STAND_IN_CUDA_PATH  // the stand-in has CUDA IPC: the call waited on the board
        RANK_CHECK(rc != ncclSuccess, "the all-gather did not wait on the board");
#endif
        if (rc == ncclSuccess) _exit(0);  // not on the board (no CUDA IPC): nothing to check
        RANK_CHECK(secs < 3, "the call took %.1f s to end after the abort", secs);
        std::string why = ncclGetLastError(nullptr);
        RANK_CHECK(why.find("aborted") != std::string::npos, "the error does not say why: %s",
                   why.c_str());
        _exit(0);
      },
      60));
}

// Processes sharing a device without NVIDIA's MPS take turns on the GPU: the lowest of
// them warns once, naming the others; with an MPS control socket in
// CUDA_MPS_PIPE_DIRECTORY nobody does.
TEST(STAGED_SUITE, ProcessesSharingADeviceWithoutMpsAreWarned) {
  ASSERT_TRUE(kEnvSet);
  for (bool mps : {false, true}) {
    SCOPED_TRACE(mps ? "MPS control socket present" : "no MPS");
    char tmpl[] = "/tmp/loom-mps-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    int sock = -1;
    if (mps) {
      sock = socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/control", dir.c_str());
      ASSERT_EQ(bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    }
    EnvGuard pipe("CUDA_MPS_PIPE_DIRECTORY", dir.c_str());
    RankOptions opt;
    opt.beforeInit = [&](int rank) {
      if (mem().unavailable().empty()) mem().makeCurrent(0);
      setenv("NCCL_DEBUG", "WARN", 1);
      freopen((dir + "/rank" + std::to_string(rank) + ".log").c_str(), "w", stdout);  // the log
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // NCCL deprecates it; ranks re-read NCCL_DEBUG
      ncclResetDebugInit();
#pragma GCC diagnostic pop
    };
    auto failures = runRanks(
        Mode::kProcesses, 3,
        [](int, int, ncclComm_t) -> std::string {
          RANK_TRY(deviceOrSkip());
          fflush(stdout);
          return "";
        },
        opt);
    verdict(failures);
    auto slurp = [&](int r) {
      std::string text;
      if (FILE* f = fopen((dir + "/rank" + std::to_string(r) + ".log").c_str(), "r")) {
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
        fclose(f);
        unlink((dir + "/rank" + std::to_string(r) + ".log").c_str());
      }
      return text;
    };
    const std::string r0 = slurp(0), r1 = slurp(1), r2 = slurp(2);
    if (sock >= 0) {
      close(sock);
      unlink((dir + "/control").c_str());
    }
    rmdir(dir.c_str());
    if (HasFailure() || IsSkipped()) return;
    const bool warned = r0.find("shares CUDA device 0 with rank(s) 1 (pid") != std::string::npos &&
                        r0.find("no MPS control daemon") != std::string::npos;
    EXPECT_EQ(warned, !mps) << r0;
    EXPECT_EQ(r1.find("shares CUDA device"), std::string::npos) << r1;
    EXPECT_EQ(r2.find("shares CUDA device"), std::string::npos) << r2;
  }
}

// A peer that dies leaves the survivor's stream going (its results undefined) and the
// error in ncclCommGetAsyncError; nothing hangs. The staged path's stream hold: where the
// kernels module loads, processes on one GPU would go direct, whose calls wait on the host
// (DeadPeerBreaksTheBoard and AbortEndsAWaitOnTheBoard test that path).
TEST(STAGED_SUITE, DeadPeerReleasesTheStream) {
  ASSERT_TRUE(kEnvSet);
  EnvGuard staged("LOOM_LOCAL_DIRECT", "0");
  auto failures = processesOnDevice0(
      2,
      [](int rank, int, ncclComm_t comm) -> std::string {
        if (rank == 1) _exit(0);  // dies without a word
        mem().makeCurrent(0);
        void* stream = mem().createStream();
        int32_t* a = devInts(inputs(1, 0, 1 << 16));
        auto t0 = std::chrono::steady_clock::now();
        RANK_NCCL(ncclAllReduce(a, a, 1 << 16, ncclInt32, ncclSum, comm,
                                static_cast<cudaStream_t>(stream)));
        mem().syncStream(stream);  // returns: the failure lets the stream go on
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ncclResult_t async = ncclSuccess;
        RANK_NCCL(ncclCommGetAsyncError(comm, &async));
        RANK_CHECK(async == ncclRemoteError || async == ncclSystemError,
                   "async error %d after %.1f s: %s", async, s, ncclGetLastError(comm));
        RANK_CHECK(s < 30, "the stream took %.1f s to go on", s);
        ncclCommAbort(comm);
        _exit(0);  // the harness would destroy the aborted communicator again
      },
      60);
  // Rank 1's exit is its success; rank 0 reports.
  verdict(failures);
}

// Aborting a communicator whose staged work waits on a silent peer lets the stream go.
TEST(STAGED_SUITE, AbortReleasesAWaitingStream) {
  ASSERT_TRUE(kEnvSet);
  EnvGuard staged("LOOM_LOCAL_DIRECT", "0");  // as above
  verdict(processesOnDevice0(
      2,
      [](int rank, int, ncclComm_t comm) -> std::string {
        if (rank == 1) {  // silent: never calls, stays until rank 0 is done
          std::this_thread::sleep_for(std::chrono::seconds(3));
          ncclCommAbort(comm);
          _exit(0);
        }
        mem().makeCurrent(0);
        void* stream = mem().createStream();
        int32_t* a = devInts(inputs(1, 0, 1000));
        RANK_NCCL(ncclAllReduce(a, a, 1000, ncclInt32, ncclSum, comm,
                                static_cast<cudaStream_t>(stream)));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        auto t0 = std::chrono::steady_clock::now();
        RANK_NCCL(ncclCommAbort(comm));
        mem().syncStream(stream);  // would hang if the abort left the stream waiting
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        RANK_CHECK(s < 2, "the stream took %.1f s to go on after the abort", s);
        _exit(0);
      },
      60));
}

// Captured into a CUDA graph (each rank a process capturing its own stream), the staged
// collectives run at every replay on what the buffers hold then; the graph holds the
// staging until it is destroyed.
TEST(STAGED_SUITE, CapturedCollectivesRunAtEveryReplay) {
  ASSERT_TRUE(kEnvSet);
  verdict(processesOnDevice0(
      2,
      [&](int rank, int n, ncclComm_t comm) -> std::string {
        mem().makeCurrent(0);
        GraphApi g;
        RANK_CHECK(g.bind(), "the driver has no graph calls");
        void* stream = mem().createStream();
        auto s = static_cast<cudaStream_t>(stream);
        const size_t k = 777;
        int32_t* a = devInts(std::vector<int32_t>(k, 0));
        int32_t* gathered = devInts(std::vector<int32_t>(k * n, -1));
        RANK_CHECK(g.begin(stream, 1 /* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL */) == 0, "begin");
        RANK_NCCL(ncclAllReduce(a, a, k, ncclInt32, ncclSum, comm, s));
        RANK_NCCL(ncclAllGather(a, gathered, k, ncclInt32, comm, s));
        void* graph = nullptr;
        RANK_CHECK(g.end(stream, &graph) == 0 && graph, "end capture");
        void* exec = nullptr;
        RANK_CHECK(g.instantiate(&exec, graph, 0) == 0, "instantiate");
        RANK_CHECK(hostInts(a, k) == std::vector<int32_t>(k, 0), "the capture ran something");
        auto live = reinterpret_cast<long (*)()>(dlsym(g.lib, "loomStandInLiveUserObjects"));
        if (live) RANK_CHECK(live() >= 1, "the graph holds no user object: its staging could be reused");
        for (int replay = 0; replay < 3; ++replay) {
          mem().toDevice(a, inputs(replay, rank, k).data(), k * sizeof(int32_t));
          RANK_CHECK(g.launch(exec, stream) == 0, "launch %d", replay);
          mem().syncStream(stream);
          std::vector<int32_t> want(k);
          for (size_t i = 0; i < k; ++i) want[i] = in(replay, 0, i) + in(replay, 1, i);
          RANK_TRY(expectInts("all-reduce", hostInts(a, k), want));
          std::vector<int32_t> wantAg = want;
          wantAg.insert(wantAg.end(), want.begin(), want.end());
          RANK_TRY(expectInts("all-gather", hostInts(gathered, k * n), wantAg));
        }
        RANK_CHECK(g.execDestroy(exec) == 0 && g.destroy(graph) == 0, "graph destroy");
        // The stand-in counts user objects: the graph's destruction released Loom's staging.
        if (live) {
          auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
          while (live() != 0 && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          RANK_CHECK(live() == 0, "a destroyed graph still holds Loom's staging");
        }
        return "";
      }));
}

// The device executor (engine/device_exec.h, LOOM_DEVICE_EXECUTOR=kernel): each rank's
// collectives, and each group's sends and receives (all-to-all is one such group), run as
// the plan-interpreter kernel on its stream, over FIFOs in device memory (mapped by CUDA
// IPC between processes). Each launch is logged once by its rank. Where no kernels module
// loads, every rank keeps the staged path (0 launches) and the results are the same.
constexpr const char* kKernelLaunch = "by the device executor's kernel";
int kernelLaunchesExpected(int perRank, int n) {
#ifdef LOOM_STAND_IN_CUDA_PATH
  const char* kern = getenv("LOOM_CUDA_KERNELS_LIBRARY");
  return kern && *kern ? perRank * n : 0;
#else  // a GPU: the module named (as scripts/gpu_check.sh does) must serve; else either
  const char* kern = getenv("LOOM_CUDA_KERNELS_LIBRARY");
  return kern && *kern ? perRank * n : -1;
#endif
}
void expectKernelLaunches(const CollLogs& logs, int perRank, int n) {
  const int got = logs.count(kKernelLaunch), want = kernelLaunchesExpected(perRank, n);
  std::cout << n << " ranks: " << got << " kernel launches\n";
  if (want >= 0) EXPECT_EQ(got, want) << logs.all();
  else EXPECT_TRUE(got == 0 || got == perRank * n) << got << "\n" << logs.all();
}

TEST(STAGED_SUITE, DeviceExecutorRunsEveryCollectiveInProcesses) {
  ASSERT_TRUE(kEnvSet);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  for (int n : {2, 3}) {
    SCOPED_TRACE(n);
    CollLogs logs;
    verdict(processesOnDevice0(n, everyCollective));
    if (::testing::Test::IsSkipped()) return;  // no device here
    expectKernelLaunches(logs, 7, n);  // five collectives, the all-to-all, the send/receive group
  }
}

// A group's sends and receives on the device executor: to and from every rank (itself
// included), a size of each pair's own, sends on one stream and receives on another (the
// group joins them), one pair of nothing; four such groups, so that the plans' device
// memory is reused once their kernels have ended; then a message larger than a
// connection holds in flight, to the next rank, twice; then a group of both kinds. One kernel per
// group and collective.
std::string sendsAndReceives(int rank, int n, ncclComm_t comm) {
  useRankDevice();
  auto s1 = static_cast<cudaStream_t>(mem().createStream());
  auto s2 = static_cast<cudaStream_t>(mem().createStream());
  auto size = [](int round, int from, int to) -> size_t {
    return round == 2 && from == to ? 0 : 301 + 37 * from + 11 * to + 5 * round;
  };
  for (int round = 0; round < 4; ++round) {
    std::vector<int32_t*> out(n), ins(n);
    RANK_NCCL(ncclGroupStart());
    for (int p = 0; p < n; ++p) {
      const size_t ks = size(round, rank, p), kr = size(round, p, rank);
      ins[p] = devInts(inputs(10 + round, rank * 16 + p, ks + 1));
      out[p] = devInts(std::vector<int32_t>(kr + 1, -7));  // one more: nothing past the end
      RANK_NCCL(ncclSend(ins[p], ks, ncclInt32, p, comm, s1));
      RANK_NCCL(ncclRecv(out[p], kr, ncclInt32, p, comm, s2));
    }
    RANK_NCCL(ncclGroupEnd());
    mem().syncStream(s2);  // the receives' stream waits for the group's kernel
    for (int p = 0; p < n; ++p) {
      const size_t kr = size(round, p, rank);
      std::vector<int32_t> want = inputs(10 + round, p * 16 + rank, kr);
      want.push_back(-7);
      RANK_TRY(expectInts("received", hostInts(out[p], kr + 1), want));
    }
    mem().syncStream(s1);
  }
  // Twice between the same buffers (the second time the plan in device memory is reused
  // as it is), new data each time.
  const size_t big = (3 << 20) / sizeof(int32_t) + 5;
  int32_t* bigIn = devInts(std::vector<int32_t>(big));
  int32_t* bigOut = devInts(std::vector<int32_t>(big, -1));
  for (int rep = 0; rep < 2; ++rep) {
    mem().toDevice(bigIn, inputs(20 + rep, rank, big).data(), big * sizeof(int32_t));
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclSend(bigIn, big, ncclInt32, (rank + 1) % n, comm, s1));
    RANK_NCCL(ncclRecv(bigOut, big, ncclInt32, (rank + n - 1) % n, comm, s1));
    RANK_NCCL(ncclGroupEnd());
    mem().syncStream(s1);
    RANK_TRY(expectInts("a large message", hostInts(bigOut, big), inputs(20 + rep, (rank + n - 1) % n, big)));
  }
  // A group of an all-reduce and a ring of sends and receives, issued in another order on
  // rank 0 than on the others: every rank runs the collective first (they share connections).
  const size_t kx = 999, kr = 777;
  int32_t* x = devInts(inputs(30, rank, kx));
  int32_t* ringIn = devInts(inputs(31, rank, kr));
  int32_t* ringOut = devInts(std::vector<int32_t>(kr, -1));
  RANK_NCCL(ncclGroupStart());
  if (rank == 0) {
    RANK_NCCL(ncclSend(ringIn, kr, ncclInt32, (rank + 1) % n, comm, s1));
    RANK_NCCL(ncclRecv(ringOut, kr, ncclInt32, (rank + n - 1) % n, comm, s1));
  }
  RANK_NCCL(ncclAllReduce(x, x, kx, ncclInt32, ncclSum, comm, s1));
  if (rank != 0) {
    RANK_NCCL(ncclRecv(ringOut, kr, ncclInt32, (rank + n - 1) % n, comm, s1));
    RANK_NCCL(ncclSend(ringIn, kr, ncclInt32, (rank + 1) % n, comm, s1));
  }
  RANK_NCCL(ncclGroupEnd());
  mem().syncStream(s1);
  std::vector<int32_t> sum(kx, 0);
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < kx; ++i) sum[i] += in(30, r, i);
  RANK_TRY(expectInts("the all-reduce grouped with sends", hostInts(x, kx), sum));
  RANK_TRY(expectInts("the ring grouped with an all-reduce", hostInts(ringOut, kr), inputs(31, (rank + n - 1) % n, kr)));
  ncclResult_t async = ncclSuccess;
  RANK_NCCL(ncclCommGetAsyncError(comm, &async));
  RANK_CHECK(async == ncclSuccess, "async error %d", async);
  return "";
}

TEST(STAGED_SUITE, DeviceExecutorSendsAndReceivesInProcesses) {
  ASSERT_TRUE(kEnvSet);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  for (int n : {2, 3}) {
    SCOPED_TRACE(n);
    CollLogs logs;
    verdict(processesOnDevice0(n, sendsAndReceives));
    if (::testing::Test::IsSkipped()) return;  // no device here
    expectKernelLaunches(logs, 8, n);
  }
}

// A group's streams are joined (as NCCL joins them): an all-reduce on one stream and an
// all-gather on another, grouped; waiting for the all-reduce's stream alone must also have
// waited for the all-gather, and the other way round.
std::string joinedStreams(int rank, int n, ncclComm_t comm) {
  mem().makeCurrent(0);
  auto s1 = static_cast<cudaStream_t>(mem().createStream());
  auto s2 = static_cast<cudaStream_t>(mem().createStream());
  const size_t k = 5000;
  std::vector<int32_t> sum(k, 0);
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < k; ++i) sum[i] += in(50, r, i);
  std::vector<int32_t> gathered;
  for (int r = 0; r < n; ++r) {
    std::vector<int32_t> b = inputs(51, r, k);
    gathered.insert(gathered.end(), b.begin(), b.end());
  }
  for (int round = 0; round < 2; ++round) {
    int32_t* x = devInts(inputs(50, rank, k));
    int32_t* y = devInts(inputs(51, rank, k));
    int32_t* g = devInts(std::vector<int32_t>(k * n, -1));
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclAllReduce(x, x, k, ncclInt32, ncclSum, comm, s1));
    RANK_NCCL(ncclAllGather(y, g, k, ncclInt32, comm, s2));
    RANK_NCCL(ncclGroupEnd());
    mem().syncStream(round == 0 ? s1 : s2);  // the first-queued kernel's, then the last's
    RANK_TRY(expectInts("the all-gather", hostInts(g, k * n), gathered));
    RANK_TRY(expectInts("the all-reduce", hostInts(x, k), sum));
    mem().syncStream(round == 0 ? s2 : s1);
  }
  return "";
}

TEST(STAGED_SUITE, DeviceExecutorJoinsAGroupsStreams) {
  ASSERT_TRUE(kEnvSet);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  CollLogs logs;
  verdict(processesOnDevice0(3, joinedStreams));
  if (::testing::Test::IsSkipped()) return;  // no device here
  expectKernelLaunches(logs, 4, 3);
}

// A group's sends and receives run as one kernel that joins their streams: a group whose
// streams are partly being captured into a CUDA graph is refused on every rank alike
// (ncclInvalidUsage, saying why; the staged path refuses it too), before anything runs, and
// the capture is left intact.
std::string partlyCaptured(int rank, int n, ncclComm_t comm) {
  mem().makeCurrent(0);
  GraphApi g;
  RANK_CHECK(g.bind(), "the driver has no graph calls");
  void* s1 = mem().createStream();
  void* s2 = mem().createStream();
  const size_t k = 64;
  int32_t* in = devInts(inputs(40, rank, k));
  int32_t* out = devInts(std::vector<int32_t>(k, -1));
  RANK_CHECK(g.begin(s1, 1 /* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL */) == 0, "begin");
  RANK_NCCL(ncclGroupStart());
  RANK_NCCL(ncclSend(in, k, ncclInt32, (rank + 1) % n, comm, static_cast<cudaStream_t>(s1)));
  RANK_NCCL(ncclRecv(out, k, ncclInt32, (rank + n - 1) % n, comm, static_cast<cudaStream_t>(s2)));
  const ncclResult_t rc = ncclGroupEnd();
  std::string why = ncclGetLastError(comm);
  if (why.empty()) why = ncclGetLastError(nullptr);  // the group's, not the communicator's
  void* graph = nullptr;
  RANK_CHECK(g.end(s1, &graph) == 0 && graph, "the capture was broken");
  g.destroy(graph);
  RANK_CHECK(rc == ncclInvalidUsage, "ncclGroupEnd: %d, want ncclInvalidUsage (%s)", rc, why.c_str());
  RANK_CHECK(why.find("captur") != std::string::npos, "the error does not say why: %s", why.c_str());
  RANK_TRY(expectInts("nothing received", hostInts(out, k), std::vector<int32_t>(k, -1)));
  return "";
}

TEST(STAGED_SUITE, DeviceExecutorRefusesAGroupPartlyCaptured) {
  ASSERT_TRUE(kEnvSet);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  verdict(processesOnDevice0(2, partlyCaptured));
}

// Rank 1 exits without a word after an all-reduce; rank 0's next all-reduce must let its
// stream go on within 30 s with ncclRemoteError or ncclSystemError, saying (`executorMessage`,
// where the executor serves) that its watchdog stopped the kernels.
std::string peerDiesMidAllReduce(int rank, ncclComm_t comm, bool executorMessage) {
  mem().makeCurrent(0);
  void* stream = mem().createStream();
  auto s = static_cast<cudaStream_t>(stream);
  int32_t* a = devInts(inputs(1, rank, 1 << 14));
  RANK_NCCL(ncclAllReduce(a, a, 1 << 14, ncclInt32, ncclSum, comm, s));  // connected
  mem().syncStream(stream);
  if (rank == 1) _exit(0);  // dies without a word
  auto t0 = std::chrono::steady_clock::now();
  RANK_NCCL(ncclAllReduce(a, a, 1 << 14, ncclInt32, ncclSum, comm, s));
  mem().syncStream(stream);  // returns: the kernel was stopped (or the staged path failed)
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ncclResult_t async = ncclSuccess;
  RANK_NCCL(ncclCommGetAsyncError(comm, &async));
  RANK_CHECK(async == ncclRemoteError || async == ncclSystemError, "async error %d after %.1f s: %s", async, secs,
             ncclGetLastError(comm));
  RANK_CHECK(secs < 30, "the stream took %.1f s to go on", secs);
  if (executorMessage && kernelLaunchesExpected(1, 1) > 0)  // the executor's watchdog stopped it
    RANK_CHECK(strstr(ncclGetLastError(comm), "kernels of this communicator are stopped"), "%s",
               ncclGetLastError(comm));
  ncclCommAbort(comm);
  _exit(0);  // the harness would destroy the aborted communicator again
}

// A peer process that exits while a rank's kernel waits for it: the executor's watchdog
// stops the kernel, the stream goes on, and ncclCommGetAsyncError says the peer exited.
TEST(STAGED_SUITE, DeviceExecutorStopsWhenAPeerDies) {
  ASSERT_TRUE(kEnvSet);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  verdict(processesOnDevice0(
      2, [](int rank, int, ncclComm_t comm) { return peerDiesMidAllReduce(rank, comm, false); }, 60));
}

// LOOM_DEVICE_LL_BYTES picks each launch's protocol, so the executor's ranks must agree on
// it: one that differs fails every rank's init saying so (before, its launches picked LL
// where the others picked Simple and the kernels waited on each other). Without the kernels
// module no rank runs the executor, and the knob does not matter: the init succeeds.
TEST(STAGED_SUITE, DeviceExecutorRanksMustAgreeOnLlBytes) {
  ASSERT_TRUE(kEnvSet);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  RankOptions opt;
  opt.timeoutSec = 60;
  opt.beforeInit = [](int rank) {
    if (rank == 1) setenv("LOOM_DEVICE_LL_BYTES", "0", 1);
    if (mem().unavailable().empty()) mem().makeCurrent(0);
  };
  auto f = runRanks(Mode::kProcesses, 2, [](int, int, ncclComm_t) { return std::string(); }, opt);
  if (kernelLaunchesExpected(1, 1) == 0) {
    EXPECT_TRUE(f.empty()) << joinFailures(f);
    return;
  }
  // The real driver: no GPU here, or a GPU without the module named (the executor unused).
  if (kernelLaunchesExpected(1, 1) < 0 && f.empty()) return;
  ASSERT_EQ(f.size(), 2u) << joinFailures(f);
  for (const std::string& e : f)
    EXPECT_NE(e.find("LOOM_DEVICE_LL_BYTES differs between ranks: rank 0 has 65536, rank 1 has 0"),
              std::string::npos) << e;
}

// ncclCommAbort lets a stream go whose kernel waits for a silent peer.
TEST(STAGED_SUITE, DeviceExecutorAbortReleasesAWaitingStream) {
  ASSERT_TRUE(kEnvSet);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  verdict(processesOnDevice0(
      2,
      [](int rank, int, ncclComm_t comm) -> std::string {
        mem().makeCurrent(0);
        void* stream = mem().createStream();
        auto s = static_cast<cudaStream_t>(stream);
        int32_t* a = devInts(inputs(1, rank, 1000));
        RANK_NCCL(ncclAllReduce(a, a, 1000, ncclInt32, ncclSum, comm, s));
        mem().syncStream(stream);
        if (rank == 1) {  // silent from now on, until rank 0 is done
          std::this_thread::sleep_for(std::chrono::seconds(3));
          ncclCommAbort(comm);
          _exit(0);
        }
        RANK_NCCL(ncclAllReduce(a, a, 1000, ncclInt32, ncclSum, comm, s));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        auto t0 = std::chrono::steady_clock::now();
        RANK_NCCL(ncclCommAbort(comm));
        mem().syncStream(stream);  // would hang if the abort left the kernel waiting
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        RANK_CHECK(secs < 2, "the stream took %.1f s to go on after the abort", secs);
        _exit(0);
      },
      60));
}

// Sixteen ranks, the most the executor serves: two hosts of eight (a pair of 8-GPU servers;
// here every rank a process on device 0), then one host of sixteen (direct plans of 30 FIFO
// ends a channel, of the 32 a block keeps): every collective.
TEST(STAGED_SUITE, DeviceExecutorAcrossHostsOfEightRanks) {
  ASSERT_TRUE(kEnvSet);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  for (int perHost : {8, 16}) {
    SCOPED_TRACE(perHost);
    CollLogs logs;
    static int hostSize;
    hostSize = perHost;
    verdict(processesOnHosts(16, [](int r) { return r / hostSize; }, everyCollective, 180));
    if (::testing::Test::IsSkipped()) return;  // no device here
    expectKernelLaunches(logs, 7, 16);
  }
}

// Three ranks, two on one host and one on another: every collective, then every pattern of
// sends and receives, each one kernel; the network ends say what carries them.
TEST(STAGED_SUITE, DeviceExecutorAcrossHosts) {
  ASSERT_TRUE(kEnvSet);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  CollLogs logs;
  EnvGuard subsys("NCCL_DEBUG_SUBSYS", "COLL,INIT");
  verdict(processesOnHosts(3, [](int r) { return r / 2; }, [](int rank, int n, ncclComm_t comm) -> std::string {
    RANK_TRY(everyCollective(rank, n, comm));
    return sendsAndReceives(rank, n, comm);
  }));
  if (::testing::Test::IsSkipped()) return;  // no device here
  expectKernelLaunches(logs, 15, 3);
  if (kernelLaunchesExpected(15, 3) > 0) {
    // Rank 2 (the other host) sends to and receives from ranks 0 and 1 over the network.
    EXPECT_GT(logs.count("through net/Socket"), 0) << logs.all();
    EXPECT_GT(logs.count("other hosts through net/Socket"), 0) << logs.all();
    EXPECT_EQ(logs.count("GPUDirect RDMA"), 0) << logs.all();  // the TCP backend takes host memory only
    // Every step the kernels took from the network was counted at launch (DeviceNet::expect).
    EXPECT_EQ(logs.count("the device executor counted"), 0) << logs.all();
  }
}

// Across hosts through an NCCL net plugin whose devices take GPU memory by DMA-BUF (Loom's
// test plugin in its dmabuf mode, v8 ABI): with NCCL_NET_GDR_LEVEL's default (PXB) the
// plugin's NIC, which the topology does not place (SYS), gets host memory; at SYS the
// receiving ends' slots are in GPU memory, registered through DMA-BUF and flushed, and
// with NCCL_NET_GDR_READ=1 the sending ends' too. The results are the same each time.
TEST(STAGED_SUITE, DeviceExecutorAcrossHostsWithGpuDirectRdma) {
#ifndef LOOM_TEST_NET_PLUGIN
  GTEST_SKIP() << "built without Loom's test net plugin";
#else
  ASSERT_TRUE(kEnvSet);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  EnvGuard plugin("NCCL_NET_PLUGIN", LOOM_TEST_NET_PLUGIN);
  EnvGuard net("NCCL_NET", "LoomTest");
  EnvGuard mode("LOOM_TEST_NET_MODE", "dmabuf");
  char tmpl[] = "/tmp/loom-gdr-counts-XXXXXX";
  const int cfd = mkstemp(tmpl);
  ASSERT_GE(cfd, 0);
  close(cfd);
  EnvGuard counts("LOOM_TEST_NET_COUNTS", tmpl);
  auto countsOf = [&](const std::string& what) {
    std::ifstream in(tmpl);
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line.rfind(what + " ", 0) == 0;
    return n;
  };
  auto body = [](int rank, int n, ncclComm_t comm) -> std::string {
    RANK_TRY(everyCollective(rank, n, comm));
    return sendsAndReceives(rank, n, comm);
  };
  auto lines = [](const std::string& all, const char* a, const char* b) {
    int n = 0;
    std::istringstream in(all);
    for (std::string line; std::getline(in, line);)
      n += line.find(a) != std::string::npos && line.find(b) != std::string::npos;
    return n;
  };
  struct Case {
    const char* level;
    const char* read;
    int gpuRecv, gpuSend;  // whether receiving / sending ends get GPU slots
  };
  for (const Case& c : {Case{"", "0", 0, 0}, Case{"SYS", "0", 1, 0}, Case{"SYS", "1", 1, 1}}) {
    SCOPED_TRACE(std::string("NCCL_NET_GDR_LEVEL=") + c.level + " NCCL_NET_GDR_READ=" + c.read);
    EnvGuard level("NCCL_NET_GDR_LEVEL", c.level);
    EnvGuard read("NCCL_NET_GDR_READ", c.read);
    if (!*c.level) unsetenv("NCCL_NET_GDR_LEVEL");
    truncate(tmpl, 0);
    CollLogs logs;
    EnvGuard subsys("NCCL_DEBUG_SUBSYS", "COLL,INIT");
    verdict(processesOnHosts(2, [](int r) { return r; }, body));
    if (::testing::Test::IsSkipped()) break;  // no device here
    expectKernelLaunches(logs, 15, 2);
    if (kernelLaunchesExpected(15, 2) <= 0) continue;
    const std::string all = logs.all();
    const int recvEnds = lines(all, "FIFO from", "through net/LoomTest");
    const int sendEnds = lines(all, "FIFO to", "through net/LoomTest");
    EXPECT_GT(recvEnds, 0) << all;
    EXPECT_EQ(sendEnds, recvEnds) << all;  // two ranks: each end's peer holds the other
    const int gpuEnds = c.gpuRecv * recvEnds + c.gpuSend * sendEnds;
    EXPECT_EQ(lines(all, "through net/LoomTest", "GPUDirect RDMA, DMA-BUF"), gpuEnds) << all;
    EXPECT_EQ(countsOf("regMrDmaBuf"), gpuEnds);
    if (gpuEnds) EXPECT_GT(countsOf("iflush"), 0);  // every received batch is flushed
    else EXPECT_EQ(countsOf("iflush"), 0);
    EXPECT_EQ(logs.count("the device executor counted"), 0) << all;
  }
  unlink(tmpl);
#endif
}

// Rails by GPU affinity: on a host whose topology (NCCL_TOPO_FILE) puts GPU 0 and the
// plugin's second NIC (loomtest-lo1) under one PCIe switch, and the first NIC under another,
// rank processes on GPU 0 receive their first connection on loomtest-lo1 (the GPU's rail;
// the local rank alone would pick loomtest-lo) and a second on the other NIC; and since
// that NIC is PIX from the GPU, within NCCL_NET_GDR_LEVEL's default (PXB), the receiving
// ends' slots are in GPU memory without any knob.
TEST(STAGED_SUITE, DeviceExecutorAcrossHostsTakesItsGpusRail) {
#if !defined(LOOM_TEST_NET_PLUGIN) || !defined(LOOM_TOPO_FIXTURES)
  GTEST_SKIP() << "built without Loom's test net plugin";
#else
  ASSERT_TRUE(kEnvSet);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  EnvGuard plugin("NCCL_NET_PLUGIN", LOOM_TEST_NET_PLUGIN);
  EnvGuard net("NCCL_NET", "LoomTest");
  EnvGuard mode("LOOM_TEST_NET_MODE", "dmabuf");
  EnvGuard nics("LOOM_TEST_NET_DEVICES", "2");
  EnvGuard topo("NCCL_TOPO_FILE", LOOM_TOPO_FIXTURES "/rails_2gpu_2nic.xml");
  CollLogs logs;
  EnvGuard subsys("NCCL_DEBUG_SUBSYS", "COLL,INIT");
  verdict(processesOnHosts(2, [](int r) { return r; }, everyCollective));
  if (::testing::Test::IsSkipped() || kernelLaunchesExpected(1, 1) <= 0) return;
  expectKernelLaunches(logs, 7, 2);
  const std::string all = logs.all();
  int first = 0, second = 0, other = 0;
  std::istringstream in(all);
  for (std::string line; std::getline(in, line);) {
    if (line.find("device FIFO from rank") == std::string::npos || line.find("net/LoomTest") == std::string::npos)
      continue;
    const bool gpu = line.find("slots in GPU memory (GPUDirect RDMA, DMA-BUF)") != std::string::npos;
    if (line.find("(#0) through net/LoomTest on loomtest-lo1,") != std::string::npos && gpu) ++first;
    else if (line.find("(#1) through net/LoomTest on loomtest-lo,") != std::string::npos && gpu) ++second;
    else ++other;
  }
  EXPECT_EQ(first, 2) << all;  // each rank's connection #0 from the other
  EXPECT_EQ(other, 0) << all;   // a connection #1, where plans use one, on the other NIC
  (void)second;
#endif
}

// A rank on another host that exits while a rank's kernel waits for it: its connection
// fails in the proxy, and the watchdog stops the kernel (after the grace a receiving end
// gets), so the stream goes on and ncclCommGetAsyncError says what failed.
TEST(STAGED_SUITE, DeviceExecutorAcrossHostsStopsWhenAPeerDies) {
  ASSERT_TRUE(kEnvSet);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  verdict(processesOnHosts(
      2, [](int r) { return r; }, [](int rank, int, ncclComm_t comm) { return peerDiesMidAllReduce(rank, comm, true); },
      60));
}

// A peer on another host that destroys its communicator and leaves while the others go on
// is no failure: its connections close, which may fail the receives posted ahead on them
// (Loom's TCP backend holds them; the test plugin fails them), but no kernel expects more
// from it (DeviceNet counts what each launch takes). Here rank 0's next kernel waits half a
// second for rank 1 meanwhile (a miscount would be reported at once); over the TCP backend,
// then the test plugin.
std::string outliveALeaver(int rank, int, ncclComm_t comm) {
  mem().makeCurrent(0);
  auto s = static_cast<cudaStream_t>(mem().createStream());
  const size_t k = 1 << 14;
  int32_t* a = devInts(inputs(1, rank, k));
  RANK_NCCL(ncclAllReduce(a, a, k, ncclInt32, ncclSum, comm, s));  // every pair connected
  mem().syncStream(s);
  if (rank == 2) {  // gone while the others' connections are made and their kernels wait
    RANK_NCCL(ncclCommDestroy(comm));
    _exit(0);
  }
  int32_t* p = devInts(rank == 1 ? inputs(2, 1, k) : std::vector<int32_t>(k, -1));
  // Twice: the first connects, the second's kernel waits on the GPU for rank 1.
  for (int round = 0; round < 2; ++round) {
    if (rank == 1 && round == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    RANK_NCCL(ncclGroupStart());
    if (rank == 1) RANK_NCCL(ncclSend(p, k, ncclInt32, 0, comm, s));
    else RANK_NCCL(ncclRecv(p, k, ncclInt32, 1, comm, s));
    RANK_NCCL(ncclGroupEnd());
    mem().syncStream(s);
  }
  ncclResult_t async = ncclSuccess;
  RANK_NCCL(ncclCommGetAsyncError(comm, &async));
  RANK_CHECK(async == ncclSuccess, "async error %d: %s", async, ncclGetLastError(comm));
  if (rank == 0) RANK_TRY(expectInts("received after rank 2 left", hostInts(p, k), inputs(2, 1, k)));
  return "";
}

TEST(STAGED_SUITE, DeviceExecutorAcrossHostsOutlivesAPeerThatLeaves) {
  ASSERT_TRUE(kEnvSet);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  verdict(processesOnHosts(3, [](int r) { return r; }, outliveALeaver, 60));
#ifdef LOOM_TEST_NET_PLUGIN
  EnvGuard plugin("NCCL_NET_PLUGIN", LOOM_TEST_NET_PLUGIN);
  EnvGuard net("NCCL_NET", "LoomTest");
  verdict(processesOnHosts(3, [](int r) { return r; }, outliveALeaver, 60));
#endif
}

// Ranks that share a CUDA context meet for each collective: an all-gather or broadcast
// is copied between their buffers by the last to arrive (in place or not, nothing to
// move, after an all-reduce on the same streams); a group of two collectives per rank goes
// to the host engine on every rank alike.
TEST(STAGED_SUITE, RanksSharingAContextCopyBetweenTheirBuffers) {
  NEED_DEVICE();
  verdict(threadsOnDevice0(3, copyBetweenBuffers));
}

// Ranks sharing a CUDA context may group their calls differently, as NCCL allows: a rank
// that groups a collective with a send, or two collectives, sends those collectives to the
// host engine on every rank (nobody waits for a meeting it cannot lead), and the ranks'
// later collectives still meet in step.
TEST(STAGED_SUITE, RanksSharingAContextMayGroupDifferently) {
  NEED_DEVICE();
  verdict(threadsOnDevice0(3, groupDifferently));
}

// Several ranks of one process on one device (what stock NCCL refuses): each rank's own
// thread and stream.
TEST(STAGED_SUITE, FourRanksShareOneDeviceAsThreads) {
  NEED_DEVICE();
  verdict(threadsOnDevice0(4, everyCollective));
}

// Ranks as threads queue all-reduces of growing sizes without waiting in between, as a
// benchmark's warm-up does. A staged call that outgrows its pooled pinned block must not
// free it: cuMemFreeHost waits for every stream of the context (the stand-in as the driver
// of an H100 does), and the other rank's stream is held until this rank's next call.
TEST(STAGED_SUITE, RanksAsThreadsQueueGrowingSizesWithoutWaiting) {
  NEED_DEVICE();
  verdict(threadsOnDevice0(
      2,
      [](int rank, int n, ncclComm_t comm) -> std::string {
        auto s = static_cast<cudaStream_t>(mem().createStream());
        const size_t maxCount = size_t{1} << 20;  // 4 MiB of int32
        int32_t* src = devInts(inputs(1, rank, maxCount));
        int32_t* out = devInts(std::vector<int32_t>(maxCount, -1));
        for (int round = 0; round < 3; ++round) {
          // Small calls first, waited for: their records return to the pool with small blocks.
          for (size_t count = 1; count <= 64; count *= 4)
            RANK_NCCL(ncclAllReduce(src, out, count, ncclInt32, ncclSum, comm, s));
          mem().syncStream(s);
          for (size_t count = 256; count <= maxCount; count *= 4)
            RANK_NCCL(ncclAllReduce(src, out, count, ncclInt32, ncclSum, comm, s));
          mem().syncStream(s);
          std::vector<int32_t> want(maxCount);
          for (size_t i = 0; i < maxCount; ++i)
            for (int r = 0; r < n; ++r) want[i] += in(1, r, i);
          RANK_TRY(expectInts("all-reduce of the largest size", hostInts(out, maxCount), want));
        }
        return "";
      }));
}

// An NCCL profiler plugin (Loom's test plugin, test_profiler_plugin.cc) sees the staged
// path's host engine: each call's Coll event under its CollApi event, made before the call
// returns (as NCCL makes it, not when the stream reaches the work), with the caller's
// device buffers (not the staging), and its channel events while the host engine runs it.
TEST(STAGED_SUITE, AProfilerPluginSeesTheHostEnginesPartInThreads) {
  NEED_DEVICE();
  const std::string path = std::string(LOOM_TEST_PROFILER_PLUGIN_DIR) + "/libnccl-profiler-loomtest-v5.so";
  if (access(path.c_str(), R_OK) != 0) GTEST_SKIP() << "no test profiler plugin at " << path;
  const std::string log = ::testing::TempDir() + "loom-staged-profiler-" + std::to_string(getpid()) + ".log";
  remove(log.c_str());
  EnvGuard plugin("NCCL_PROFILER_PLUGIN", path.c_str()), logEnv("LOOM_TEST_PROFILER_LOG", log.c_str());
  const void* send[2] = {};
  const void* recv[2] = {};
  verdict(threadsOnOwnDevices(2, [&](int rank, int n, ncclComm_t comm) -> std::string {
    auto s = static_cast<cudaStream_t>(mem().createStream());
    const size_t k = 1000;
    int32_t* src = devInts(inputs(1, rank, k));
    int32_t* out = devInts(std::vector<int32_t>(k, -1));
    send[rank] = src;
    recv[rank] = out;
    RANK_NCCL(ncclAllReduce(src, out, k, ncclInt32, ncclSum, comm, s));
    std::ofstream(log, std::ios::app) << "returned rank=" << rank << "\n";
    mem().syncStream(s);
    std::vector<int32_t> want(k);
    for (size_t i = 0; i < k; ++i)
      for (int r = 0; r < n; ++r) want[i] += in(1, r, i);
    return expectInts("all-reduce", hostInts(out, k), want);
  }));
  // start ctx=C ev=E type=T parent=P rank=R ... (test_profiler_plugin.cc); state/stop ev=E.
  struct Ev {
    std::map<std::string, std::string> f;
    int stops = 0, kernelChStops = 0, line = 0;
  };
  std::map<std::string, Ev> ev;
  std::map<std::string, int> returned;  // rank -> the line its call's return was noted on
  std::ifstream in(log);
  int lineNo = 0;
  for (std::string l; std::getline(in, l); ++lineNo) {
    std::istringstream line(l);
    std::string what;
    line >> what;
    std::map<std::string, std::string> f;
    for (std::string kv; line >> kv;)
      if (const size_t eq = kv.find('='); eq != std::string::npos) f[kv.substr(0, eq)] = kv.substr(eq + 1);
    if (what == "returned") returned[f["rank"]] = lineNo;
    if (what == "start") {
      ev[f["ev"]].f = f;
      ev[f["ev"]].line = lineNo;
    }
    if (what == "stop") ++ev[f["ev"]].stops;
    if (what == "state" && f["state"] == "22") ++ev[f["ev"]].kernelChStops;
  }
  remove(log.c_str());
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    std::vector<const Ev*> apis, colls, channels;
    for (const auto& [id, e] : ev) {
      if (e.f.at("rank") != std::to_string(rank)) continue;
      const std::string type = e.f.at("type");
      (type == "512" ? apis : type == "2" ? colls : type == "64" ? channels : apis).push_back(&e);
      EXPECT_EQ(e.stops, 1) << "event " << id;
    }
    ASSERT_EQ(colls.size(), 1u);
    const Ev& c = *colls[0];
    EXPECT_EQ(c.f.at("func"), "AllReduce");
    EXPECT_EQ(c.f.at("count"), "1000");
    ASSERT_TRUE(returned.count(std::to_string(rank)));
    EXPECT_LT(c.line, returned.at(std::to_string(rank))) << "the Coll event comes before the call returns";
    std::ostringstream sb, rb;
    sb << send[rank];
    rb << recv[rank];
    EXPECT_EQ(c.f.at("send"), sb.str()) << "the caller's device buffer";
    EXPECT_EQ(c.f.at("recv"), rb.str());
    EXPECT_TRUE(ev.count(c.f.at("parent")) && ev.at(c.f.at("parent")).f.at("type") == "512") << "under its CollApi";
    ASSERT_EQ(static_cast<long>(channels.size()), std::stol(c.f.at("nch")));
    for (const Ev* k : channels) {
      EXPECT_EQ(k->f.at("parent"), c.f.at("ev"));
      EXPECT_EQ(k->kernelChStops, 1);
    }
  }
}

// One thread drives two ranks on one device through a group: one staged launch spanning
// both communicators, on two streams that the group joins.
TEST(STAGED_SUITE, GroupOfTwoCommunicatorsOnTwoStreams) {
  NEED_DEVICE();
  mem().makeCurrent(0);
  ncclComm_t comms[2];
  int devs[2] = {0, 0};
  ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess) << ncclGetLastError(nullptr);
  void* streams[2] = {mem().createStream(), mem().createStream()};
  const size_t k = 4099;
  int32_t* buf[2];
  int32_t* gathered[2];
  for (int r = 0; r < 2; ++r) {
    buf[r] = devInts(inputs(1, r, k));
    gathered[r] = devInts(std::vector<int32_t>(2 * k, -1));
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(ncclAllReduce(buf[r], buf[r], k, ncclInt32, ncclSum, comms[r],
                            static_cast<cudaStream_t>(streams[r])), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(ncclAllGather(buf[r], gathered[r], k, ncclInt32, comms[r],
                            static_cast<cudaStream_t>(streams[1 - r])), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (void* s : streams) mem().syncStream(s);
  std::vector<int32_t> want(k);
  for (size_t i = 0; i < k; ++i) want[i] = in(1, 0, i) + in(1, 1, i);
  std::vector<int32_t> wantAg = want;
  wantAg.insert(wantAg.end(), want.begin(), want.end());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(expectInts("all-reduce", hostInts(buf[r], k), want), "") << "rank " << r;
    EXPECT_EQ(expectInts("all-gather", hostInts(gathered[r], 2 * k), wantAg), "") << "rank " << r;
  }
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// The call returns while its stream is held, before any of its work ran; the work runs,
// in order, once the stream goes on. A host call on the same communicator waits for it.
TEST(STAGED_SUITE, CallsReturnBeforeTheirStreamRuns) {
  NEED_DEVICE();
  if (!mem().canPause()) GTEST_SKIP() << "only the stand-in driver can hold a stream";
  mem().makeCurrent(0);
  ncclComm_t comm;
  int dev = 0;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, &dev), ncclSuccess) << ncclGetLastError(nullptr);
  void* stream = mem().createStream();
  const size_t k = 257;
  int32_t* a = devInts(inputs(1, 0, k));
  int32_t* b = devInts(std::vector<int32_t>(k, -1));
  mem().pauseStream(stream);
  auto s = static_cast<cudaStream_t>(stream);
  ASSERT_EQ(ncclAllReduce(a, b, k, ncclInt32, ncclSum, comm, s), ncclSuccess);
  ASSERT_EQ(ncclBroadcast(b, a, k, ncclInt32, 0, comm, s), ncclSuccess);
  // (holds() looks without the driver: a copy on the legacy stream would wait for this one)
  EXPECT_TRUE(mem().holds(b, k * sizeof(int32_t), 0xFF)) << "the stream is held: nothing ran";
  std::vector<int32_t> h(k, 5), hOut(k, 0);
  std::thread resume([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    mem().resumeStream(stream);
  });
  // Issued after the device calls: it runs after them, once the stream has let them run.
  EXPECT_EQ(ncclAllReduce(h.data(), hOut.data(), k, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
  resume.join();
  mem().syncStream(stream);
  EXPECT_EQ(hostInts(b, k), inputs(1, 0, k));
  EXPECT_EQ(hostInts(a, k), inputs(1, 0, k));
  EXPECT_EQ(hOut, h);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// Ranks of one process on one device share a CUDA context: their staged calls run on the
// calling thread (engine/staged.h), so a call waits there for the other ranks' calls, and
// an abort from another thread ends it with an error instead.
TEST(STAGED_SUITE, AbortEndsACallWaitingForRanksOfItsContext) {
  NEED_DEVICE();
  mem().makeCurrent(0);
  ncclComm_t comms[2];
  int devs[2] = {0, 0};
  ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess) << ncclGetLastError(nullptr);
  void* stream = mem().createStream();
  int32_t* a = devInts(inputs(1, 0, 1000));
  ncclResult_t rc = ncclSuccess;
  std::thread caller([&] {
    mem().makeCurrent(0);
    rc = ncclAllReduce(a, a, 1000, ncclInt32, ncclSum, comms[0], static_cast<cudaStream_t>(stream));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 1 never joins
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  caller.join();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(rc, ncclSuccess) << "the call returned success without its peer";
  EXPECT_LT(s, 5) << "the abort took " << s << " s to end the call";
  mem().syncStream(stream);
  EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
}

// Two ranks of one process on device 0, both on stream `s`.
void ranksShareOneStream(cudaStream_t s) {
  mem().makeCurrent(0);
  ncclComm_t comms[2];
  int devs[2] = {0, 0};
  ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess) << ncclGetLastError(nullptr);
  const size_t k = 333;
  int32_t* buf[2] = {devInts(inputs(1, 0, k)), devInts(inputs(1, 1, k))};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(ncclAllReduce(buf[r], buf[r], k, ncclInt32, ncclSum, comms[r], s), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<int32_t> want(k);
  for (size_t i = 0; i < k; ++i) want[i] = in(1, 0, i) + in(1, 1, i);
  ncclResult_t rc[2] = {ncclInternalError, ncclInternalError};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      mem().makeCurrent(0);
      for (int rep = 0; rep < 3 && (rep == 0 || rc[r] == ncclSuccess); ++rep)
        rc[r] = ncclAllReduce(buf[r], buf[r], k, ncclInt32, ncclSum, comms[r], s);
    });
  for (std::thread& t : ranks) t.join();
  mem().syncStream(s);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(rc[r], ncclSuccess) << ncclGetLastError(comms[r]);
    // Four all-reduces of two ranks' equal buffers: the sum doubled three times more.
    std::vector<int32_t> w(k);
    for (size_t i = 0; i < k; ++i) w[i] = want[i] * 8;
    EXPECT_EQ(expectInts("four all-reduces", hostInts(buf[r], k), w), "") << "rank " << r;
  }
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Ranks of one process on one stream work, in one group from one thread and each from its
// own thread (nothing on the stream waits for another rank's call): a stream of their own,
// and the legacy default stream.
TEST(STAGED_SUITE, RanksOfOneProcessMayShareAStream) {
  NEED_DEVICE();
  for (bool legacy : {false, true}) {
    SCOPED_TRACE(legacy ? "legacy default stream" : "created stream");
    ranksShareOneStream(legacy ? nullptr : static_cast<cudaStream_t>(mem().createStream()));
  }
}

// Capturing staged calls of ranks that share a CUDA context is refused before anything
// touches the stream, alone or in a group (a replay's wait on the GPU for another stream of
// the context can deadlock it), and the capture stays usable.
TEST(STAGED_SUITE, CapturingRanksThatShareAContextIsRefused) {
  NEED_DEVICE();
  GraphApi g;
  ASSERT_TRUE(g.bind());
  mem().makeCurrent(0);
  ncclComm_t comms[2];
  int devs[2] = {0, 0};
  ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess) << ncclGetLastError(nullptr);
  void* stream = mem().createStream();
  auto s = static_cast<cudaStream_t>(stream);
  int32_t* a[2] = {devInts(inputs(1, 0, 64)), devInts(inputs(1, 1, 64))};
  for (bool group : {false, true}) {
    SCOPED_TRACE(group ? "group" : "alone");
    ASSERT_EQ(g.begin(stream, 1 /* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL */), 0);
    ncclComm_t refused = comms[0];
    if (group) {
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int r = 0; r < 2; ++r)
        ASSERT_EQ(ncclAllReduce(a[r], a[r], 64, ncclInt32, ncclSum, comms[r], s), ncclSuccess);
      EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
      refused = nullptr;
    } else {
      EXPECT_EQ(ncclAllReduce(a[0], a[0], 64, ncclInt32, ncclSum, comms[0], s), ncclInvalidUsage);
    }
    std::string msg = ncclGetLastError(refused);
    EXPECT_NE(msg.find("of this communicator run in this process on the same CUDA device"),
              std::string::npos) << msg;
    void* graph = nullptr;
    EXPECT_EQ(g.end(stream, &graph), 0) << "the refusal broke the capture";
    if (graph) g.destroy(graph);
  }
  EXPECT_EQ(hostInts(a[0], 64), inputs(1, 0, 64)) << "a refused call ran";
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// ncclScalarDevice: a pre-multiplied sum whose scalar is device memory, read when each call
// runs on its stream (a later call sees a scalar changed in between). Host buffers with such
// an op, or a host scalar passed as ncclScalarDevice, are refused.
TEST(STAGED_SUITE, PreMulSumReadsADeviceScalarWhenTheCallRuns) {
  NEED_DEVICE();
  mem().makeCurrent(0);
  ncclComm_t comms[2];
  int devs[2] = {0, 0};
  ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess) << ncclGetLastError(nullptr);
  auto devFloats = [](const std::vector<float>& v) {
    auto* p = static_cast<float*>(mem().allocDevice(v.size() * sizeof(float), 0, 0));
    mem().toDevice(p, v.data(), v.size() * sizeof(float));
    return p;
  };
  const size_t k = 301;
  float* scalar[2] = {devFloats({0.5f}), devFloats({2.0f})};
  float* x[2];
  float* y[2];
  ncclRedOp_t op[2];
  cudaStream_t s[2];
  for (int r = 0; r < 2; ++r) {
    std::vector<float> in(k);
    for (size_t i = 0; i < k; ++i) in[i] = static_cast<float>(r + 1 + i % 7);
    x[r] = devFloats(in);
    y[r] = devFloats(std::vector<float>(k, -1));
    s[r] = static_cast<cudaStream_t>(mem().createStream());
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op[r], scalar[r], ncclFloat, ncclScalarDevice, comms[r]),
              ncclSuccess) << ncclGetLastError(comms[r]);
  }
  auto run = [&](float a, float b) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; ++r)
      ASSERT_EQ(ncclAllReduce(x[r], y[r], k, ncclFloat, op[r], comms[r], s[r]), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    for (cudaStream_t st : s) mem().syncStream(st);
    for (int r = 0; r < 2; ++r) {
      std::vector<float> got(k);
      mem().fromDevice(got.data(), y[r], k * sizeof(float));
      for (size_t i = 0; i < k; ++i) {
        float want = a * static_cast<float>(1 + i % 7) + b * static_cast<float>(2 + i % 7);
        ASSERT_EQ(got[i], want) << "rank " << r << " [" << i << "]";
      }
    }
  };
  run(0.5f, 2.0f);
  float four = 4.0f, quarter = 0.25f;
  mem().toDevice(scalar[0], &four, sizeof(float));
  mem().toDevice(scalar[1], &quarter, sizeof(float));
  run(4.0f, 0.25f);  // read when the call runs, not when the op was made

  std::vector<float> h(k, 1.0f);
  EXPECT_EQ(ncclAllReduce(h.data(), h.data(), k, ncclFloat, op[0], comms[0], nullptr),
            ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(comms[0])).find("ncclScalarDevice"), std::string::npos)
      << ncclGetLastError(comms[0]);
  ncclRedOp_t bad;
  EXPECT_EQ(ncclRedOpCreatePreMulSum(&bad, &four, ncclFloat, ncclScalarDevice, comms[0]),
            ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(comms[0])).find("not CUDA device memory"),
            std::string::npos) << ncclGetLastError(comms[0]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ncclRedOpDestroy(op[r], comms[r]), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
  }
}

// The device executor with rank threads, each on a device of its own: each rank's kernel on
// its own stream, the FIFOs' memory shared by plain pointers. Where fewer devices than ranks
// are (one GPU), ranks share them and the executor declines: the direct path serves them,
// with the same results.
TEST(STAGED_SUITE, DeviceExecutorRunsEveryCollectiveInThreads) {
  NEED_DEVICE();
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  for (int n : {2, 3}) {
    SCOPED_TRACE(n);
    CollLogs logs;
    verdict(threadsOnOwnDevices(n, everyCollective));
    expectKernelLaunches(logs, threadsShareDevices(n) ? 0 : 7, n);
  }
}

TEST(STAGED_SUITE, DeviceExecutorSendsAndReceivesInThreads) {
  NEED_DEVICE();
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  for (int n : {2, 3}) {
    SCOPED_TRACE(n);
    CollLogs logs;
    verdict(threadsOnOwnDevices(n, sendsAndReceives));
    expectKernelLaunches(logs, threadsShareDevices(n) ? 0 : 8, n);
  }
}

// Loom's test tuner plugin of ABI version `v` (test_tuner_plugin.cc): beside the build's, or,
// where the binary runs away from its build (scripts/gpu_check.sh), beside the v5 plugin
// LOOM_TEST_TUNER_PLUGIN names (the check stages v5 and v6).
std::string testTunerPlugin(int v) {
  const std::string named = getenv("LOOM_TEST_TUNER_PLUGIN") ? getenv("LOOM_TEST_TUNER_PLUGIN") : "";
  const std::string dir = named.empty() ? LOOM_TEST_TUNER_PLUGIN_DIR : named.substr(0, named.rfind('/'));
  return dir + "/libnccl-tuner-loomtest-v" + std::to_string(v) + ".so";
}
#define NEED_TUNER_PLUGIN(path) \
  if (access((path).c_str(), R_OK) != 0) GTEST_SKIP() << "no test tuner plugin at " << (path)

// An NCCL tuner plugin ranks the device executor's plans too: Loom's test plugin
// (test_tuner_plugin.cc, mode "tree") makes the tree the all-reduce, on 3 channels.
TEST(STAGED_SUITE, DeviceExecutorFollowsTheTunerPlugin) {
  NEED_DEVICE();
  const std::string path = testTunerPlugin(5);
  NEED_TUNER_PLUGIN(path);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  EnvGuard plugin("NCCL_TUNER_PLUGIN", path.c_str());
  EnvGuard mode("LOOM_TEST_TUNER_MODE", "tree");
  for (int n : {2, 3}) {
    SCOPED_TRACE(n);
    CollLogs logs;
    verdict(threadsOnOwnDevices(n, [](int rank, int nranks, ncclComm_t comm) -> std::string {
      if (const loom::DeviceExec* ex = comm->core->deviceExec()) {
        const loom::Selection s =
            loom::select({loom::Collective::kAllReduce, (size_t{1} << 20) / 4, 4, 0}, ex->planContext());
        RANK_CHECK(s.algorithm == loom::Algorithm::kTree && s.channels == 3, "device all-reduce of 1 MiB: %s, %d channels",
                   loom::algorithmName(s.algorithm), s.channels);
      }
      return everyCollective(rank, nranks, comm);
    }));
    expectKernelLaunches(logs, threadsShareDevices(n) ? 0 : 7, n);
  }
}

// A v6 plugin's chunk reaches the device executor's plans as the host's (test_tuner_plugin.cc:
// mode "tree", chunk "numbered" gives NCCL's Tree/Simple 3000 bytes), and an all-reduce of
// many such chunks stays exact.
TEST(STAGED_SUITE, DeviceExecutorTakesTheTunersChunk) {
  NEED_DEVICE();
  const std::string path = testTunerPlugin(6);
  NEED_TUNER_PLUGIN(path);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  EnvGuard plugin("NCCL_TUNER_PLUGIN", path.c_str());
  EnvGuard mode("LOOM_TEST_TUNER_MODE", "tree");
  EnvGuard chunk("LOOM_TEST_TUNER_CHUNK", "numbered");
  for (int n : {2, 3}) {
    SCOPED_TRACE(n);
    CollLogs logs;
    verdict(threadsOnOwnDevices(n, [](int rank, int nranks, ncclComm_t comm) -> std::string {
      const size_t k = 100003;  // 400 KB: over a hundred 3000-byte chunks per channel
      if (const loom::DeviceExec* ex = comm->core->deviceExec()) {
        const loom::Selection s = loom::select({loom::Collective::kAllReduce, k, 4, 0}, ex->planContext());
        RANK_CHECK(s.algorithm == loom::Algorithm::kTree && s.chunkBytes == 3000, "device all-reduce: %s, chunk %zu",
                   loom::algorithmName(s.algorithm), s.chunkBytes);
      }
      useRankDevice();
      void* stream = mem().createStream();
      int32_t* ar = devInts(inputs(1, rank, k));
      RANK_NCCL(ncclAllReduce(ar, ar, k, ncclInt32, ncclSum, comm, static_cast<cudaStream_t>(stream)));
      mem().syncStream(stream);
      std::vector<int32_t> want(k, 0);
      for (size_t i = 0; i < k; ++i)
        for (int r = 0; r < nranks; ++r) want[i] += in(1, r, i);
      RANK_TRY(expectInts("all-reduce in 3000-byte chunks", hostInts(ar, k), want));
      return everyCollective(rank, nranks, comm);
    }));
    expectKernelLaunches(logs, threadsShareDevices(n) ? 0 : 8, n);  // everyCollective's 7, and one
  }
}

// A tuner's chunk larger than the device executor's FIFOs (8 slots of 64 KiB here) is
// clamped to what they hold (half of them for the ring, two slots for the tree), as on the
// host: a ring whose first send filled every slot would wait for ever.
TEST(STAGED_SUITE, DeviceExecutorClampsTheTunersChunkToItsFifos) {
  NEED_DEVICE();
  const std::string path = testTunerPlugin(6);
  NEED_TUNER_PLUGIN(path);
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  EnvGuard plugin("NCCL_TUNER_PLUGIN", path.c_str());
  EnvGuard slot("LOOM_SLOT_BYTES", "65536");
  EnvGuard chunk("LOOM_TEST_TUNER_CHUNK", "1073741824");
#ifdef LOOM_STAND_IN_CUDA_PATH  // the stand-in's devices on a GPU machine's topology: the GPU model's plans
  EnvGuard topo("NCCL_TOPO_FILE", LOOM_TOPO_FIXTURES "/dgx_h100.xml");
#endif
  for (const char* algo : {"ring", "tree"}) {
    SCOPED_TRACE(algo);
    EnvGuard a("NCCL_ALGO", algo);
    CollLogs logs;
    verdict(threadsOnOwnDevices(3, [algo](int rank, int nranks, ncclComm_t comm) -> std::string {
      const size_t k = 1 << 20;  // 4 MiB
      if (const loom::DeviceExec* ex = comm->core->deviceExec()) {
        const loom::Selection s = loom::select({loom::Collective::kAllReduce, k, 4, 0}, ex->planContext());
        const size_t most = std::string(algo) == "ring" ? 256 << 10 : 128 << 10;
        RANK_CHECK(s.chunkBytes == most, "device all-reduce (%s): chunk %zu, not %zu", algo, s.chunkBytes, most);
      }
      useRankDevice();
      void* stream = mem().createStream();
      int32_t* ar = devInts(inputs(2, rank, k));
      RANK_NCCL(ncclAllReduce(ar, ar, k, ncclInt32, ncclSum, comm, static_cast<cudaStream_t>(stream)));
      mem().syncStream(stream);
      std::vector<int32_t> want(k, 0);
      for (size_t i = 0; i < k; ++i)
        for (int r = 0; r < nranks; ++r) want[i] += in(2, r, i);
      RANK_TRY(expectInts("all-reduce in clamped chunks", hostInts(ar, k), want));
      return "";
    }));
    expectKernelLaunches(logs, threadsShareDevices(3) ? 0 : 1, 3);
  }
}

// One thread drives two ranks on two devices (ncclCommInitAll), as a training process over
// its GPUs does: a group of all-reduces, then one of all-gathers, each rank's kernel on its
// own device's stream. Their first use makes the connections of both ranks at once (one
// thread, so the executors prepare concurrently before either kernel is queued).
TEST(STAGED_SUITE, DeviceExecutorOneThreadDrivesTwoDevices) {
  NEED_DEVICE();
  if (mem().deviceCount() < 2) GTEST_SKIP() << "one device here";
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  CollLogs logs;
  ncclComm_t comms[2];
  int devs[2] = {0, 1};
  ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess) << ncclGetLastError(nullptr);
  const size_t k = 4099;
  int32_t* x[2];
  int32_t* g[2];
  void* s[2];
  for (int r = 0; r < 2; ++r) {
    mem().makeCurrent(r);
    x[r] = static_cast<int32_t*>(mem().allocDevice(k * sizeof(int32_t), r, 0));
    g[r] = static_cast<int32_t*>(mem().allocDevice(2 * k * sizeof(int32_t), r, 0xEE));
    mem().toDevice(x[r], inputs(1, r, k).data(), k * sizeof(int32_t));
    s[r] = mem().createStream();
  }
  for (int round = 0; round < 2; ++round) {  // the second round reuses the connections
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; ++r)
      ASSERT_EQ(ncclAllReduce(x[r], x[r], k, ncclInt32, ncclSum, comms[r], static_cast<cudaStream_t>(s[r])),
                ncclSuccess) << ncclGetLastError(comms[r]);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; ++r)
      ASSERT_EQ(ncclAllGather(x[r], g[r], k, ncclInt32, comms[r], static_cast<cudaStream_t>(s[r])), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  }
  for (int r = 0; r < 2; ++r) {
    mem().makeCurrent(r);
    mem().syncStream(s[r]);
  }
  std::vector<int32_t> want(k);
  for (size_t i = 0; i < k; ++i) want[i] = 2 * (in(1, 0, i) + in(1, 1, i));  // summed twice
  for (int r = 0; r < 2; ++r) {
    mem().makeCurrent(r);
    std::vector<int32_t> got(2 * k);
    mem().fromDevice(got.data(), g[r], 2 * k * sizeof(int32_t));
    for (int b = 0; b < 2; ++b)
      for (size_t i = 0; i < k; ++i) ASSERT_EQ(got[b * k + i], want[i]) << "rank " << r << " block " << b << " [" << i << "]";
  }
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  expectKernelLaunches(logs, 4, 2);
}

// ncclCommInitAll initializes each rank on a thread of its own that has no current CUDA
// context (as in CUDA; the stand-in is told so): the executor still serves both ranks,
// each on a device of its own (found on an H100: its IPC trial allocated with no context,
// so no rank got the executor). Each rank's thread then runs an all-reduce and an
// all-gather. On one GPU the ranks share it and the direct path serves them.
TEST(STAGED_SUITE, DeviceExecutorServesCommInitAll) {
  NEED_DEVICE();
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  CollLogs logs;
#ifdef LOOM_STAND_IN_CUDA_PATH
  mem().makeCurrent(-1);  // threads that set no context of their own have none
#endif
  ncclComm_t comms[2];
  int devs[2] = {0, threadsShareDevices(2) ? 0 : 1};
  const ncclResult_t init = ncclCommInitAll(comms, 2, devs);
  mem().makeCurrent(0);
  ASSERT_EQ(init, ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<std::string> failures(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      failures[r] = [&]() -> std::string {
        ncclComm_t comm = comms[r];
        tRankDevice = devs[r];
        useRankDevice();
        auto s = static_cast<cudaStream_t>(mem().createStream());
        const size_t k = 1031;
        int32_t* x = devInts(inputs(1, r, k));
        int32_t* g = devInts(std::vector<int32_t>(2 * k, -1));
        RANK_NCCL(ncclAllReduce(x, x, k, ncclInt32, ncclSum, comm, s));
        RANK_NCCL(ncclAllGather(x, g, k, ncclInt32, comm, s));
        mem().syncStream(s);
        std::vector<int32_t> want(2 * k);
        for (size_t i = 0; i < 2 * k; ++i) want[i] = in(1, 0, i % k) + in(1, 1, i % k);
        RANK_TRY(expectInts("all-gather of the all-reduce", hostInts(g, 2 * k), want));
        return "";
      }();
    });
  for (auto& t : ranks) t.join();
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  EXPECT_EQ(failures[0] + failures[1], "");
  expectKernelLaunches(logs, threadsShareDevices(2) ? 0 : 2, 2);
}

// The same with one rank (on one GPU too): its init thread has no context either, and its
// send to itself runs as the executor's kernel (a lone collective would be a device copy).
TEST(STAGED_SUITE, DeviceExecutorServesCommInitAllOfOneRank) {
  NEED_DEVICE();
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  CollLogs logs;
#ifdef LOOM_STAND_IN_CUDA_PATH
  mem().makeCurrent(-1);
#endif
  ncclComm_t comm;
  int dev = 0;
  const ncclResult_t init = ncclCommInitAll(&comm, 1, &dev);
  mem().makeCurrent(0);
  ASSERT_EQ(init, ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<std::string> failures = {[&]() -> std::string {
    auto s = static_cast<cudaStream_t>(mem().createStream());
    const size_t k = 777;
    int32_t* x = devInts(inputs(1, 0, k));
    int32_t* y = devInts(std::vector<int32_t>(k, -1));
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclSend(x, k, ncclInt32, 0, comm, s));
    RANK_NCCL(ncclRecv(y, k, ncclInt32, 0, comm, s));
    RANK_NCCL(ncclGroupEnd());
    mem().syncStream(s);
    RANK_TRY(expectInts("received from itself", hostInts(y, k), inputs(1, 0, k)));
    return "";
  }()};
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  EXPECT_EQ(failures[0], "");
  expectKernelLaunches(logs, 1, 1);
}

// A one-rank communicator's lone collectives on device buffers are device copies on the
// call's stream (nothing for one in place), with the executor asked for too; its sends to
// itself (all-to-all is a group of them) keep their path. Every result checked, as for more
// ranks.
TEST(STAGED_SUITE, OneRankCollectivesAreDeviceCopies) {
  NEED_DEVICE();
  for (const char* executor : {"staged", "kernel"}) {
    SCOPED_TRACE(executor);
    EnvGuard kernel("LOOM_DEVICE_EXECUTOR", executor);
    CollLogs logs;
    verdict(threadsOnDevice0(1, everyCollective));
    // all-reduce and broadcast in place; all-gather, reduce, reduce-scatter copied
    EXPECT_EQ(logs.count("one rank: "), 5) << logs.all();
    EXPECT_EQ(logs.count("one rank: a device copy"), 3) << logs.all();
    // A float average is a pre-multiplied sum (by 1/1): not a copy, the same result.
    verdict(threadsOnDevice0(1, [](int, int, ncclComm_t comm) -> std::string {
      useRankDevice();
      auto s = static_cast<cudaStream_t>(mem().createStream());
      std::vector<float> x(300);
      for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i) - 7.0f;
      auto* in = static_cast<float*>(mem().allocDevice(x.size() * sizeof(float), 0, 0));
      auto* out = static_cast<float*>(mem().allocDevice(x.size() * sizeof(float), 0, 0xEE));
      mem().toDevice(in, x.data(), x.size() * sizeof(float));
      RANK_NCCL(ncclAllReduce(in, out, x.size(), ncclFloat32, ncclAvg, comm, s));
      mem().syncStream(s);
      std::vector<float> got(x.size());
      mem().fromDevice(got.data(), out, got.size() * sizeof(float));
      for (size_t i = 0; i < x.size(); ++i)
        RANK_CHECK(got[i] == x[i], "average of one rank [%zu]: %g, want %g", i, got[i], x[i]);
      return "";
    }));
    EXPECT_EQ(logs.count("one rank: "), 5) << logs.all();
  }
}

// Rank threads on one device share its CUDA context, whose streams share the GPU's work
// queues: the executor declines them on every rank (the INIT log says why), and the direct
// path serves them, with the same results (8 such threads on an H100 hung the executor).
TEST(STAGED_SUITE, DeviceExecutorDeclinesThreadsSharingADevice) {
  NEED_DEVICE();
  EnvGuard kernel("LOOM_DEVICE_EXECUTOR", "kernel");
  CollLogs logs;
  setenv("NCCL_DEBUG_SUBSYS", "INIT,COLL", 1);  // the logs' destructor unsets it
  loom::logReset();
  verdict(threadsOnDevice0(3, everyCollective));
  expectKernelLaunches(logs, 0, 3);
  if (kernelLaunchesExpected(1, 1) > 0) {  // where the executor could serve them: why not, said
    EXPECT_EQ(logs.count("no device executor (LOOM_DEVICE_EXECUTOR=kernel)"), 3) << logs.all();
    EXPECT_GE(logs.count("is a thread of this process on the same CUDA device 0"), 1) << logs.all();
  }
}

}  // namespace
}  // namespace loomtest
