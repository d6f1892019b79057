// Checks of this process's environment: knob values, /dev/shm, resource limits, CPU and
// NUMA affinity.
#include <sched.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "algo/select.h"
#include "base/config.h"
#include "base/error.h"
#include "base/host.h"
#include "base/shm.h"
#include "doctor.h"

extern char** environ;

namespace loom::doctor {
namespace {

size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

// "0-3,8,10-11" as a set of numbers.
std::set<int> parseList(const std::string& text) {
  std::set<int> out;
  std::stringstream ss(text);
  for (std::string range; std::getline(ss, range, ',');) {
    int lo = 0, hi = 0;
    if (sscanf(range.c_str(), "%d-%d", &lo, &hi) == 2) {
      for (int i = lo; i <= hi; ++i) out.insert(i);
    } else if (sscanf(range.c_str(), "%d", &lo) == 1) {
      out.insert(lo);
    }
  }
  return out;
}

std::string formatList(const std::set<int>& s) {
  std::string out;
  for (auto it = s.begin(); it != s.end();) {
    int lo = *it, hi = lo;
    while (++it != s.end() && *it == hi + 1) hi = *it;
    out += (out.empty() ? "" : ",") + std::to_string(lo) + (hi > lo ? "-" + std::to_string(hi) : "");
  }
  return out.empty() ? "none" : out;
}

std::string readLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

std::string limitText(rlim_t v, bool bytes) {
  if (v == RLIM_INFINITY) return "unlimited";
  return bytes ? humanBytes(static_cast<double>(v)) : std::to_string(v);
}

}  // namespace

// Every knob's value parses as the code that reads it would parse it; LOOM_ / NCCL_
// variables that are no knob but are one typo away from one are named.
Check checkKnobs() {
  Check c("knobs");
  std::vector<std::string> bad, typos;
  int set = 0;
  for (const KnobBase* k : allKnobs()) {
    if (!k->isSet()) continue;
    ++set;
    try {
      if (k->type() == KnobType::kInt) (void)static_cast<const IntKnob*>(k)->get();
      if (k->type() == KnobType::kBool) (void)static_cast<const BoolKnob*>(k)->get();
      if (k->type() == KnobType::kSize) (void)static_cast<const SizeKnob*>(k)->get();
    } catch (const Error& e) {
      bad.push_back(e.what());
    }
  }
  try {  // NCCL_ALGO / NCCL_PROTO: strings whose syntax only the selector knows
    PlanContext().loadAlgoFilter();
  } catch (const Error& e) {
    bad.push_back(e.what());
  }
  try {  // channel bounds: integers that must not be negative
    PlanContext().loadChannelBounds();
  } catch (const Error& e) {
    bad.push_back(e.what());
  }
  for (char** e = environ; *e; ++e) {
    std::string name(*e, strcspn(*e, "="));
    const bool loomName = name.rfind("LOOM_", 0) == 0;
    if (!loomName && name.rfind("NCCL_", 0) != 0) continue;
    std::string best;
    size_t bestD = 99;
    for (const KnobBase* k : allKnobs()) {
      for (const std::string& known : {std::string(k->name()), std::string(k->ncclAlias())}) {
        if (known.empty()) continue;
        size_t d = editDistance(name, known);
        if (d < bestD) bestD = d, best = known;
      }
    }
    // NCCL has many knobs Loom does not read, some close to each other: only a one-letter
    // slip counts there.
    if (bestD > 0 && bestD <= (loomName ? 2u : 1u)) typos.push_back(name + " (did you mean " + best + "?)");
  }
  c.fact("set", jsonNumber(set));
  // NCCL tuning Loom's paths ignore (a stock NCCL serving device buffers reads it): said,
  // not flagged, since a job may carry it for stock NCCL's sake.
  std::string unread;
  for (const std::string& v : unreadNcclVariables()) {
    const std::string name = v.substr(0, v.find('='));
    bool typo = false;
    for (const std::string& t : typos) typo |= t.rfind(name + " ", 0) == 0;
    if (!typo) unread += (unread.empty() ? "" : ", ") + name;
  }
  if (!unread.empty()) c.fact("notReadByLoom", jsonString(unread));
  const std::string unreadNote =
      unread.empty() ? "" : "; NCCL's, not read by Loom (a stock NCCL serving device buffers reads them): " + unread;
  std::string list;
  for (const std::string& s : bad) list += (list.empty() ? "" : "; ") + s;
  if (!bad.empty()) {
    c.set(Status::kFail, list, "correct or unset the variable (`loom-info <NAME>` shows its syntax)");
  } else if (!typos.empty()) {
    for (const std::string& s : typos) list += (list.empty() ? "" : ", ") + s;
    c.set(Status::kWarn, "not read by Loom: " + list, "rename the variable to the knob it was meant to be");
  } else {
    c.set(Status::kPass,
          std::to_string(set) + " knob(s) set in the environment, every value valid" + unreadNote);
  }
  return c;
}

// Same-host ranks exchange data through /dev/shm; containers often give it 64 MiB.
Check checkShm() {
  Check c("shm");
  struct statvfs fs {};
  if (statvfs("/dev/shm", &fs) != 0)
    return c.set(Status::kFail, std::string("/dev/shm: ") + strerror(errno),
                 "mount a tmpfs on /dev/shm (containers: docker run --ipc=host or --shm-size=1g)");
  const double size = static_cast<double>(fs.f_blocks) * static_cast<double>(fs.f_frsize);
  const double avail = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
  c.fact("sizeBytes", jsonNumber(size));
  c.fact("freeBytes", jsonNumber(avail));
  std::string found = "/dev/shm " + humanBytes(size) + ", " + humanBytes(avail) + " free";
  try {
    ShmSegment seg = ShmSegment::create("doctor", 1 << 20);
    static_cast<volatile char*>(seg.data())[(1 << 20) - 1] = 1;  // touch the last page
    found += "; created, wrote and removed a 1 MiB segment";
  } catch (const Error& e) {
    return c.set(Status::kFail, found + "; " + e.what(),
                 "make /dev/shm writable by this user with room to spare (docker: --shm-size=1g)");
  }
  const double kGiB = 1024.0 * 1024 * 1024;
  if (size < kGiB)
    return c.set(Status::kWarn, found + " (less than 1 GiB: Docker's default of 64 MiB runs out with a few ranks)",
                 "give /dev/shm at least 1 GiB: docker run --shm-size=1g or --ipc=host; Kubernetes: an emptyDir "
                 "with medium: Memory mounted on /dev/shm");
  if (avail < kGiB / 4)
    return c.set(Status::kWarn, found + " (almost full)",
                 "remove stale segments of finished jobs (ls -la /dev/shm) or enlarge it");
  return c.set(Status::kPass, found);
}

// RDMA registration pins memory: NCCL's runbooks ask for an unlimited memlock limit.
Check checkMemlock(const Host& host) {
  Check c("memlock");
  rlimit lim{};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  c.fact("soft", lim.rlim_cur == RLIM_INFINITY ? "-1" : jsonNumber(static_cast<double>(lim.rlim_cur)));
  c.fact("hard", lim.rlim_max == RLIM_INFINITY ? "-1" : jsonNumber(static_cast<double>(lim.rlim_max)));
  std::string found = "ulimit -l " + limitText(lim.rlim_cur, true) + " (hard " + limitText(lim.rlim_max, true) + ")";
  if (lim.rlim_cur == RLIM_INFINITY) return c.set(Status::kPass, found);
  if (host.rdmaDevices == 0)
    return c.set(Status::kPass, found + "; only RDMA registration needs more, and there is no RDMA device");
  return c.set(Status::kWarn, found + " with RDMA devices present: registering large buffers will fail",
               "ulimit -l unlimited (limits.conf '* - memlock unlimited'; docker --ulimit memlock=-1; "
               "Slurm: PropagateResourceLimits or the slurmd unit's LimitMEMLOCK=infinity)");
}

// Sockets, shm descriptors and pidfds per peer; the rendezvous root holds one per rank.
Check checkOpenFiles() {
  Check c("open-files");
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  c.fact("soft", jsonNumber(lim.rlim_cur == RLIM_INFINITY ? -1.0 : static_cast<double>(lim.rlim_cur)));
  c.fact("hard", jsonNumber(lim.rlim_max == RLIM_INFINITY ? -1.0 : static_cast<double>(lim.rlim_max)));
  std::string found = "ulimit -n " + limitText(lim.rlim_cur, false) + " (hard " + limitText(lim.rlim_max, false) + ")";
  constexpr rlim_t kWant = 4096;
  if (lim.rlim_cur >= kWant) return c.set(Status::kPass, found);
  if (lim.rlim_max >= kWant)
    return c.set(Status::kWarn, found + ": a large job's rendezvous root and TCP peers need more",
                 "ulimit -n " + limitText(std::min<rlim_t>(lim.rlim_max, 65536), false) + " before launching");
  return c.set(Status::kWarn, found + ": a large job's rendezvous root and TCP peers need more",
               "raise the hard limit (limits.conf '* - nofile 65536', or LimitNOFILE= in the launcher's unit)");
}

// Where this process may run: the CPUs and NUMA domains of its affinity mask, against the
// NUMA domains the GPUs hang off.
Check checkAffinity(const Host& host) {
  Check c("affinity");
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::set<int> allowed;
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0)
    for (int i = 0; i < CPU_SETSIZE; ++i)
      if (CPU_ISSET(i, &mask)) allowed.insert(i);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  std::string found = "CPUs " + formatList(allowed) + " (" + std::to_string(allowed.size()) + " of " +
                      std::to_string(online) + " online";
  if (hostCpus() < online) found += ", cgroup cpuset " + std::to_string(hostCpus());
  found += ")";
  std::set<int> numaTouched;
  std::string numaText;
  for (int n : parseList(readLine("/sys/devices/system/node/online"))) {  // "0-1", or sparse: "0,2"
    std::string list = readLine("/sys/devices/system/node/node" + std::to_string(n) + "/cpulist");
    std::set<int> cpus = parseList(list);
    size_t mine = std::count_if(cpus.begin(), cpus.end(), [&](int cpu) { return allowed.count(cpu) > 0; });
    if (mine == 0) continue;
    numaTouched.insert(n);
    numaText += (numaText.empty() ? "" : ", ") + std::to_string(n) +
                (mine == cpus.size() ? "" : " (" + std::to_string(mine) + " of " + std::to_string(cpus.size()) + ")");
  }
  if (!numaText.empty()) found += ", NUMA " + numaText;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("Mems_allowed_list:", 0) == 0)
      found += "; memory on NUMA " + line.substr(line.find_first_not_of(" \t", 18));
  c.fact("cpus", jsonString(formatList(allowed)));
  c.fact("cpuCount", jsonNumber(static_cast<double>(allowed.size())));
  c.fact("numa", jsonString(formatList(numaTouched)));
  if (allowed.size() == 1)
    return c.set(
        Status::kWarn, found + ": every rank this process starts shares one core",
        "check the launcher's binding (srun --cpu-bind, mpirun --bind-to, taskset): give each rank its own cores");
  if (host.sys && !numaTouched.empty()) {
    std::string far;
    for (int g = 0; g < host.sys->gpuCount(); ++g) {
      int numa = host.sys->numaOf(host.sys->gpuNodeId(g));
      if (numa >= 0 && !numaTouched.count(numa))
        far += (far.empty() ? "GPU" : ", GPU") + std::to_string(g) + " on NUMA " + std::to_string(numa);
    }
    if (!far.empty())
      return c.set(Status::kWarn, found + "; no CPU near " + far,
                   "bind each rank to its GPU's NUMA domain (srun --cpu-bind=ldoms, numactl --cpunodebind=N, "
                   "mpirun --bind-to numa)");
  }
  return c.set(Status::kPass, found);
}

}  // namespace loom::doctor
