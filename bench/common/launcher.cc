#include "bench/common/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "bench/common/bench_error.h"

namespace loom::bench {

EnvFn processEnv() {
  return [](const char* name) -> const char* {
    const char* v = getenv(name);
    return v && *v ? v : nullptr;
  };
}

namespace {

int envInt(const EnvFn& env, const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  long x = strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < 0)
    benchFail(Status::kInvalidUsage, "%s='%s' is not a non-negative integer", name, v);
  return static_cast<int>(x);
}

void checkRank(const char* what, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size)
    benchFail(Status::kInvalidUsage, "%s: rank %d is not within a world of %d processes", what,
              rank, size);
}

}  // namespace

Placement detectPlacement(const EnvFn& env) {
  Placement p;
  std::string commIdEnv = env("NCCL_COMM_ID") ? env("NCCL_COMM_ID") : "";
  if (env("LOOM_BENCH_RANK")) {  // our own children (forkRanks)
    p.kind = LaunchKind::kForkChild;
    p.proc = envInt(env, "LOOM_BENCH_RANK", 0);
    p.nProcs = envInt(env, "LOOM_BENCH_NPROCS", 1);
    p.localRank = p.proc;
    p.localSize = p.nProcs;
    p.launcher = "built-in launcher (forked processes)";
    checkRank("LOOM_BENCH_RANK", p.proc, p.nProcs);
    if (commIdEnv.empty())
      benchFail(Status::kInternalError, "forked rank %d has no NCCL_COMM_ID from its parent",
                p.proc);
    p.commId = commIdEnv;
    return p;
  }
  if (env("RANK") && env("WORLD_SIZE")) {  // torchrun / torch.distributed.launch
    p.kind = LaunchKind::kTorchrun;
    p.proc = envInt(env, "RANK", 0);
    p.nProcs = envInt(env, "WORLD_SIZE", 1);
    p.localRank = envInt(env, "LOCAL_RANK", 0);
    p.localSize = envInt(env, "LOCAL_WORLD_SIZE", p.nProcs);
    p.launcher = env("TORCHELASTIC_RUN_ID") ? "torchrun" : "torchrun-style environment";
    checkRank("RANK/WORLD_SIZE", p.proc, p.nProcs);
    if (!commIdEnv.empty()) {
      p.commId = commIdEnv;
    } else if (p.nProcs > 1) {
      const char* addr = env("MASTER_ADDR");
      const char* port = env("MASTER_PORT");
      if (!addr || !port)
        benchFail(Status::kInvalidUsage,
                  "RANK and WORLD_SIZE are set but MASTER_ADDR/MASTER_PORT are not: set them "
                  "(torchrun does) or set NCCL_COMM_ID=<host>:<port>");
      int base = envInt(env, "MASTER_PORT", 0);
      // The torchrun agent hosts its TCPStore on MASTER_PORT; take the next one.
      int offset = env("LOOM_BENCH_PORT_OFFSET") ? envInt(env, "LOOM_BENCH_PORT_OFFSET", 0)
                                                 : (env("TORCHELASTIC_RUN_ID") ? 1 : 0);
      if (base + offset < 1 || base + offset > 65535)
        benchFail(Status::kInvalidUsage, "MASTER_PORT=%s (+%d) is not a valid TCP port", port,
                  offset);
      p.commId = joinHostPort(addr, base + offset);
    }
    return p;
  }
  if (env("OMPI_COMM_WORLD_SIZE") || env("PMI_SIZE")) {  // mpirun: Open MPI, MPICH/Hydra
    bool ompi = env("OMPI_COMM_WORLD_SIZE") != nullptr;
    p.kind = LaunchKind::kMpi;
    if (ompi) {
      p.proc = envInt(env, "OMPI_COMM_WORLD_RANK", 0);
      p.nProcs = envInt(env, "OMPI_COMM_WORLD_SIZE", 1);
      p.localRank = envInt(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
      p.localSize = envInt(env, "OMPI_COMM_WORLD_LOCAL_SIZE", p.nProcs);
      p.launcher = "mpirun (Open MPI)";
    } else {
      p.proc = envInt(env, "PMI_RANK", 0);
      p.nProcs = envInt(env, "PMI_SIZE", 1);
      p.localRank = envInt(env, "MPI_LOCALRANKID", 0);
      p.localSize = envInt(env, "MPI_LOCALNRANKS", p.nProcs);
      p.launcher = "mpirun (PMI)";
    }
    checkRank(ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK", p.proc, p.nProcs);
    if (!commIdEnv.empty()) {
      p.commId = commIdEnv;
    } else if (p.nProcs > 1) {
      p.fileExchange = true;
      const char* key = nullptr;
      for (const char* name : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
                               "OMPI_MCA_orte_ess_jobid", "PMI_KVSNAME", "PMI_JOBID"})
        if ((key = env(name))) break;
      // Ranks of one node share their launcher daemon (orted/prted/hydra proxy).
      p.exchangeKey = key ? key : formatString("ppid%d", static_cast<int>(getppid()));
    }
    return p;
  }
  // srun sets SLURM_STEP_NUM_TASKS; an sbatch script's own environment has SLURM_PROCID=0
  // and SLURM_NTASKS=N too, but running the tool there directly starts one process.
  if (env("SLURM_PROCID") && env("SLURM_STEP_NUM_TASKS")) {
    p.kind = LaunchKind::kSlurm;
    p.proc = envInt(env, "SLURM_PROCID", 0);
    p.nProcs = envInt(env, "SLURM_STEP_NUM_TASKS", 1);
    p.localRank = envInt(env, "SLURM_LOCALID", 0);
    p.localSize = p.nProcs;
    if (const char* tpn = env("SLURM_STEP_TASKS_PER_NODE")) p.localSize = atoi(tpn);
    p.launcher = "srun";
    checkRank("SLURM_PROCID/SLURM_NTASKS", p.proc, p.nProcs);
    if (!commIdEnv.empty()) {
      p.commId = commIdEnv;
    } else if (p.nProcs > 1) {
      int nodes = env("SLURM_STEP_NUM_NODES") ? envInt(env, "SLURM_STEP_NUM_NODES", 1)
                                              : envInt(env, "SLURM_NNODES", 1);
      const char* list = env("SLURM_STEP_NODELIST");
      if (!list) list = env("SLURM_JOB_NODELIST");
      if (!list) list = env("SLURM_NODELIST");
      std::string host = nodes <= 1 ? "127.0.0.1" : (list ? firstSlurmHost(list) : "");
      if (host.empty())
        benchFail(Status::kInvalidUsage,
                  "srun: cannot tell the first node (SLURM_STEP_NODELIST unset); set "
                  "NCCL_COMM_ID=<host>:<port>");
      long job = env("SLURM_JOB_ID") ? atol(env("SLURM_JOB_ID")) : 0;
      long step = env("SLURM_STEP_ID") ? atol(env("SLURM_STEP_ID")) : 0;
      int port = env("LOOM_BENCH_PORT") ? envInt(env, "LOOM_BENCH_PORT", 0) : slurmPort(job, step);
      p.commId = joinHostPort(host, port);
    }
    return p;
  }
  p.launcher = "single process";
  p.commId = commIdEnv;
  return p;
}

std::string firstSlurmHost(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets.
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  size_t open = first.find('[');
  if (open == std::string::npos) return first;
  std::string prefix = first.substr(0, open);
  std::string range = first.substr(open + 1);
  size_t cut = range.find_first_of(",-]");
  std::string suffix;
  if (size_t close = first.find(']'); close != std::string::npos) suffix = first.substr(close + 1);
  return prefix + range.substr(0, cut) + suffix;
}

int slurmPort(long jobId, long stepId) {
  return 20000 +
         static_cast<int>(
             (static_cast<unsigned long>(jobId) * 17 + static_cast<unsigned long>(stepId)) % 30000);
}

std::string joinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[')
    return formatString("[%s]:%d", host.c_str(), port);
  return formatString("%s:%d", host.c_str(), port);
}

std::string resolveHost(const std::string& host) {
  struct addrinfo hints {};
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0 || !res)
    benchFail(Status::kInvalidUsage, "cannot resolve host '%s': %s", host.c_str(),
              gai_strerror(rc));
  std::string out;
  for (int family : {AF_INET, AF_INET6}) {
    for (struct addrinfo* a = res; a && out.empty(); a = a->ai_next) {
      if (a->ai_family != family) continue;
      char buf[INET6_ADDRSTRLEN];
      const void* src =
          family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
      if (inet_ntop(family, src, buf, sizeof buf)) out = buf;
    }
  }
  freeaddrinfo(res);
  if (out.empty()) benchFail(Status::kInvalidUsage, "host '%s' has no IP address", host.c_str());
  return out;
}

int pickFreePort(const std::string& ip) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) benchFail(Status::kInternalError, "socket(): %s", strerror(errno));
  struct sockaddr_in addr {};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    close(fd);
    benchFail(Status::kInternalError, "cannot bind a TCP port on %s: %s", ip.c_str(),
              strerror(err));
  }
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

namespace {

// The address other nodes reach this one at: NCCL_SOCKET_IFNAME's interface when it names
// one by prefix, else the first non-loopback IPv4 interface that is up.
std::string publicAddress() {
  const char* want = getenv("NCCL_SOCKET_IFNAME");
  if (want && (*want == '^' || *want == '=')) want = nullptr;
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "127.0.0.1";
  std::string out;
  for (struct ifaddrs* i = list; i && out.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    if (want ? strncmp(i->ifa_name, want, strlen(want)) != 0 : (i->ifa_flags & IFF_LOOPBACK) != 0)
      continue;
    char buf[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf))
      out = buf;
  }
  freeifaddrs(list);
  return out.empty() ? "127.0.0.1" : out;
}

std::string exchangeFile(const std::string& key) {
  const char* dir = getenv("LOOM_BENCH_RENDEZVOUS_DIR");
  if (!dir || !*dir) dir = getenv("TMPDIR");
  if (!dir || !*dir) dir = "/tmp";
  std::string safe;
  for (char c : key)
    safe += isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
  return formatString("%s/loom-bench-%s-uid%d.addr", dir, safe.c_str(), static_cast<int>(getuid()));
}

const auto kProcessStart = std::chrono::system_clock::now();

}  // namespace

Rendezvous::Rendezvous(const Placement& p) {
  if (!p.fileExchange) {
    commId_ = p.commId;
    if (!commId_.empty()) setenv("NCCL_COMM_ID", commId_.c_str(), 1);
    return;
  }
  std::string path = exchangeFile(p.exchangeKey);
  if (p.proc == 0) {
    std::string ip = p.localSize >= p.nProcs ? "127.0.0.1" : publicAddress();
    commId_ = joinHostPort(ip, pickFreePort(ip));
    std::string tmp = path + formatString(".tmp%d", static_cast<int>(getpid()));
    {
      std::ofstream out(tmp);
      out << commId_ << "\n";
      if (!out)
        benchFail(Status::kInternalError, "cannot write the rendezvous file %s", tmp.c_str());
    }
    if (rename(tmp.c_str(), path.c_str()) != 0)
      benchFail(Status::kInternalError, "cannot publish the rendezvous file %s: %s", path.c_str(),
                strerror(errno));
    file_ = path;
  } else {
    const char* t = getenv("LOOM_BENCH_RENDEZVOUS_TIMEOUT");
    const int timeoutSec = t ? atoi(t) : 120;
    // A file older than this process (less launch skew) is a leftover of an earlier job.
    const auto notBefore = kProcessStart - std::chrono::seconds(10);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSec);
    for (;;) {
      struct stat st {};
      if (stat(path.c_str(), &st) == 0 &&
          std::chrono::system_clock::from_time_t(st.st_mtime) >= notBefore) {
        std::ifstream in(path);
        std::getline(in, commId_);
        if (!commId_.empty()) break;
      }
      if (std::chrono::steady_clock::now() > deadline)
        benchFail(
            Status::kTimeout,
            "rank %d waited %d s for rank 0's rendezvous file %s; for multi-node mpirun "
            "set LOOM_BENCH_RENDEZVOUS_DIR to a shared directory or NCCL_COMM_ID=<host>:<port>",
            p.proc, timeoutSec, path.c_str());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  setenv("NCCL_COMM_ID", commId_.c_str(), 1);
}

void Rendezvous::release() {
  if (!file_.empty()) unlink(file_.c_str());
  file_.clear();
}

Rendezvous::~Rendezvous() { release(); }

namespace {

std::vector<pid_t> gChildren;
volatile sig_atomic_t gForwardedSignal = 0;

void forwardSignal(int sig) {
  gForwardedSignal = sig;
  for (pid_t pid : gChildren)
    if (pid > 0) kill(pid, sig);
}

int exitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

std::optional<int> forkRanks(int nprocs) {
  if (!getenv("NCCL_COMM_ID")) {
    std::string id = joinHostPort("127.0.0.1", pickFreePort("127.0.0.1"));
    setenv("NCCL_COMM_ID", id.c_str(), 1);
  }
  fflush(stdout);
  fflush(stderr);
  const pid_t parent = getpid();
  gChildren.assign(nprocs, 0);
  for (int r = 0; r < nprocs; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      int err = errno;
      forwardSignal(SIGTERM);
      benchFail(Status::kInternalError, "fork() of rank %d failed: %s", r, strerror(err));
    }
    if (pid == 0) {
      // Die with the parent: a launcher killed by the user must not leave ranks behind.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      gChildren.clear();
      setenv("LOOM_BENCH_RANK", std::to_string(r).c_str(), 1);
      setenv("LOOM_BENCH_NPROCS", std::to_string(nprocs).c_str(), 1);
      return std::nullopt;
    }
    gChildren[r] = pid;
  }
  struct sigaction sa {};
  sa.sa_handler = forwardSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);

  using Clock = std::chrono::steady_clock;
  constexpr auto kNever = Clock::time_point::max();
  int result = 0;
  int failedRank = -1;
  int alive = nprocs;
  // After a rank fails the others get a grace period to finish on their own (they usually
  // fail the same way); then SIGTERM, then SIGKILL.
  auto termDeadline = kNever, killDeadline = kNever;
  while (alive > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno != EINTR) break;
    if (pid <= 0) {
      auto now = Clock::now();
      if (now > termDeadline) {
        fprintf(
            stderr,
            "loom bench launcher: rank %d failed (exit code %d); stopping the other %d rank(s)\n",
            failedRank, result, alive);
        for (pid_t c : gChildren)
          if (c > 0) kill(c, SIGTERM);
        termDeadline = kNever;
        killDeadline = now + std::chrono::seconds(5);
      }
      if (now > killDeadline) {
        for (pid_t c : gChildren)
          if (c > 0) kill(c, SIGKILL);
        killDeadline = kNever;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    int rank = -1;
    for (int r = 0; r < nprocs; ++r)
      if (gChildren[r] == pid) rank = r;
    if (rank < 0) continue;
    gChildren[rank] = 0;
    --alive;
    int code = exitCodeOf(status);
    if (code != 0 && result == 0) {
      result = code;
      failedRank = rank;
      if (alive > 0) termDeadline = Clock::now() + std::chrono::seconds(3);
    }
  }
  if (gForwardedSignal && result == 0) result = 128 + gForwardedSignal;
  return result;
}

}  // namespace loom::bench
