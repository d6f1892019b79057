// How this process's ranks were started, and how rank 0's rendezvous address reaches the
// others without linking MPI: Loom (like NCCL) honours NCCL_COMM_ID=<host>:<port>, so every
// process derives the same address from its launcher's environment and sets it:
//   NCCL_COMM_ID already set   used as is (any launcher)
//   --nranks N / -np N         the parent picks a free 127.0.0.1 port and forks N ranks
//   torchrun                   MASTER_ADDR : MASTER_PORT (+1 under the torchrun agent, whose
//                              own store already listens on MASTER_PORT)
//   srun                       first host of SLURM_STEP_NODELIST (127.0.0.1 on one node) :
//                              a port derived from SLURM_JOB_ID/SLURM_STEP_ID, or LOOM_BENCH_PORT
//   mpirun (Open MPI, MPICH)   rank 0 picks a free port and publishes host:port in a file
//                              keyed by the job id, in LOOM_BENCH_RENDEZVOUS_DIR (default
//                              $TMPDIR or /tmp; must be shared across nodes for multi-node)
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace loom::bench {

enum class LaunchKind { kStandalone, kForkChild, kTorchrun, kMpi, kSlurm };

struct Placement {
  LaunchKind kind = LaunchKind::kStandalone;
  int proc = 0;
  int nProcs = 1;
  int localRank = 0;
  int localSize = 1;
  std::string launcher;  // for the header: "mpirun (Open MPI)", "torchrun", ...
  // The rendezvous address every process agrees on ("" when it comes from a file exchange
  // or is not needed).
  std::string commId;
  bool fileExchange = false;
  std::string exchangeKey;  // job identity for the file exchange
};

using EnvFn = std::function<const char*(const char*)>;
EnvFn processEnv();

// Pure function of the environment (unit-tested). Throws BenchError(kInvalidUsage) on
// missing or inconsistent variables.
Placement detectPlacement(const EnvFn& env);

// "node[01-04,07],login" -> "node01"; "a,b" -> "a".
std::string firstSlurmHost(const std::string& nodelist);
// Port for srun jobs: stable for one job step, different across steps.
int slurmPort(long jobId, long stepId);
// "host:port", with [] around IPv6 literals.
std::string joinHostPort(const std::string& host, int port);
// The numeric address of `host` (IPv4 preferred); throws when it does not resolve.
std::string resolveHost(const std::string& host);
// A TCP port that was free on `ip` a moment ago.
int pickFreePort(const std::string& ip);

// Makes NCCL_COMM_ID hold the rendezvous address in this process. For the file exchange,
// rank 0 publishes and the others wait for it; the published file lives until release().
class Rendezvous {
 public:
  explicit Rendezvous(const Placement& p);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;
  const std::string& commId() const { return commId_; }
  void release();  // once every rank has joined

 private:
  std::string commId_;
  std::string file_;  // rank 0's published file, removed by release()
};

// The built-in launcher. In the parent, forks `nprocs` children and returns the exit code
// to leave with (the first failure; the others are then terminated). In each child,
// returns nullopt after exporting LOOM_BENCH_RANK / LOOM_BENCH_NPROCS, so the child goes on
// as that rank.
std::optional<int> forkRanks(int nprocs);

}  // namespace loom::bench
