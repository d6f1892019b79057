#include "transports/net/ib_gid.h"

#include <arpa/inet.h>

#include <cstring>

#include "base/config.h"
#include "base/error.h"

namespace loom::ibnet {
namespace {

StringKnob kFamily("LOOM_IB_ADDR_FAMILY", "NCCL_IB_ADDR_FAMILY", "AF_INET",
                   "Address family of the RoCE GID verbs connections use when NCCL_IB_GID_INDEX is unset: "
                   "AF_INET or AF_INET6");
StringKnob kRange("LOOM_IB_ADDR_RANGE", "NCCL_IB_ADDR_RANGE", "",
                  "Address range (address/bits, of NCCL_IB_ADDR_FAMILY) the RoCE GID must lie in when "
                  "NCCL_IB_GID_INDEX is unset");
IntKnob kVersion("LOOM_IB_ROCE_VERSION_NUM", "NCCL_IB_ROCE_VERSION_NUM", 2,
                 "RoCE version (1 or 2) of the GID verbs connections use when NCCL_IB_GID_INDEX is unset");

bool ipv4Mapped(const std::array<uint8_t, 16>& g) {
  for (int i = 0; i < 10; ++i)
    if (g[i]) return false;
  return g[10] == 0xff && g[11] == 0xff;
}

bool zero(const std::array<uint8_t, 16>& g) { return !gidSet(g); }

// Set and not link-local (fe80::/64 with nothing more than an interface id), as NCCL's
// validGid: such GIDs do not route.
bool valid(const std::array<uint8_t, 16>& g) {
  if (zero(g)) return false;
  static const uint8_t kLinkLocal[8] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0};
  return memcmp(g.data(), kLinkLocal, 8) != 0;
}

bool inPrefix(const std::array<uint8_t, 16>& g, const GidPolicy& p) {
  int bits = p.prefixBits;
  for (int i = 0; bits > 0; ++i, bits -= 8) {
    uint8_t mask = bits >= 8 ? 0xff : static_cast<uint8_t>(0xff << (8 - bits));
    if ((g[i] & mask) != (p.prefix[i] & mask)) return false;
  }
  return true;
}

int versionOf(const std::vector<GidEntry>& table, int index) {
  for (const GidEntry& e : table)
    if (e.index == index) return e.roceVersion;
  return 0;
}

}  // namespace

GidPolicy GidPolicy::parse(const std::string& family, const std::string& range, int64_t version) {
  GidPolicy p;
  if (family == "AF_INET6") {
    p.ipv6 = true;
  } else if (family != "AF_INET") {
    LOOM_THROW(kInvalidArgument, "NCCL_IB_ADDR_FAMILY=%s: expected AF_INET or AF_INET6", family.c_str());
  }
  if (version != 1 && version != 2)
    LOOM_THROW(kInvalidArgument, "NCCL_IB_ROCE_VERSION_NUM=%lld: expected 1 or 2", static_cast<long long>(version));
  p.roceVersion = static_cast<int>(version);
  if (range.empty()) return p;
  p.range = range;
  size_t slash = range.find('/');
  const char* fam = p.ipv6 ? "AF_INET6" : "AF_INET";
  std::string addr = range.substr(0, slash);
  char* end = nullptr;
  long bits = slash == std::string::npos ? -1 : strtol(range.c_str() + slash + 1, &end, 10);
  const long most = p.ipv6 ? 128 : 32;
  if (slash == std::string::npos || end == range.c_str() + slash + 1 || *end || bits < 0 || bits > most)
    LOOM_THROW(kInvalidArgument, "NCCL_IB_ADDR_RANGE=%s: expected <address>/<bits> with 0-%ld bits (%s, "
               "NCCL_IB_ADDR_FAMILY)", range.c_str(), most, fam);
  if (p.ipv6) {
    if (inet_pton(AF_INET6, addr.c_str(), p.prefix.data()) != 1)
      LOOM_THROW(kInvalidArgument, "NCCL_IB_ADDR_RANGE=%s: '%s' is not an IPv6 address (NCCL_IB_ADDR_FAMILY=%s)",
                 range.c_str(), addr.c_str(), fam);
    p.prefixBits = static_cast<int>(bits);
  } else {
    if (inet_pton(AF_INET, addr.c_str(), p.prefix.data() + 12) != 1)
      LOOM_THROW(kInvalidArgument, "NCCL_IB_ADDR_RANGE=%s: '%s' is not an IPv4 address (NCCL_IB_ADDR_FAMILY=%s; "
                 "AF_INET6 for IPv6)", range.c_str(), addr.c_str(), fam);
    p.prefix[10] = p.prefix[11] = 0xff;
    p.prefixBits = 96 + static_cast<int>(bits);
  }
  return p;
}

GidPolicy GidPolicy::fromKnobs() {
  GidPolicy p = parse(kFamily.get(), kRange.get(), kVersion.get());
  p.familySet = kFamily.isSet();
  return p;
}

std::string GidPolicy::addresses() const {
  return std::string(ipv6 ? "IPv6" : "IPv4") + (range.empty() ? "" : " in " + range);
}

bool gidSet(const std::array<uint8_t, 16>& raw) {
  for (uint8_t b : raw)
    if (b) return true;
  return false;
}

std::string describeGids(const std::vector<GidEntry>& table) {
  std::string set;
  for (const GidEntry& e : table) {
    if (zero(e.raw)) continue;
    std::string version = e.roceVersion ? "RoCE v" + std::to_string(e.roceVersion) : "type unknown";
    set += strprintf("%s%d: %s (%s)", set.empty() ? "" : ", ", e.index, gidText(e.raw).c_str(), version.c_str());
  }
  return set;
}

std::string gidText(const std::array<uint8_t, 16>& raw) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (ipv4Mapped(raw)) inet_ntop(AF_INET, raw.data() + 12, buf, sizeof(buf));
  else inet_ntop(AF_INET6, raw.data(), buf, sizeof(buf));
  return buf;
}

int chooseGid(const std::vector<GidEntry>& table, const GidPolicy& p, const std::string& who, std::string* note) {
  // 4: the family and range asked for, of the version asked for; 3: the same, another
  // version; 2: a valid RoCE v2 GID; 1: any set GID.
  int best = -1, rank = 0;
  for (const GidEntry& e : table) {
    if (zero(e.raw)) continue;
    const bool wanted = valid(e.raw) && ipv4Mapped(e.raw) != p.ipv6 && inPrefix(e.raw, p);
    int r = wanted ? (e.roceVersion == p.roceVersion ? 4 : 3) : valid(e.raw) && e.roceVersion == 2 ? 2 : 1;
    if (r > rank) rank = r, best = e.index;
  }
  if (best >= 0 && rank < 3 && (p.familySet || p.prefixBits >= 0)) {
    LOOM_THROW(kInvalidArgument, "%s: no GID of the port has a routable %s address (NCCL_IB_ADDR_FAMILY, "
               "NCCL_IB_ADDR_RANGE; or set NCCL_IB_GID_INDEX). Its GIDs: %s", who.c_str(),
               p.addresses().c_str(), describeGids(table).c_str());
  }
  if (note) {
    note->clear();
    if (rank == 3 && versionOf(table, best) == 0)
      *note = strprintf("the GIDs' RoCE versions are not known; using GID %d, the first with a routable %s address",
                        best, p.addresses().c_str());
    else if (rank == 3)
      *note = strprintf("no GID with a routable %s address is RoCE v%d (NCCL_IB_ROCE_VERSION_NUM); using GID %d, "
                        "RoCE v%d", p.addresses().c_str(), p.roceVersion, best, versionOf(table, best));
    else if (rank > 0 && rank < 3)
      *note = strprintf("no GID has a routable %s address; using GID %d, %s", p.addresses().c_str(), best,
                        rank == 2 ? "the first valid RoCE v2 one" : "the first set one");
  }
  return best;
}

}  // namespace loom::ibnet
