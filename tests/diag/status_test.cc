// loom-status on a live job: three ranks (threads, one communicator each) where rank 1
// does not call the fourth all-reduce while ranks 0 and 2 wait in it. The tool, given the
// job's LOOM_DUMP_DIR, lists every rank's last queued/started/completed operation and who
// waits on whom, and says rank 1 has not called AllReduce #4. A wrong key gets nothing.
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "core/core_util.h"
#include "diag/diag_util.h"
#include "fault/fault_util.h"

namespace loomtest {
namespace {

TEST(DiagStatus, LoomStatusNamesTheRankThatHasNotCalled) {
  char tmpl[] = "/tmp/loom-status-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  EnvGuard d("LOOM_DUMP_DIR", dir.c_str());
  constexpr int kRanks = 3;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::atomic<bool> release{false};
  std::atomic<int> ready{0}, done{0};
  std::vector<float> results(kRanks, 0);
  std::vector<std::thread> ranks;
  struct Release {  // a failed ASSERT still lets rank 1 go and joins every rank
    std::atomic<bool>& release;
    std::vector<std::thread>& ranks;
    ~Release() {
      release.store(true);
      for (auto& t : ranks)
        if (t.joinable()) t.join();
    }
  } guard{release, ranks};
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      ncclComm_t comm;
      if (ncclCommInitRank(&comm, kRanks, id, r) != ncclSuccess) return;
      std::vector<float> v(4096, 1.0f);
      for (int it = 0; it < 3; ++it)
        ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat32, ncclSum, comm, nullptr);
      ready.fetch_add(1);
      if (r == 1)
        while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat32, ncclSum, comm, nullptr);
      results[r] = v[100];
      done.fetch_add(1);
      ncclCommDestroy(comm);
    });
  ASSERT_TRUE(fault::waitFor([&] { return ready.load() == kRanks; }, 30000));
  fault::sleepMs(300);  // ranks 0 and 2 are waiting in #4 and have noted on whom
  const std::string tool = pythonTool("tools/loom-status/loom-status");
  int rc = -1;
  std::string out = runTool(tool + dir, &rc);
  printf("%s", out.c_str());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(": 3 ranks"), std::string::npos) << out;
  // Each rank's row, from the JSON: rank 1 completed #3 and is in nothing; 0 and 2 are in
  // #4 waiting to receive from rank 1.
  std::string rows = runTool(tool + dir + " --json | python3 -c 'import json,sys\n"
                         "for r in json.load(sys.stdin)[0][\"ranks\"]:\n"
                         " print(r[\"rank\"], r[\"last_queued\"], r[\"last_completed\"], r[\"current_seq\"],"
                         " r[\"waiting_on\"] if r[\"current_seq\"] else \"-\", r[\"idle_s\"] > 0.2)'");
  EXPECT_EQ(rows, "0 4 3 4 1 True\n1 3 3 0 - True\n2 4 3 4 1 True\n") << rows;
  EXPECT_NE(out.find("verdict: rank 1 has not called AllReduce #4: its last operation is #3"),
            std::string::npos) << out;
  EXPECT_NE(out.find("AllReduce #4 started"), std::string::npos) << out;
  std::string json = runTool(tool + dir + " --json");
  EXPECT_NE(json.find("\"last_completed\": 3"), std::string::npos) << json;
  EXPECT_NE(json.find("\"current_seq\": 4"), std::string::npos) << json;
  // A wrong key opens nothing.
  std::string status = runTool("cat " + dir + "/loom-*.status");
  size_t at = status.find("\"address\":\"");
  ASSERT_NE(at, std::string::npos) << status;
  std::string addr = status.substr(at + 11, status.find('"', at + 11) - at - 11);
  std::string bad = runTool(tool + addr + " --timeout 1 --key " + std::string(64, '0'), &rc);
  EXPECT_EQ(rc, 1) << bad;
  EXPECT_NE(bad.find("does not answer"), std::string::npos) << bad;
  EXPECT_EQ(runTool(tool + "--bogus", &rc).empty(), false);
  EXPECT_EQ(rc, 2);
  release.store(true);
  for (auto& t : ranks) t.join();
  EXPECT_EQ(done.load(), kRanks);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(results[r], 81.0f) << r;  // 3^4
  runTool("rm -rf " + dir);
}

}  // namespace
}  // namespace loomtest
