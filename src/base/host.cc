#include "base/host.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/config.h"
#include "base/error.h"

namespace loom {
namespace {

StringKnob kHostId("LOOM_HOSTID", "", "",
                   "Override the host identity (which ranks share memory; default: hostname, "
                   "boot id, and the network and pid namespaces unless they are the "
                   "machine's own); lets one machine pose as several hosts for testing");

// Changes on every boot, so two containers that share a hostname but not a kernel, or a
// machine reusing a hostname after reinstall, are still told apart.
std::string bootId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

// The inode of a namespace file: it names the namespace for as long as the namespace lives.
ino_t namespaceInode(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_ino : 0;
}

// The kernel gives the initial namespaces fixed inodes (PROC_PID_INIT_INO since Linux 3.8,
// PROC_NET_INIT_INO in recent kernels).
constexpr ino_t kInitPidNsInode = 0xEFFFFFFCu;
constexpr ino_t kInitNetNsInode = 0xEFFFFFF9u;

// "/<tag>:<inode>", or "" for the namespace the machine (or the container, whose own
// hostname already sets it apart) started in: the kernel's initial one, or PID 1's where
// we may look at PID 1 (root usually may). Where we may not, the inode is shown: longer,
// and still the same for every rank of that namespace running as the same user.
std::string namespacePart(const char* tag, const char* selfPath, ino_t initInode,
                          const char* pid1Path) {
  ino_t self = namespaceInode(selfPath);
  if (self == 0 || self == initInode) return "";
  if (pid1Path && namespaceInode(pid1Path) == self) return "";
  return "/" + std::string(tag) + ":" + std::to_string(static_cast<unsigned long long>(self));
}

}  // namespace

std::string hostName() {
  char buf[HOST_NAME_MAX + 1] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) throwErrno("gethostname");
  return buf;
}

std::string hostIdString() {
  if (kHostId.isSet()) return kHostId.get();
  // Ranks started with `ip netns exec` or in containers keep the hostname and boot id of
  // the machine; their namespaces are what sets them apart. No pid-1 fallback for pid
  // namespaces: /proc/1 is always in our own pid namespace when /proc is mounted for it.
  return hostName() + ":" + bootId() +
         namespacePart("netns", "/proc/self/ns/net", kInitNetNsInode, "/proc/1/ns/net") +
         namespacePart("pidns", "/proc/self/ns/pid", kInitPidNsInode, nullptr);
}

uint64_t pidNamespace() { return namespaceInode("/proc/self/ns/pid"); }

uint64_t hostHash() {
  // 64-bit FNV-1a: stable across processes and builds, which std::hash does not promise.
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : hostIdString()) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

int hostCpus() {
  // "0-3,8,10-11"
  std::ifstream f("/sys/fs/cgroup/cpuset.cpus.effective");
  std::string list;
  if (f && std::getline(f, list) && !list.empty()) {
    int n = 0;
    std::stringstream ss(list);
    std::string range;
    while (std::getline(ss, range, ',')) {
      int lo = 0, hi = 0;
      if (sscanf(range.c_str(), "%d-%d", &lo, &hi) == 2) n += hi - lo + 1;
      else if (sscanf(range.c_str(), "%d", &lo) == 1) n += 1;
    }
    if (n > 0) return n;
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

}  // namespace loom
