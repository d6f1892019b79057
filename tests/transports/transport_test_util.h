// Shared by the transport suites: a workload whose every result is checked exactly, and a
// fixture whose ranks log INIT to files of their own so that a test can read which
// transport each rank chose for each peer (the "Init COMPLETE" line lists them).
#pragma once

#include <dirent.h>
#include <nccl.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "base/log.h"
#include "core/core_util.h"

namespace loomtest {

// An all-reduce at sizes from one element to several FIFO slots, an all-gather and a ring
// exchange, each checked exactly.
inline std::string exercise(int rank, int nranks, ncclComm_t comm) {
  for (size_t count : {size_t{1}, size_t{4097}, size_t{1} << 20}) {
    std::vector<int32_t> in(count), out(count, -1);
    for (size_t i = 0; i < count; ++i) in[i] = (rank + 1) * static_cast<int32_t>(i % 1000);
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), count, ncclInt32, ncclSum, comm, nullptr));
    int32_t f = nranks * (nranks + 1) / 2;
    for (size_t i = 0; i < count; ++i)
      RANK_CHECK(out[i] == f * static_cast<int32_t>(i % 1000), "all-reduce count %zu: [%zu] = %d",
                 count, i, out[i]);
  }
  const size_t per = 70001;
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

// Ranks log INIT to files in a directory of their own; initLines() reads back each
// rank's "Init COMPLETE" line (it lists "peer:transport" for every connected peer).
class TransportLogTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "loom_transports_" + std::to_string(getpid()) + "_" +
           testing::UnitTest::GetInstance()->current_test_info()->name();
    mkdir(dir_.c_str(), 0700);
    logFile_ = dir_ + "/log.%p";
    debug_.emplace("NCCL_DEBUG", "INFO");
    subsys_.emplace("NCCL_DEBUG_SUBSYS", "INIT");
    file_.emplace("NCCL_DEBUG_FILE", logFile_.c_str());
    loom::logReset();
  }
  void TearDown() override {
    debug_.reset();
    subsys_.reset();
    file_.reset();
    loom::logReset();
    clearLogs();
    rmdir(dir_.c_str());
  }

  // Removes the logs so far; this process's next line starts a new file.
  void clearLogs() {
    if (DIR* d = opendir(dir_.c_str())) {
      while (dirent* e = readdir(d))
        if (e->d_name[0] != '.') unlink((dir_ + "/" + e->d_name).c_str());
      closedir(d);
    }
    loom::logReset();
  }

  // Every line the ranks logged so far.
  std::string logs() {
    std::string all;
    if (DIR* d = opendir(dir_.c_str())) {
      while (dirent* e = readdir(d)) {
        if (strncmp(e->d_name, "log.", 4) != 0) continue;
        std::ifstream in(dir_ + "/" + e->d_name);
        std::stringstream s;
        s << in.rdbuf();
        all += s.str();
      }
      closedir(d);
    }
    return all;
  }

  // The lines of logs() that contain `what`.
  std::vector<std::string> logLines(const std::string& what) {
    std::vector<std::string> out;
    std::stringstream in(logs());
    std::string line;
    while (std::getline(in, line))
      if (line.find(what) != std::string::npos) out.push_back(line);
    return out;
  }

  // Rails: local rank r % 2 of ranks on hosts of two received on `devs[r % 2]` (the
  // device names as the backend calls them) on connection 0.
  void expectRails(int nranks, const std::string& dev0, const std::string& dev1) {
    for (int r = 0; r < nranks; ++r) {
      std::string dev = (r % 2 ? dev1 : dev0) + ", rail " + std::to_string(r % 2) + " of 2";
      auto lines = logLines("rank " + std::to_string(r) + " receives from rank ");
      bool found = false;
      for (const std::string& line : lines) {
        if (line.find("(connection 0)") == std::string::npos) continue;
        found = true;
        EXPECT_NE(line.find(dev), std::string::npos) << "local rank " << r % 2 << ": " << line;
      }
      EXPECT_TRUE(found) << "rank " << r << " logged no network receive on connection 0:\n" << logs();
    }
  }

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

  // Rank r's INIT line names `want(r, peer)` for both ring neighbours.
  void expectRingTransports(int n, const std::function<std::string(int, int)>& want) {
    auto lines = initLines();
    ASSERT_EQ(static_cast<int>(lines.size()), n) << "expected one Init COMPLETE line per rank";
    for (int r = 0; r < n; ++r)
      for (int peer : {(r + 1) % n, (r + n - 1) % n}) {
        if (peer == r) continue;
        std::string entry = std::to_string(peer) + ":" + want(r, peer);
        EXPECT_NE(lines[r].find(entry), std::string::npos)
            << "rank " << r << " should reach rank " << peer << " as '" << entry << "': " << lines[r];
      }
  }

  // Ranks as processes log to files of their own, not to the one they inherited from the
  // test process; `env(rank)` may set a rank's environment first.
  static RankOptions processRanks(std::function<void(int rank)> env = nullptr) {
    RankOptions o;
    o.timeoutSec = 60;
    o.beforeInit = [env](int rank) {
      if (env) env(rank);
      loom::logReset();
    };
    return o;
  }

  std::string dir_;
  std::string logFile_;
  std::optional<EnvGuard> debug_, subsys_, file_;
  EnvGuard stallLimit_{"LOOM_TIMEOUT", "60"};
};

// A rank SIGKILLs itself in the middle of a stream of all-reduces: the others fail with
// ncclRemoteError within seconds, naming a peer, and never hang.
template <typename Options>
inline void killedPeerFailsTheOthers(const std::string& backend, Options ranks) {
  const int n = 3, victim = 1;
  auto body = [backend](int rank, int nranks, ncclComm_t comm) -> std::string {
    std::vector<float> v(1 << 16);
    for (int it = 0; it < 100000; ++it) {
      if (rank == victim && it == 5) raise(SIGKILL);
      std::fill(v.begin(), v.end(), 1.0f);
      auto t0 = std::chrono::steady_clock::now();
      ncclResult_t rc = ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, comm, nullptr);
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rc == ncclSuccess) {
        RANK_CHECK(v[0] == nranks && v.back() == nranks, "iteration %d: %g", it, v[0]);
        continue;
      }
      std::string msg = ncclGetLastError(comm);
      RANK_CHECK(rc == ncclRemoteError, "%s: %s", ncclGetErrorString(rc), msg.c_str());
      RANK_CHECK(sec < 10, "the failure took %.1f s: %s", sec, msg.c_str());
      RANK_CHECK(msg.find("via net/" + backend) != std::string::npos, "no peer named: %s",
                 msg.c_str());
      return "";
    }
    return "the victim's death went unnoticed";
  };
  auto f = runRanks(Mode::kProcesses, n, body, ranks);
  ASSERT_EQ(f.size(), 1u) << joinFailures(f);
  EXPECT_EQ(f[0].rfind("rank 1: ", 0), 0u) << "only the victim should fail: " << f[0];
}

}  // namespace loomtest
