#include "base/host.h"

#include <unistd.h>

#include <climits>
#include <fstream>

#include "base/config.h"
#include "base/error.h"

namespace loom {
namespace {

StringKnob kHostId("LOOM_HOSTID", "", "",
                   "Override the host identity (which ranks share memory); lets one machine "
                   "pose as several hosts for testing");

// Changes on every boot, so two containers that share a hostname but not a kernel, or a
// machine reusing a hostname after reinstall, are still told apart.
std::string bootId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

}  // namespace

std::string hostName() {
  char buf[HOST_NAME_MAX + 1] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) throwErrno("gethostname");
  return buf;
}

std::string hostIdString() {
  if (kHostId.isSet()) return kHostId.get();
  return hostName() + ":" + bootId();
}

uint64_t hostHash() {
  // 64-bit FNV-1a: stable across processes and builds, which std::hash does not promise.
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : hostIdString()) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace loom
