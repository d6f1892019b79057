// Runs a function as N ranks of one communicator: as threads of this process, or as
// forked processes. Each rank returns an error string ("" = success); the harness
// reports every failing rank and bounds the whole run by a timeout, so a hang fails the
// test instead of stalling the suite. The ranks start first and the unique id is made
// afterwards (core/late_id.h): no rank is forked while the root's thread runs.
#pragma once

#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "core/late_id.h"

namespace loomtest {

enum class Mode { kThreads, kProcesses };
inline const char* modeName(Mode m) { return m == Mode::kThreads ? "threads" : "processes"; }

using RankFn = std::function<std::string(int rank, int nranks, ncclComm_t comm)>;
// A rank body that makes its own communicator(s), or none.
using RawFn = std::function<std::string(int rank, int nranks)>;

#define RANK_CHECK(cond, ...)                                                  \
  do {                                                                         \
    if (!(cond)) {                                                             \
      char buf_[512];                                                          \
      snprintf(buf_, sizeof(buf_), __VA_ARGS__);                               \
      return std::string(#cond ": ") + buf_;                                   \
    }                                                                          \
  } while (0)
#define RANK_NCCL(call)                                                               \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    if (r_ != ncclSuccess)                                                            \
      return std::string(#call " -> ") + ncclGetErrorString(r_) + ": " + ncclGetLastError(nullptr); \
  } while (0)
// Propagates a helper's failure string.
#define RANK_TRY(expr)                     \
  do {                                     \
    std::string e_ = (expr);               \
    if (!e_.empty()) return e_;            \
  } while (0)

// Whether a rank's failure message came from a failed call (RANK_NCCL) rather than from a
// data check (RANK_CHECK).
inline bool isCallFailure(const std::string& e) { return e.find(") -> ") != std::string::npos; }
// For a sequence of collectives: a data-check failure is remembered in `first` and the rank
// carries on, so that its peers are not left waiting for calls it would skip; a failed
// call ends the rank at once.
#define RANK_CONTINUE(first, expr)                      \
  do {                                                  \
    std::string e_ = (expr);                            \
    if (!e_.empty() && (first).empty()) (first) = e_;   \
    if (!e_.empty() && isCallFailure(e_)) return first; \
  } while (0)

// One rank: init, run fn, destroy. Returns "" on success.
inline std::string runRank(const ncclUniqueId& id, int rank, int nranks, const RankFn& fn) {
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  if (r != ncclSuccess)
    return std::string("ncclCommInitRank: ") + ncclGetErrorString(r) + ": " + ncclGetLastError(nullptr);
  std::string err = fn(rank, nranks, comm);
  ncclResult_t d = ncclCommDestroy(comm);
  if (err.empty() && d != ncclSuccess) err = "ncclCommDestroy failed";
  return err;
}

// fn(rank, nranks) with an escaping exception turned into a failure message: in a forked
// rank it would otherwise unwind into the test framework's copy in the child.
inline std::string callRank(const RawFn& fn, int rank, int nranks) {
  try {
    return fn(rank, nranks);
  } catch (const std::exception& e) {
    return std::string("exception: ") + e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// Runs fn(rank, nranks) for every rank, as threads or forked processes, and returns one
// message per failing rank ("rank R: ..."); empty when all succeeded. afterStart, when
// given, runs in the test process once every rank has started (after the last fork): what
// starts a thread, such as ncclGetUniqueId, belongs there (LateId, makeId). What it
// returns, unless "", is reported as the test process's failure.
inline std::vector<std::string> runEach(Mode mode, int nranks, const RawFn& fn,
                                        int timeoutSec = 120,
                                        const std::function<std::string()>& afterStart = {}) {
  std::vector<std::string> failures;
  auto started = [&] {
    std::string e = afterStart ? afterStart() : "";
    if (!e.empty()) failures.push_back("test process: " + e);
  };
  if (mode == Mode::kThreads) {
    std::vector<std::future<std::string>> futs;
    for (int r = 0; r < nranks; ++r)
      futs.push_back(std::async(std::launch::async, [&, r] { return callRank(fn, r, nranks); }));
    started();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSec);
    for (int r = 0; r < nranks; ++r) {
      if (futs[r].wait_until(deadline) != std::future_status::ready) {
        fprintf(stderr, "rank %d (thread) hung for %d s; aborting the test binary\n", r, timeoutSec);
        fflush(stderr);
        _exit(3);  // a hung thread cannot be cancelled safely
      }
      std::string e = futs[r].get();
      if (!e.empty()) failures.push_back("rank " + std::to_string(r) + ": " + e);
    }
    return failures;
  }
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (int r = 0; r < nranks; ++r) {
    int fds[2];
    if (pipe(fds) != 0) return {"pipe failed"};
    fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      std::string e = callRank(fn, r, nranks);
      if (write(fds[1], e.data(), e.size()) < 0) {}
      _exit(e.empty() ? 0 : 1);
    }
    close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  started();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSec);
  for (int r = 0; r < nranks; ++r) {
    int status = 0;
    for (;;) {
      pid_t w = waitpid(pids[r], &status, WNOHANG);
      if (w == pids[r]) break;
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids) kill(p, SIGKILL);
        waitpid(pids[r], &status, 0);
        failures.push_back("rank " + std::to_string(r) + ": hung (killed after timeout)");
        status = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::string msg;
    char buf[4096];
    ssize_t n;
    while ((n = read(pipes[r], buf, sizeof(buf))) > 0) msg.append(buf, n);
    close(pipes[r]);
    if (status == -1) continue;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      failures.push_back("rank " + std::to_string(r) + ": " +
                         (msg.empty() ? "exited abnormally (status " + std::to_string(status) + ")" : msg));
  }
  return failures;
}

struct RankOptions {
  int timeoutSec = 120;
  // Runs in the rank (its thread, or its process after the fork) before ncclCommInitRank,
  // e.g. to set per-process environment variables.
  std::function<void(int rank)> beforeInit;
  // The id to join; null: a fresh one from ncclGetUniqueId, made once the ranks started.
  const ncclUniqueId* id = nullptr;
};

inline std::vector<std::string> runRanks(Mode mode, int nranks, const RankFn& fn,
                                         const RankOptions& opt) {
  LateId late;
  return runEach(
      mode, nranks,
      [&](int rank, int n) {
        ncclUniqueId id;
        if (opt.id) {
          id = *opt.id;
        } else {
          RANK_TRY(late.wait(&id));
        }
        if (opt.beforeInit) opt.beforeInit(rank);
        return runRank(id, rank, n, fn);
      },
      opt.timeoutSec, [&] { return opt.id ? std::string() : makeId(late); });
}

// Returns one message per failing rank ("rank R: ..."); empty when all succeeded.
inline std::vector<std::string> runRanks(Mode mode, int nranks, const RankFn& fn,
                                         int timeoutSec = 120) {
  RankOptions opt;
  opt.timeoutSec = timeoutSec;
  return runRanks(mode, nranks, fn, opt);
}

inline std::string joinFailures(const std::vector<std::string>& f) {
  std::string s;
  for (const auto& x : f) s += x + "\n";
  return s;
}

}  // namespace loomtest
