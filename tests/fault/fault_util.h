// Shared pieces of the fault-injection suites: ranks as forked processes that the test
// can kill at a chosen moment, a shared-memory board on which they post progress and
// timings (CLOCK_MONOTONIC is one clock for every process of the host), and probes of a
// process's resources (threads, fds, mappings, /dev/shm names). The board and the unique
// id made after the forks (SharedBoard, LateId) are the core harness's: core/late_id.h.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/late_id.h"

namespace loomtest::fault {

inline int64_t monoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000ll + ts.tv_nsec;
}
inline double msBetween(int64_t fromNs, int64_t toNs) { return (toNs - fromNs) / 1e6; }
inline void sleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Waits until pred() holds or `timeoutMs` passes; returns pred()'s last value.
inline bool waitFor(const std::function<bool()>& pred, int timeoutMs, int stepMs = 2) {
  int64_t end = monoNs() + timeoutMs * 1000000ll;
  while (!pred()) {
    if (monoNs() > end) return pred();
    sleepMs(stepMs);
  }
  return true;
}

// What every rank posts: its progress and, when a call failed, when and how.
struct RankSlot {
  std::atomic<int> stage{0};         // test-defined milestones
  std::atomic<int> iterations{0};    // completed iterations of the rank's loop
  std::atomic<int64_t> errorNs{0};   // when the failing call returned
  std::atomic<int> errorCode{0};     // its ncclResult_t
  char message[512] = {};            // ncclGetLastError of the failure
};
constexpr int kMaxRanks = 8;

inline void postError(RankSlot& s, ncclResult_t rc, const char* msg) {
  snprintf(s.message, sizeof(s.message), "%s", msg ? msg : "");
  s.errorCode.store(rc);
  s.errorNs.store(monoNs());
}

// A forked rank: runs fn in the child and reports its result string through a pipe.
struct Child {
  pid_t pid = -1;
  int fd = -1;
};

inline Child forkChild(const std::function<std::string()>& fn) {
  int p[2];
  if (pipe(p) != 0) return {};
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    std::string e = fn();
    if (write(p[1], e.data(), e.size()) < 0) {
    }
    _exit(e.empty() ? 0 : 1);
  }
  close(p[1]);
  return {pid, p[0]};
}

// Waits for a child; "" if it exited 0, otherwise its message (or how it died). A child
// still running after `timeoutSec` is killed and reported as hung.
inline std::string waitChild(Child& c, double timeoutSec, bool* hung = nullptr) {
  if (hung) *hung = false;
  int status = 0;
  int64_t end = monoNs() + static_cast<int64_t>(timeoutSec * 1e9);
  bool timedOut = false;
  for (;;) {
    pid_t w = waitpid(c.pid, &status, WNOHANG);
    if (w == c.pid) break;
    if (monoNs() > end) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &status, 0);
      timedOut = true;
      break;
    }
    sleepMs(2);
  }
  std::string msg;
  char buf[4096];
  ssize_t n;
  while ((n = read(c.fd, buf, sizeof(buf))) > 0) msg.append(buf, n);
  close(c.fd);
  c.fd = -1;
  if (timedOut) {
    if (hung) *hung = true;
    return "hung (killed after " + std::to_string(timeoutSec) + " s)";
  }
  if (WIFSIGNALED(status))
    return "killed by signal " + std::to_string(WTERMSIG(status)) + (msg.empty() ? "" : ": " + msg);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return msg.empty() ? "exited with status " + std::to_string(WEXITSTATUS(status)) : msg;
  return "";
}

// Reaps a child the test killed on purpose.
inline void reapKilled(Child& c) {
  waitpid(c.pid, nullptr, 0);
  if (c.fd >= 0) close(c.fd);
  c.fd = -1;
}

// ---- resources of this process ----

inline std::vector<std::string> dirEntries(const std::string& path) {
  std::vector<std::string> out;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d))
      if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

inline int threadCount() { return static_cast<int>(dirEntries("/proc/self/task").size()); }

// Open descriptors and what they are ("3 -> socket:[123]"), without the one used to list them.
inline std::set<std::string> openFds() {
  std::set<std::string> out;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return out;
  int self = dirfd(d);
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == self) continue;
    char target[256] = {};
    std::string link = std::string("/proc/self/fd/") + e->d_name;
    ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    out.insert(std::string(e->d_name) + " -> " + (n > 0 ? target : "?"));
  }
  closedir(d);
  return out;
}

// /dev/shm/loom-* names created by process `pid` ("loom-<ns>-<pid>-...").
inline std::set<std::string> shmNamesOf(pid_t pid) {
  std::set<std::string> out;
  std::string mark = "-" + std::to_string(pid) + "-";
  for (const auto& n : dirEntries("/dev/shm"))
    if (n.rfind("loom-", 0) == 0 && n.find(mark) != std::string::npos) out.insert(n);
  return out;
}

// Shared-memory mappings of this process that name a Loom segment.
inline int loomMappings() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find("/loom-") != std::string::npos;
  return n;
}

struct Resources {
  int threads = 0;
  std::set<std::string> fds;
  std::set<std::string> shm;
  int mappings = 0;
};

inline Resources snapshot() { return {threadCount(), openFds(), shmNamesOf(getpid()), loomMappings()}; }

// "" when `now` holds nothing beyond `before`, else what is extra. Threads that are on
// their way out get a moment to go.
inline std::string extraResources(const Resources& before, int graceMs = 1000) {
  Resources now;
  waitFor([&] {
    now = snapshot();
    return now.threads <= before.threads && now.fds.size() <= before.fds.size() &&
           now.shm.empty() && now.mappings <= before.mappings;
  }, graceMs, 10);
  std::string out;
  if (now.threads > before.threads)
    out += "threads " + std::to_string(before.threads) + " -> " + std::to_string(now.threads) + "; ";
  if (now.fds.size() > before.fds.size()) {
    out += "fds " + std::to_string(before.fds.size()) + " -> " + std::to_string(now.fds.size()) + ":";
    for (const auto& f : now.fds)
      if (!before.fds.count(f)) out += " [" + f + "]";
    out += "; ";
  }
  for (const auto& s : now.shm) out += "/dev/shm/" + s + " left; ";
  if (now.mappings > before.mappings)
    out += "loom mappings " + std::to_string(before.mappings) + " -> " +
           std::to_string(now.mappings) + "; ";
  return out;
}

// ---- TCP sockets of a process ----

struct TcpSocket {
  bool v6 = false;
  std::string localHex;  // the address as /proc/net/tcp prints it
  int localPort = 0;
  int remotePort = 0;
  int state = 0;  // 0x0A listening, 0x01 established
};

// The TCP sockets among process `pid`'s descriptors (from /proc/<pid>/net/tcp{,6}).
inline std::vector<TcpSocket> tcpSocketsOf(pid_t pid) {
  std::set<std::string> inodes;
  std::string fdDir = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& e : dirEntries(fdDir)) {
    char target[128] = {};
    ssize_t n = readlink((fdDir + "/" + e).c_str(), target, sizeof(target) - 1);
    if (n > 9 && strncmp(target, "socket:[", 8) == 0)
      inodes.insert(std::string(target + 8, target + n - 1));
  }
  std::vector<TcpSocket> out;
  for (int v6 = 0; v6 < 2; ++v6) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/net/" + (v6 ? "tcp6" : "tcp"));
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ss(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      ss >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      size_t lc = local.find(':'), rc = remote.find(':');
      if (!inodes.count(inode) || lc == std::string::npos || rc == std::string::npos) continue;
      TcpSocket t;
      t.v6 = v6 != 0;
      t.localHex = local.substr(0, lc);
      t.localPort = static_cast<int>(strtol(local.c_str() + lc + 1, nullptr, 16));
      t.remotePort = static_cast<int>(strtol(remote.c_str() + rc + 1, nullptr, 16));
      t.state = static_cast<int>(strtol(st.c_str(), nullptr, 16));
      out.push_back(t);
    }
  }
  return out;
}

// Whether process `pid` holds an established connection to port `port`.
inline bool connectedToPort(pid_t pid, int port) {
  for (const auto& t : tcpSocketsOf(pid))
    if (t.state == 0x01 && t.remotePort == port) return true;
  return false;
}

// Whether `msg` names a peer rank other than `me` ("rank N") and a socket address
// ("1.2.3.4:5" or "[::1]:5").
inline bool namesPeerAndAddress(const std::string& msg, int me) {
  bool peer = false, addr = false;
  for (size_t at = msg.find("rank "); at != std::string::npos; at = msg.find("rank ", at + 1)) {
    size_t d = at + 5;
    if (d < msg.size() && isdigit(static_cast<unsigned char>(msg[d])))
      peer |= atoi(msg.c_str() + d) != me;
  }
  for (size_t i = 1; i + 1 < msg.size() && !addr; ++i) {
    if (msg[i] != ':' || !isdigit(static_cast<unsigned char>(msg[i + 1]))) continue;
    if (msg[i - 1] == ']') {
      addr = true;
      continue;
    }
    size_t j = i, dots = 0;
    while (j > 0 && (isdigit(static_cast<unsigned char>(msg[j - 1])) || msg[j - 1] == '.')) dots += msg[--j] == '.';
    addr = dots == 3 && i - j >= 7;
  }
  return peer && addr;
}

// Whether `msg` carries an operation sequence number ("#12").
inline bool namesSequence(const std::string& msg) {
  for (size_t i = msg.find('#'); i != std::string::npos; i = msg.find('#', i + 1))
    if (i + 1 < msg.size() && isdigit(static_cast<unsigned char>(msg[i + 1]))) return true;
  return false;
}

}  // namespace loomtest::fault
