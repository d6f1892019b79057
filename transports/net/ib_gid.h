// Which GID of a RoCE port the verbs backend's connections use, chosen as NCCL chooses it
// when NCCL_IB_GID_INDEX is not set: among the port's valid GIDs (set, not link-local) of
// the address family NCCL_IB_ADDR_FAMILY (AF_INET, the default, or AF_INET6), inside
// NCCL_IB_ADDR_RANGE (an "address/bits" prefix) where given, the first of RoCE version
// NCCL_IB_ROCE_VERSION_NUM (2 by default), else the first of another version. Where none
// is of that family and range: an error naming the GIDs there are when the family or the
// range was set, else (an IPv6-only port, say) the first valid RoCE v2 GID, then the first
// set one, as Loom chose before. Pure, so that it is tested without a device.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::ibnet {

// One entry of a port's GID table.
struct GidEntry {
  int index;
  std::array<uint8_t, 16> raw;
  int roceVersion;  // 1 or 2 (sysfs gid_attrs/types); 0 when unreadable
};

// NCCL_IB_ADDR_FAMILY, NCCL_IB_ADDR_RANGE and NCCL_IB_ROCE_VERSION_NUM.
struct GidPolicy {
  bool ipv6 = false;       // AF_INET6
  bool familySet = false;  // NCCL_IB_ADDR_FAMILY was given
  std::array<uint8_t, 16> prefix{};  // as a GID: IPv4 addresses IPv4-mapped
  int prefixBits = -1;     // bits of the GID that must match `prefix`; -1: no range
  std::string range;       // NCCL_IB_ADDR_RANGE as given
  int roceVersion = 2;
  // Throws kInvalidArgument naming the knob on a value NCCL would not take either.
  static GidPolicy fromKnobs();
  static GidPolicy parse(const std::string& family, const std::string& range, int64_t version);
  std::string addresses() const;  // "IPv4[ in 10.1.0.0/16]"
};

// A GID as an address: "10.77.0.1" for IPv4-mapped ones, else IPv6 text.
std::string gidText(const std::array<uint8_t, 16>& raw);
bool gidSet(const std::array<uint8_t, 16>& raw);  // not all zero
// "3: 10.77.0.1 (RoCE v2), 7: fd77::1 (RoCE v2)" for the set entries of `table`.
std::string describeGids(const std::vector<GidEntry>& table);

// The index `p` chooses in `table`, or -1 when no GID is set. Throws kInvalidArgument
// (naming `who`, the knobs and the GIDs there are) when the family or range was set and
// no valid GID has them. *note: set when the choice is not what was asked for.
int chooseGid(const std::vector<GidEntry>& table, const GidPolicy& p, const std::string& who,
              std::string* note);

}  // namespace loom::ibnet
