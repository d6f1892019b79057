// Transport selection and the TCP transport between "hosts": ranks given distinct
// LOOM_HOSTID values look like separate machines and must use sockets (as the INIT log
// says), at several sizes and stream counts; ranks sharing a host id use shared memory;
// nothing is left in /dev/shm afterwards.
#include <dirent.h>
#include <nccl.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "core/core_util.h"

namespace loomtest {
namespace {

std::set<std::string> loomShmNames() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (strncmp(e->d_name, "loom-", 5) == 0) names.insert(e->d_name);
    closedir(d);
  }
  return names;
}

// Checks an all-reduce, an all-gather and a ring exchange at a few sizes.
std::string exercise(int rank, int nranks, ncclComm_t comm) {
  for (size_t count : {size_t{1}, size_t{4097}, size_t{262147}, size_t{1} << 20}) {
    std::vector<float> in(count), out(count, -1);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((rank + 1) * (i % 512));
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), count, ncclFloat, ncclSum, comm, nullptr));
    float f = static_cast<float>(nranks * (nranks + 1) / 2);
    for (size_t i = 0; i < count; ++i)
      RANK_CHECK(out[i] == f * (i % 512), "all-reduce count %zu: [%zu] = %g", count, i, out[i]);
  }
  const size_t per = 100003;
  std::vector<int32_t> mine(per), all(per * nranks, -1);
  for (size_t i = 0; i < per; ++i) mine[i] = rank * 1000000 + static_cast<int32_t>(i);
  RANK_NCCL(ncclAllGather(mine.data(), all.data(), per, ncclInt32, comm, nullptr));
  for (int r = 0; r < nranks; ++r)
    for (size_t i = 0; i < per; ++i)
      RANK_CHECK(all[r * per + i] == r * 1000000 + static_cast<int32_t>(i),
                 "all-gather block %d [%zu] = %d", r, i, all[r * per + i]);
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  std::vector<int32_t> got(per, -1);
  RANK_NCCL(ncclGroupStart());
  RANK_NCCL(ncclSend(mine.data(), per, ncclInt32, next, comm, nullptr));
  RANK_NCCL(ncclRecv(got.data(), per, ncclInt32, prev, comm, nullptr));
  RANK_NCCL(ncclGroupEnd());
  for (size_t i = 0; i < per; ++i)
    RANK_CHECK(got[i] == prev * 1000000 + static_cast<int32_t>(i), "recv [%zu] = %d", i, got[i]);
  return "";
}

class CoreTransport : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "loom_transport_" + std::to_string(getpid()) + "_" +
           testing::UnitTest::GetInstance()->current_test_info()->name();
    mkdir(dir_.c_str(), 0700);
    shmBefore_ = loomShmNames();
  }
  void TearDown() override {
    if (DIR* d = opendir(dir_.c_str())) {
      while (dirent* e = readdir(d))
        if (e->d_name[0] != '.') unlink((dir_ + "/" + e->d_name).c_str());
      closedir(d);
    }
    rmdir(dir_.c_str());
  }

  // Runs `nranks` processes; rank r gets LOOM_HOSTID=hosts[r] and an INFO log of its own.
  void runLogged(const std::vector<std::string>& hosts, const RankFn& fn) {
    RankOptions opt;
    std::string logPattern = dir_ + "/log.%p";
    opt.beforeInit = [&](int rank) {
      setenv("LOOM_HOSTID", hosts[rank].c_str(), 1);
      setenv("NCCL_DEBUG", "INFO", 1);
      setenv("NCCL_DEBUG_SUBSYS", "INIT", 1);
      setenv("NCCL_DEBUG_FILE", logPattern.c_str(), 1);
      loom::logReset();  // the parent's log settings came along with the fork
    };
    auto f = runRanks(Mode::kProcesses, static_cast<int>(hosts.size()), fn, opt);
    EXPECT_TRUE(f.empty()) << joinFailures(f);
  }

  // Every log line of every rank that contains `what`.
  std::vector<std::string> logLines(const std::string& what) {
    std::vector<std::string> out;
    if (DIR* d = opendir(dir_.c_str())) {
      while (dirent* e = readdir(d)) {
        if (strncmp(e->d_name, "log.", 4) != 0) continue;
        std::ifstream in(dir_ + "/" + e->d_name);
        for (std::string line; std::getline(in, line);)
          if (line.find(what) != std::string::npos) out.push_back(line);
      }
      closedir(d);
    }
    return out;
  }

  // rank -> its "Init COMPLETE" line, from every log file in the directory.
  std::map<int, std::string> initLines() {
    std::map<int, std::string> lines;
    if (DIR* d = opendir(dir_.c_str())) {
      while (dirent* e = readdir(d)) {
        if (strncmp(e->d_name, "log.", 4) != 0) continue;
        std::ifstream in(dir_ + "/" + e->d_name);
        std::string line;
        while (std::getline(in, line)) {
          size_t at = line.find(" rank ");
          if (line.find("Init COMPLETE") == std::string::npos || at == std::string::npos) continue;
          lines[atoi(line.c_str() + at + 6)] = line;
        }
      }
      closedir(d);
    }
    return lines;
  }

  // Each rank's INIT line names the transport to its ring neighbours: same host id ->
  // shm, different -> socket.
  void expectTransports(const std::vector<std::string>& hosts) {
    int n = static_cast<int>(hosts.size());
    auto lines = initLines();
    ASSERT_EQ(static_cast<int>(lines.size()), n) << "expected one Init COMPLETE line per rank";
    for (int r = 0; r < n; ++r) {
      const std::string& line = lines[r];
      for (int peer : {(r + 1) % n, (r + n - 1) % n}) {
        if (peer == r) continue;
        std::string want = std::to_string(peer) + ":" + (hosts[peer] == hosts[r] ? "shm" : "socket");
        EXPECT_NE(line.find(want), std::string::npos)
            << "rank " << r << " should reach rank " << peer << " as '" << want << "': " << line;
      }
    }
  }

  // Other jobs on this machine may create (and promptly unlink) loom-* names of their own
  // while this test runs: only a new name that is still there 2 s later counts as a leak.
  void expectNoShmLeft() {
    std::vector<std::string> left;
    for (int attempt = 0; attempt < 20; ++attempt) {
      left.clear();
      for (const auto& n : loomShmNames())
        if (!shmBefore_.count(n)) left.push_back(n);
      if (left.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << (left.empty() ? "" : left.front());
  }

  std::string dir_;
  std::set<std::string> shmBefore_;
  EnvGuard stallLimit_{"LOOM_TIMEOUT", "60"};
};

TEST_F(CoreTransport, EveryRankItsOwnHost) {
  std::vector<std::string> hosts = {"hostA", "hostB", "hostC", "hostD"};
  runLogged(hosts, exercise);
  expectTransports(hosts);
  expectNoShmLeft();
}

TEST_F(CoreTransport, TwoHostsOfTwoRanks) {
  std::vector<std::string> hosts = {"left", "left", "right", "right"};
  runLogged(hosts, exercise);
  expectTransports(hosts);
  expectNoShmLeft();
}

TEST_F(CoreTransport, OneHostUsesShm) {
  std::vector<std::string> hosts = {"same", "same", "same"};
  runLogged(hosts, exercise);
  expectTransports(hosts);
  expectNoShmLeft();
}

TEST_F(CoreTransport, OneStreamAndFourStreams) {
  for (const char* streams : {"1", "4"}) {
    EnvGuard env("LOOM_SOCKET_NSTREAMS", streams);
    std::vector<std::string> hosts = {"h0", "h1", "h2"};
    runLogged(hosts, exercise);
    expectTransports(hosts);
  }
  expectNoShmLeft();
}

// NCCL's NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD set the streams per connection where
// LOOM_SOCKET_NSTREAMS does not: 2 x 3 = 6, logged by every sender; LOOM_SOCKET_NSTREAMS
// wins; values beyond NCCL's limits are clamped as NCCL clamps them, with a warning.
TEST_F(CoreTransport, NcclSocketThreadsTimesSocketsPerThreadAreTheStreams) {
  EnvGuard t("NCCL_SOCKET_NTHREADS", "2"), s("NCCL_NSOCKS_PERTHREAD", "3"), n("LOOM_SOCKET_NSTREAMS", nullptr);
  std::vector<std::string> hosts = {"h0", "h1", "h2"};
  runLogged(hosts, exercise);
  std::vector<std::string> six = logLines("over 6 TCP streams");
  EXPECT_GE(six.size(), 3u) << "each rank sends to its ring neighbour over 6 streams";
  EXPECT_TRUE(logLines("over 2 TCP streams").empty());
  {
    EnvGuard loom("LOOM_SOCKET_NSTREAMS", "1");
    runLogged(hosts, exercise);
    EXPECT_EQ(logLines("over 6 TCP streams").size(), six.size()) << "LOOM_SOCKET_NSTREAMS=1 lost";
    EXPECT_GE(logLines("over 1 TCP streams").size(), 3u);
  }
  // Beyond NCCL's limits (64 sockets), clamped as NCCL clamps: 2 x 32.
  EnvGuard tooMany("NCCL_NSOCKS_PERTHREAD", "33");
  runLogged(hosts, exercise);
  EXPECT_GE(logLines("over 64 TCP streams").size(), 3u);
  EXPECT_FALSE(logLines("NCCL_SOCKET_NTHREADS=2 x NCCL_NSOCKS_PERTHREAD=33: using 2 x 32").empty());
}

TEST_F(CoreTransport, BadStreamCountIsReported) {
  EnvGuard env("LOOM_SOCKET_NSTREAMS", "0");
  EnvGuard shmOff("NCCL_SHM_DISABLE", "1");
  auto f = runRanks(Mode::kThreads, 2, [](int, int, ncclComm_t) { return std::string(); }, 60);
  ASSERT_FALSE(f.empty()) << "LOOM_SOCKET_NSTREAMS=0 was accepted";
  EXPECT_NE(f[0].find("LOOM_SOCKET_NSTREAMS"), std::string::npos) << joinFailures(f);
}

// Threads of one process over shm and over TCP: nothing named is left behind either.
TEST_F(CoreTransport, ThreadsLeaveNoShm) {
  for (const char* off : {"0", "1"}) {
    EnvGuard env("NCCL_SHM_DISABLE", off);
    auto f = runRanks(Mode::kThreads, 4, exercise);
    EXPECT_TRUE(f.empty()) << "NCCL_SHM_DISABLE=" << off << ": " << joinFailures(f);
  }
  expectNoShmLeft();
}

}  // namespace
}  // namespace loomtest
