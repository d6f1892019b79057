// Chaos: 4 ranks (processes) reduce in a loop; a random victim is SIGKILLed at a random
// moment (during init, mid-collective, between calls, during teardown). Every survivor
// must return (an error or success) promptly, never hang, crash or see a wrong result,
// and the job must leave no shared-memory names behind.
#include <dirent.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/late_id.h"

namespace {

int64_t monoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

std::set<std::string> shmNames() {
  std::set<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (strncmp(e->d_name, "loom-", 5) == 0) out.insert(e->d_name);
    closedir(d);
  }
  return out;
}

// What a survivor reports through its pipe.
struct Report {
  int status;       // 0 finished cleanly, 1 returned an error, 2 saw a wrong result
  int64_t errorNs;  // when the failing call returned
  char msg[512];
};

void runRank(const ncclUniqueId& id, int rank, int nranks, unsigned seed, int fd) {
  Report rep{};
  ncclComm_t comm = nullptr;
  std::mt19937 rng(seed * 31 + rank);
  if (ncclCommInitRank(&comm, nranks, id, rank) != ncclSuccess) {
    rep.status = 1;
    rep.errorNs = monoNs();
    snprintf(rep.msg, sizeof(rep.msg), "init: %s", ncclGetLastError(nullptr));
  } else {
    std::vector<float> buf;
    for (int it = 0; it < 40 && rep.status == 0; ++it) {
      // Everyone draws the same sizes (seeded by trial): the collective must match.
      std::mt19937 shared(seed * 1000 + it);
      size_t count = size_t(1) << (shared() % 19);
      buf.assign(count, float(rank + 1));
      if (ncclAllReduce(buf.data(), buf.data(), count, ncclFloat, ncclSum, comm, nullptr) !=
          ncclSuccess) {
        rep.status = 1;
        rep.errorNs = monoNs();
        snprintf(rep.msg, sizeof(rep.msg), "allreduce: %s", ncclGetLastError(comm));
        break;
      }
      float want = float(nranks * (nranks + 1) / 2);
      for (size_t i = 0; i < count; ++i)
        if (buf[i] != want) {
          rep.status = 2;
          snprintf(rep.msg, sizeof(rep.msg), "iteration %d element %zu: %f != %f", it, i,
                   buf[i], want);
          break;
        }
    }
    (void)rng;
    ncclCommDestroy(comm);
  }
  if (write(fd, &rep, sizeof(rep)) < 0) {}
  _exit(0);
}

TEST(Chaos, RandomVictimKilledAtRandomMoment) {
  const int trials = getenv("LOOM_CHAOS_TRIALS") ? atoi(getenv("LOOM_CHAOS_TRIALS")) : 50;
  // A victim killed before it ever reached the rendezvous cannot be told apart from a rank
  // that starts late: survivors then wait for the rendezvous time-out, which this test
  // lowers below its 15 s hang limit. Every other failure is detected by Loom itself.
  setenv("LOOM_BOOTSTRAP_TIMEOUT", "8", 1);
  const int nranks = 4;
  const int64_t hangNs = 15ll * 1000000000;  // issue 6: errors within 10 s; 15 s is a hang
  int hangs = 0, crashes = 0, wrong = 0, leftovers = 0, errored = 0, unjoined = 0;
  int64_t worstNs = 0, worstUnjoinedNs = 0;
  std::mt19937 rng(12345);
  for (int trial = 0; trial < trials; ++trial) {
    unsigned seed = rng();
    int victim = static_cast<int>(rng() % nranks);
    int delayUs = static_cast<int>(rng() % 400000);
    // Made after the forks (core/late_id.h says why), read by the ranks from shared memory.
    loomtest::LateId id;
    std::vector<pid_t> pids(nranks);
    std::vector<int> fds(nranks);
    for (int r = 0; r < nranks; ++r) {
      int p[2];
      ASSERT_EQ(pipe(p), 0);
      fflush(nullptr);
      pid_t pid = fork();
      if (pid == 0) {
        close(p[0]);
        runRank(id, r, nranks, seed, p[1]);
      }
      close(p[1]);
      pids[r] = pid;
      fds[r] = p[0];
    }
    ASSERT_EQ(id.make(), ncclSuccess) << id.why();
    usleep(delayUs);
    // Stamped before the kill: the victim may die, and a survivor see it, before kill()
    // returns to this process (preempted on a busy machine: seen in CI as "failed before
    // the victim died").
    int64_t killNs = monoNs();
    kill(pids[victim], SIGKILL);
    waitpid(pids[victim], nullptr, 0);
    // Detection times of this trial's survivors, and whether the victim died before it
    // reached the rendezvous (then only the rendezvous time-out can end the wait).
    int64_t trialWorstNs = 0;
    bool neverJoined = false;
    for (int r = 0; r < nranks; ++r) {
      if (r == victim) {
        close(fds[r]);
        continue;
      }
      int status = 0;
      bool done = false;
      while (!done) {
        pid_t w = waitpid(pids[r], &status, WNOHANG);
        if (w == pids[r]) break;
        if (monoNs() - killNs > hangNs) {
          ++hangs;
          ADD_FAILURE() << "trial " << trial << ": rank " << r << " hung (victim " << victim
                        << ", killed after " << delayUs << " us)";
          kill(pids[r], SIGKILL);
          waitpid(pids[r], &status, 0);
          done = true;
        }
        usleep(1000);
      }
      Report rep{};
      ssize_t n = read(fds[r], &rep, sizeof(rep));
      close(fds[r]);
      if (done) continue;
      if (!WIFEXITED(status) || n != sizeof(rep)) {
        ++crashes;
        ADD_FAILURE() << "trial " << trial << ": rank " << r << " crashed (status " << status
                      << ")";
        continue;
      }
      if (rep.status == 2) {
        ++wrong;
        ADD_FAILURE() << "trial " << trial << ": rank " << r << " wrong result: " << rep.msg;
      }
      if (rep.status == 1) {
        ++errored;
        // An error raised before the kill would be a spurious failure.
        if (rep.errorNs < killNs) {
          ++wrong;
          ADD_FAILURE() << "trial " << trial << ": rank " << r
                        << " failed before the victim died: " << rep.msg;
        } else {
          trialWorstNs = std::max(trialWorstNs, rep.errorNs - killNs);
          neverJoined |= strstr(rep.msg, "LOOM_BOOTSTRAP_TIMEOUT") != nullptr;
        }
      }
    }
    if (neverJoined) {
      ++unjoined;
      worstUnjoinedNs = std::max(worstUnjoinedNs, trialWorstNs);
    } else {
      worstNs = std::max(worstNs, trialWorstNs);
    }
    // Names are unlinked as soon as both ends map them: none may outlive the job. Other
    // suites create short-lived names too, so only names that persist count.
    // Only this trial's names count (they carry their creator's pid): other suites may
    // run alongside.
    auto ours = [&](const std::string& name) {
      for (pid_t p : pids)
        if (name.find("-" + std::to_string(p) + "-") != std::string::npos) return true;
      return false;
    };
    std::set<std::string> after;
    for (const auto& name : shmNames())
      if (ours(name)) after.insert(name);
    if (!after.empty()) {
      usleep(1500000);
      for (const auto& name : shmNames())
        if (after.count(name)) {
          ++leftovers;
          ADD_FAILURE() << "trial " << trial << ": /dev/shm/" << name << " left behind";
        }
    }
  }
  // worst_detection_ms: victims that had joined; victims killed before the rendezvous are
  // counted apart, found by LOOM_BOOTSTRAP_TIMEOUT (8 s here, 120 s by default).
  printf("chaos: trials=%d survivors_with_error=%d hangs=%d crashes=%d wrong=%d leftovers=%d "
         "worst_detection_ms=%.1f killed_before_rendezvous=%d (ended by the rendezvous "
         "time-out after %.1f ms)\n",
         trials, errored, hangs, crashes, wrong, leftovers, worstNs / 1e6, unjoined,
         worstUnjoinedNs / 1e6);
  EXPECT_EQ(hangs, 0);
  EXPECT_EQ(crashes, 0);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(leftovers, 0);
  EXPECT_LT(worstNs, 10ll * 1000000000);
}

}  // namespace
