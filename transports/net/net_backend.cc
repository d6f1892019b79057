#include "transports/net/net_backend.h"

#include <strings.h>

#include "base/config.h"
#include "base/error.h"
#include "transports/net/tcp_backend.h"

namespace loom {
namespace {

StringKnob kNet("LOOM_NET", "NCCL_NET", "",
                "Network backend for connections between hosts, by name (case-insensitive): "
                "Socket (TCP through the generic network pump). Empty: the built-in socket "
                "transport");

}  // namespace

std::vector<NetBackendSpec> netBackends() {
  // NCCL calls its TCP backend "Socket": NCCL_NET=Socket means the same here.
  return {
      {"Socket", makeTcpNetBackend},
  };
}

NetBackendSpec findNetBackend(const std::string& name) {
  std::vector<NetBackendSpec> all = netBackends();
  std::string names;
  for (const NetBackendSpec& b : all) {
    if (strcasecmp(b.name.c_str(), name.c_str()) == 0) return b;
    names += (names.empty() ? "" : ", ") + b.name;
  }
  LOOM_THROW(kInvalidArgument, "NCCL_NET=%s: no network backend of that name; this build has: %s",
             name.c_str(), names.c_str());
}

std::string selectedNetBackend() { return kNet.get(); }

}  // namespace loom
