#include "bootstrap/unique_id.h"

#include <cstring>

#include "base/config.h"
#include "base/error.h"
#include "base/hmac.h"
#include "base/log.h"

namespace loom {
namespace {

StringKnob kCommId("LOOM_COMM_ID", "NCCL_COMM_ID", "",
                   "Rendezvous address <host>:<port> or [<ipv6>]:<port>; rank 0 runs the root "
                   "there and ncclGetUniqueId encodes it");
StringKnob kJobSecret("LOOM_JOB_SECRET", "", "",
                      "Shared secret for jobs that rendezvous through NCCL_COMM_ID (all ranks "
                      "must agree); unset: derived from the address");
StringKnob kIfName("LOOM_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "",
                   "Interfaces for bootstrap and TCP traffic: prefixes 'eth,ib', '^' to exclude, "
                   "'=' for exact names");
StringKnob kFamily("LOOM_SOCKET_FAMILY", "NCCL_SOCKET_FAMILY", "",
                   "Address family for sockets: AF_INET or AF_INET6 (default: either, IPv4 first)");

struct Wire {
  uint32_t magic;
  uint16_t version;
  uint16_t family;
  uint16_t port;
  uint8_t addr[16];
  uint8_t secret[kSecretBytes];
  uint64_t jobTag;
  uint32_t scope;
};
static_assert(sizeof(Wire) <= kUniqueIdBytes);

}  // namespace

void JobId::encode(void* out) const {
  Wire w{};
  w.magic = kUniqueIdMagic;
  w.version = kWireVersion;
  w.family = static_cast<uint16_t>(root.family());
  w.port = root.port();
  if (root.family() == AF_INET) {
    memcpy(w.addr, &reinterpret_cast<const sockaddr_in*>(&root.storage)->sin_addr, 4);
  } else if (root.family() == AF_INET6) {
    auto* s6 = reinterpret_cast<const sockaddr_in6*>(&root.storage);
    memcpy(w.addr, &s6->sin6_addr, 16);
    w.scope = s6->sin6_scope_id;
  }
  memcpy(w.secret, secret, kSecretBytes);
  w.jobTag = jobTag;
  memset(out, 0, kUniqueIdBytes);
  memcpy(out, &w, sizeof(w));
}

JobId JobId::decode(const void* in) {
  Wire w;
  memcpy(&w, in, sizeof(w));
  if (w.magic != kUniqueIdMagic)
    LOOM_THROW(kInvalidArgument,
               "the ncclUniqueId was not made by Loom's ncclGetUniqueId (bad magic 0x%08x); "
               "pass every rank the id that rank 0 obtained",
               w.magic);
  if (w.version != kWireVersion)
    LOOM_THROW(kInvalidArgument, "the ncclUniqueId has wire version %u, this Loom speaks %u",
               w.version, kWireVersion);
  JobId id;
  if (w.family == AF_INET) {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&id.root.storage);
    s4->sin_family = AF_INET;
    memcpy(&s4->sin_addr, w.addr, 4);
    id.root.len = sizeof(sockaddr_in);
  } else if (w.family == AF_INET6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&id.root.storage);
    s6->sin6_family = AF_INET6;
    memcpy(&s6->sin6_addr, w.addr, 16);
    s6->sin6_scope_id = w.scope;
    id.root.len = sizeof(sockaddr_in6);
  } else {
    LOOM_THROW(kInvalidArgument, "the ncclUniqueId holds no valid root address (family %u)",
               w.family);
  }
  id.root.setPort(w.port);
  memcpy(id.secret, w.secret, kSecretBytes);
  id.jobTag = w.jobTag;
  return id;
}

NetInterface bootstrapInterface() {
  std::string fam = kFamily.get();
  int family = 0;
  if (fam == "AF_INET" || fam == "4") family = AF_INET;
  else if (fam == "AF_INET6" || fam == "6") family = AF_INET6;
  else if (!fam.empty())
    LOOM_THROW(kInvalidArgument, "NCCL_SOCKET_FAMILY=%s: expected AF_INET or AF_INET6",
               fam.c_str());
  std::string spec = kIfName.get();
  std::vector<NetInterface> ifs = findInterfaces(spec, family);
  if (ifs.empty()) {
    std::string avail;
    for (const auto& i : findInterfaces("^", 0)) {
      if (avail.find(i.name + " ") == std::string::npos) avail += i.name + " ";
    }
    LOOM_THROW(kInvalidArgument,
               "NCCL_SOCKET_IFNAME='%s'%s%s matches no usable network interface (up and with "
               "an address); interfaces here: %s",
               spec.c_str(), fam.empty() ? "" : " with NCCL_SOCKET_FAMILY=", fam.c_str(),
               avail.empty() ? "none" : avail.c_str());
  }
  return ifs.front();
}

bool commIdFromEnv(JobId* out) {
  std::string text = kCommId.get();
  if (text.empty()) return false;
  JobId id;
  id.root = SocketAddr::parse(text, "NCCL_COMM_ID");
  std::string secret = kJobSecret.get();
  std::string material = secret.empty() ? "loom-comm-id:" + id.root.str() : "loom-secret:" + secret;
  Digest d = sha256(material.data(), material.size());
  memcpy(id.secret, d.data(), kSecretBytes);
  Digest t = sha256(d.data(), d.size());
  memcpy(&id.jobTag, t.data(), sizeof(id.jobTag));
  *out = id;
  return true;
}

JobId newJobId(bool* rootAddressFixed) {
  JobId id;
  if (commIdFromEnv(&id)) {
    *rootAddressFixed = true;
    return id;
  }
  *rootAddressFixed = false;
  id.root = bootstrapInterface().addr;
  id.root.setPort(0);
  randomBytes(id.secret, kSecretBytes);
  randomBytes(&id.jobTag, sizeof(id.jobTag));
  return id;
}

}  // namespace loom
