// Hostile connections to the bootstrap root while ranks initialize: garbage, idle
// clients, well-formed but unauthenticated hellos and connect-and-close must be dropped
// without stalling or corrupting the job; a rank holding the wrong secret cannot join.
#include <nccl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "base/hmac.h"
#include "bootstrap/root.h"
#include "bootstrap/unique_id.h"
#include "core/core_util.h"

namespace loomtest {
namespace {

using Clock = std::chrono::steady_clock;

int connectTo(int port, double timeoutSec) {
  auto deadline = Clock::now() + std::chrono::duration<double>(timeoutSec);
  while (Clock::now() < deadline) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

// Waits until the peer closes (EOF or reset); returns seconds waited, or -1 on time-out.
double waitClosed(int fd, double timeoutSec) {
  auto t0 = Clock::now();
  char buf[256];
  for (;;) {
    double left = timeoutSec - std::chrono::duration<double>(Clock::now() - t0).count();
    if (left <= 0) return -1;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left * 1000) + 1) > 0) {
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) return std::chrono::duration<double>(Clock::now() - t0).count();
    }
  }
}

enum class Junk { kGarbage, kIdle, kForgedHello, kConnectClose, kHugeClaim };
const char* junkName(Junk j) {
  switch (j) {
    case Junk::kGarbage: return "garbage";
    case Junk::kIdle: return "idle";
    case Junk::kForgedHello: return "forged hello";
    case Junk::kConnectClose: return "connect-close";
    case Junk::kHugeClaim: return "huge claim";
  }
  return "?";
}

// A hello that parses (magic, version, kind) but whose MAC is made up.
loom::RootHello forgedHello(int rank, int nranks) {
  loom::RootHello h{};
  h.magic = loom::kUniqueIdMagic;
  h.version = loom::kWireVersion;
  h.kind = 1;
  h.rank = rank;
  h.nranks = nranks;
  loom::randomBytes(h.nonce, sizeof(h.nonce));
  loom::randomBytes(h.mac, sizeof(h.mac));
  return h;
}

struct JunkResult {
  bool connected = false;
  double closedAfter = -1;  // seconds until the root closed it; -1: never
};

void runJunk(Junk kind, int port, JunkResult* out) {
  int fd = connectTo(port, 10);
  if (fd < 0) return;
  out->connected = true;
  switch (kind) {
    case Junk::kGarbage: {
      std::vector<unsigned char> bytes(4096);
      loom::randomBytes(bytes.data(), bytes.size());
      (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      break;
    }
    case Junk::kForgedHello: {
      loom::RootHello h = forgedHello(1, 4);  // claims a real rank's slot
      (void)!send(fd, &h, sizeof(h), MSG_NOSIGNAL);
      break;
    }
    case Junk::kHugeClaim: {
      loom::RootHello h = forgedHello(5, 1 << 30);
      (void)!send(fd, &h, sizeof(h), MSG_NOSIGNAL);
      break;
    }
    case Junk::kConnectClose:
      close(fd);
      out->closedAfter = 0;
      return;
    case Junk::kIdle:
      break;
  }
  out->closedAfter = waitClosed(fd, 40);
  close(fd);
}

// Set in each rank (process) just before its init, read by the rank body after it.
Clock::time_point gInitStart;

TEST(CoreBootstrap, HostileClientsDuringRendezvous) {
  const int nranks = 4;
  int port = freePort();
  ASSERT_NE(port, 0);
  EnvGuard commId("NCCL_COMM_ID", ("127.0.0.1:" + std::to_string(port)).c_str());
  EnvGuard limit("LOOM_TIMEOUT", "60");
  // Were the root to wait on an idle client, the rendezvous would take this long.
  EnvGuard auth("LOOM_BOOTSTRAP_AUTH_TIMEOUT_MS", "30000");
  const Junk kinds[] = {Junk::kGarbage, Junk::kIdle, Junk::kIdle, Junk::kForgedHello,
                        Junk::kConnectClose, Junk::kHugeClaim, Junk::kGarbage};
  // The junk clients run as threads of a child forked first: the ranks are forked below,
  // and a fork while this process's own threads run could inherit a held allocator lock
  // (GCC 12's ASan allocator is not fork-safe). Results come back in shared memory.
  constexpr size_t kJunk = std::size(kinds);
  void* shared = mmap(nullptr, sizeof(JunkResult) * kJunk, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  JunkResult* results = new (shared) JunkResult[kJunk];
  fflush(nullptr);
  pid_t junkPid = fork();
  ASSERT_GE(junkPid, 0);
  if (junkPid == 0) {
    std::vector<std::thread> junk;
    for (size_t i = 0; i < kJunk; ++i) junk.emplace_back(runJunk, kinds[i], port, &results[i]);
    for (auto& t : junk) t.join();
    _exit(0);
  }

  RankOptions opt;
  opt.timeoutSec = 90;
  // Rank 0 runs the root at once; the others arrive after the junk is connected.
  opt.beforeInit = [](int rank) {
    if (rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    gInitStart = Clock::now();
  };
  auto f = runRanks(Mode::kProcesses, nranks, [](int rank, int nranks, ncclComm_t comm) {
    double initSec = std::chrono::duration<double>(Clock::now() - gInitStart).count();
    // Rank 0 waits ~1.5 s for the others; a root stalled by an idle client until its
    // 30 s authentication time-out would show as far more.
    RANK_CHECK(initSec < 15, "init took %.1f s", initSec);
    std::vector<int64_t> in(50001), out(50001, -1);
    for (size_t i = 0; i < in.size(); ++i) in[i] = (rank + 1) * static_cast<int64_t>(i);
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), in.size(), ncclInt64, ncclSum, comm, nullptr));
    for (size_t i = 0; i < in.size(); ++i)
      RANK_CHECK(out[i] == nranks * (nranks + 1) / 2 * static_cast<int64_t>(i), "[%zu] = %lld", i,
                 static_cast<long long>(out[i]));
    return std::string();
  }, opt);
  int junkStatus = 0;
  ASSERT_EQ(waitpid(junkPid, &junkStatus, 0), junkPid);
  EXPECT_TRUE(WIFEXITED(junkStatus) && WEXITSTATUS(junkStatus) == 0) << "junk clients' process";
  EXPECT_TRUE(f.empty()) << joinFailures(f);
  for (size_t i = 0; i < std::size(kinds); ++i) {
    EXPECT_TRUE(results[i].connected) << junkName(kinds[i]) << " client #" << i
                                      << " never reached the root (test timing?)";
    EXPECT_GE(results[i].closedAfter, 0) << junkName(kinds[i]) << " client #" << i
                                         << " was never disconnected by the root";
  }
  // Clients that sent something wrong are cut off at once, not after the rendezvous.
  for (size_t i = 0; i < std::size(kinds); ++i) {
    if (kinds[i] == Junk::kForgedHello || kinds[i] == Junk::kGarbage || kinds[i] == Junk::kHugeClaim) {
      EXPECT_LT(results[i].closedAfter, 1.0) << junkName(kinds[i]) << " client #" << i;
    }
  }
  munmap(shared, sizeof(JunkResult) * kJunk);
}

// A process with a unique id that names the job's root but carries another secret (as a
// stale or forged id would) is refused; the job's real ranks are not disturbed.
TEST(CoreBootstrap, WrongSecretCannotJoin) {
  const int nranks = 4;
  EnvGuard limit("LOOM_TIMEOUT", "60");
  LateId late;  // made once the workers have started

  auto f = runEach(Mode::kProcesses, nranks + 1, [&](int worker, int) {
    ncclUniqueId good;
    RANK_TRY(late.wait(&good));
    if (worker == nranks) {  // the intruder, claiming rank 1 before the real one arrives
      loom::JobId job = loom::JobId::decode(good.internal);
      loom::randomBytes(job.secret, sizeof(job.secret));
      ncclUniqueId forged;
      job.encode(forged.internal);
      auto t0 = Clock::now();
      ncclComm_t comm = nullptr;
      ncclResult_t r = ncclCommInitRank(&comm, nranks, forged, 1);
      double sec = std::chrono::duration<double>(Clock::now() - t0).count();
      RANK_CHECK(r != ncclSuccess, "a rank with the wrong secret joined the job");
      RANK_CHECK(comm == nullptr, "failed init left a communicator handle");
      RANK_CHECK(sec < 10, "refusing the intruder took %.1f s", sec);
      return std::string();
    }
    if (worker != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    ncclComm_t comm = nullptr;
    RANK_NCCL(ncclCommInitRank(&comm, nranks, good, worker));
    std::vector<int32_t> in(70001), out(70001, -1);
    for (size_t i = 0; i < in.size(); ++i) in[i] = (worker + 1) * static_cast<int32_t>(i % 999);
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), in.size(), ncclInt32, ncclSum, comm, nullptr));
    for (size_t i = 0; i < in.size(); ++i)
      RANK_CHECK(out[i] == 10 * static_cast<int32_t>(i % 999), "[%zu] = %d", i, out[i]);
    RANK_NCCL(ncclCommDestroy(comm));
    return std::string();
  }, 90, [&] { return makeId(late); });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

// The same forged id in threads: the refusal is an error code with a message, and the
// process stays usable for a real job afterwards.
TEST(CoreBootstrap, WrongSecretAloneFailsFast) {
  ncclUniqueId good;
  ASSERT_EQ(ncclGetUniqueId(&good), ncclSuccess);
  loom::JobId job = loom::JobId::decode(good.internal);
  loom::randomBytes(job.secret, sizeof(job.secret));
  ncclUniqueId forged;
  job.encode(forged.internal);
  ncclComm_t comm = nullptr;
  auto t0 = Clock::now();
  ncclResult_t r = ncclCommInitRank(&comm, 2, forged, 0);
  EXPECT_NE(r, ncclSuccess);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)), "");
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  auto f = runRanks(Mode::kThreads, 2, [](int rank, int, ncclComm_t comm) {
    int v = rank + 1, s = 0;
    RANK_NCCL(ncclAllReduce(&v, &s, 1, ncclInt32, ncclSum, comm, nullptr));
    RANK_CHECK(s == 3, "sum %d", s);
    return std::string();
  });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

}  // namespace
}  // namespace loomtest
