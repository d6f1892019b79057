// A rank stopped (SIGSTOP) in the middle of an all-reduce: the survivors time out
// (LOOM_TIMEOUT=3) and their errors name the stopped rank and the operation, found by
// asking every rank where it is; each survivor's flight recorder lands in LOOM_DUMP_DIR and
// loom-postmortem, given those dumps, names the stopped rank and the operation too. Nothing
// hangs. Four ranks as processes, over shared memory and then over TCP.
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/core_util.h"
#include "core/late_id.h"
#include "diag/diag_util.h"
#include "fault/fault_util.h"

namespace loomtest {
namespace {

using namespace fault;

constexpr int kRanks = 4;
constexpr int kVictim = 2;
constexpr int kOps = 5;  // completed before the stall; the stalled one is #6
constexpr size_t kBigCount = 32u << 20;  // 128 MiB of floats: long enough to stop it mid-way

struct Board {
  RankSlot ranks[kRanks];
};

// A fresh directory, removed with its files afterwards.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/loom-diag-XXXXXX";
    path_ = mkdtemp(tmpl) ? tmpl : "/tmp";
  }
  ~TempDir() {
    for (const std::string& f : dirEntries(path_)) unlink((path_ + "/" + f).c_str());
    rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

enum Stage { kInCall = 1, kFinished = 2 };

std::string stallRank(const ncclUniqueId& id, int rank, Board* b) {
  RankSlot& me = b->ranks[rank];
  ncclComm_t comm = nullptr;
  RANK_CHECK(ncclCommInitRank(&comm, kRanks, id, rank) == ncclSuccess, "init: %s",
             ncclGetLastError(nullptr));
  std::vector<float> v(kBigCount);
  for (int it = 0; it < kOps; ++it) {
    for (size_t i = 0; i < 1024; ++i) v[i] = static_cast<float>(rank + it);
    RANK_CHECK(ncclAllReduce(v.data(), v.data(), 1024, ncclFloat32, ncclSum, comm, nullptr) ==
                   ncclSuccess, "op %d: %s", it, ncclGetLastError(comm));
    RANK_CHECK(v[7] == static_cast<float>(6 + 4 * it), "op %d: %g", it, v[7]);
    me.iterations = it + 1;
  }
  for (auto& x : v) x = 1.0f;
  me.stage = kInCall;
  ncclResult_t rc = ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat32, ncclSum, comm, nullptr);
  if (rc != ncclSuccess) postError(me, rc, ncclGetLastError(comm));
  me.stage = kFinished;
  ncclCommAbort(comm);
  return "";
}

void stallAndDiagnose(bool tcp) {
  TempDir dumps;
  EnvGuard timeout("LOOM_TIMEOUT", "3");
  EnvGuard dir("LOOM_DUMP_DIR", dumps.path().c_str());
  EnvGuard shm("NCCL_SHM_DISABLE", tcp ? "1" : nullptr);
  SharedBoard<Board> b;
  LateId id;
  std::vector<Child> kids(kRanks);
  for (int r = 0; r < kRanks; ++r) kids[r] = forkChild([&, r] { return stallRank(id, r, &*b); });
  ASSERT_EQ(id.make(), ncclSuccess);
  ASSERT_TRUE(waitFor([&] {
    for (auto& s : b->ranks)
      if (s.stage.load() < kInCall) return false;
    return true;
  }, 60000)) << "the ranks never reached the big all-reduce";
  sleepMs(30);  // into the all-reduce
  ASSERT_EQ(kill(kids[kVictim].pid, SIGSTOP), 0);
  int64_t stopNs = monoNs();
  for (int r = 0; r < kRanks; ++r) {
    if (r == kVictim) continue;
    EXPECT_EQ(waitChild(kids[r], 60), "") << "rank " << r;
    const RankSlot& s = b->ranks[r];
    std::string msg = s.message;
    EXPECT_EQ(s.errorCode.load(), ncclRemoteError) << "rank " << r << ": " << msg;
    // LOOM_TIMEOUT (3 s), plus at most a second to ask the others, plus slack.
    EXPECT_LT(msBetween(stopNs, s.errorNs.load()), 7000) << "rank " << r;
    EXPECT_NE(msg.find("AllReduce #6"), std::string::npos) << "rank " << r << ": " << msg;
    std::string named = "job view: rank " + std::to_string(kVictim) +
                        " does not answer status queries (pid " + std::to_string(kids[kVictim].pid) +
                        " on this host is stopped";
    EXPECT_NE(msg.find(named), std::string::npos) << "rank " << r << ": " << msg;
    EXPECT_NE(msg.find("has not completed AllReduce #6"), std::string::npos) << msg;
    if (r == 0) printf("rank 0's error: %s\n", msg.c_str());
  }
  kill(kids[kVictim].pid, SIGKILL);
  reapKilled(kids[kVictim]);

  // Every survivor dumped its recorder on the failure; the stopped rank could not.
  std::vector<std::string> files;
  for (const std::string& f : dirEntries(dumps.path()))
    if (f.find(".jsonl") != std::string::npos) files.push_back(f);
  EXPECT_EQ(files.size(), static_cast<size_t>(kRanks - 1));
  std::string report = runTool(pythonTool("tools/loom-postmortem/loom-postmortem") + dumps.path());
  printf("loom-postmortem:\n%s", report.c_str());
  EXPECT_NE(report.find("no dump from rank(s) 2"), std::string::npos) << report;
  EXPECT_NE(report.find("verdict: rank 2 holds the job up in AllReduce #6 (134217728 bytes"),
            std::string::npos) << report;
  EXPECT_NE(report.find("wrote no dump"), std::string::npos) << report;
  // Each survivor's five completed all-reduces and the failed sixth are in its dump.
  for (int r = 0; r < kRanks; ++r) {
    if (r == kVictim) continue;
    EXPECT_NE(report.find("rank " + std::to_string(r) + " ("), std::string::npos) << report;
  }
  EXPECT_NE(report.find("completed #5; failed AllReduce #6"), std::string::npos) << report;
}

TEST(DiagStall, StoppedRankIsNamedBySurvivorsAndPostmortemOverShm) { stallAndDiagnose(false); }
TEST(DiagStall, StoppedRankIsNamedBySurvivorsAndPostmortemOverTcp) { stallAndDiagnose(true); }

}  // namespace
}  // namespace loomtest
