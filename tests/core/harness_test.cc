// The multi-rank harness itself (rank_harness.h, late_id.h): every rank is started before
// the test process runs anything that starts a thread (the unique id, made by afterStart),
// and a unique id that cannot be made is reported by every rank, not waited for.
#include <dirent.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "core/core_util.h"

namespace loomtest {
namespace {

// How many processes have `pid` as their parent (from /proc/<n>/stat's fourth field).
int childrenOf(pid_t pid) {
  int n = 0;
  DIR* d = opendir("/proc");
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;  // gone meanwhile
    size_t close = line.rfind(')');           // the command name may hold spaces
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == pid) ++n;
  }
  closedir(d);
  return n;
}

TEST(RankHarness, AfterStartRunsOnceEveryRankIsForked) {
  const int nranks = 3;
  SharedBoard<std::atomic<int>> go;  // ranks stay alive until afterStart has looked
  int forked = -1;
  auto f = runEach(
      Mode::kProcesses, nranks,
      [&](int rank, int) {
        auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (go->load() == 0) {
          RANK_CHECK(std::chrono::steady_clock::now() < end, "afterStart never ran");
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return std::string();
      },
      90,
      [&] {
        forked = childrenOf(getpid());
        go->store(1);
        return std::string();
      });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
  EXPECT_EQ(forked, nranks) << "afterStart (where the unique id is made) ran before every "
                               "rank was forked";
}

TEST(RankHarness, AfterStartFailureIsReported) {
  for (Mode mode : {Mode::kThreads, Mode::kProcesses}) {
    auto f = runEach(mode, 2, [](int, int) { return std::string(); }, 60,
                     [] { return std::string("no id today"); });
    ASSERT_EQ(f.size(), 1u) << modeName(mode) << ": " << joinFailures(f);
    EXPECT_EQ(f[0], "test process: no id today") << modeName(mode);
  }
}

// The id is made after the ranks started, so a failure to make it must reach the ranks
// waiting for it (at once, not after their wait times out) and name the cause.
TEST(RankHarness, UniqueIdFailureReachesEveryRank) {
  EnvGuard bogus("NCCL_SOCKET_IFNAME", "doesnotexist");
  for (Mode mode : {Mode::kThreads, Mode::kProcesses}) {
    auto t0 = std::chrono::steady_clock::now();
    auto f = runRanks(mode, 3, [](int, int, ncclComm_t) { return std::string("ran without an id"); },
                      60);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20)) << modeName(mode);
    ASSERT_EQ(f.size(), 4u) << modeName(mode) << ": " << joinFailures(f);  // 3 ranks + the test
    for (const std::string& e : f) {
      EXPECT_NE(e.find("ncclGetUniqueId"), std::string::npos) << modeName(mode) << ": " << e;
      EXPECT_NE(e.find("NCCL_SOCKET_IFNAME"), std::string::npos) << modeName(mode) << ": " << e;
    }
  }
}

}  // namespace
}  // namespace loomtest
