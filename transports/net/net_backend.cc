#include "transports/net/net_backend.h"

#include <strings.h>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "transports/net/ib_backend.h"
#include "transports/net/plugin_api.h"
#include "transports/net/plugin_backend.h"
#include "transports/net/tcp_backend.h"
#include "transports/net/ucx_backend.h"

namespace loom {
namespace {

StringKnob kNet("LOOM_NET", "NCCL_NET", "",
                "Network backend for connections between hosts, by name (case-insensitive): "
                "an NCCL net plugin's own name, IB (InfiniBand/RoCE verbs), Socket (TCP "
                "through the generic network pump), UCX (UCP tagged messages; UCX_TLS picks "
                "its transports) or UCX_RMA (UCP RMA put; transports with native RMA). Empty: "
                "the first NCCL net plugin that starts, else IB where an RDMA port is active, "
                "else the built-in socket transport");


}  // namespace

void netNoDmaBuf(const char* what) {
  LOOM_THROW(kInternalError, "this network backend cannot register DMA-BUF memory with %s", what);
}

std::vector<NetBackendSpec> netBackends() {
  std::vector<NetBackendSpec> all;
  // Plugins first, as NCCL orders them; each answers to its own name.
  for (const auto& p : processNetPlugins().plugins)
    all.push_back({p->name(), [p](const NetContext& c) { return makePluginNetBackend(p, c); }});
  // Verbs where built, as NCCL's "IB"; libibverbs is loaded when a communicator starts it.
  if (verbsBuiltIn())
    all.push_back({"IB", [](const NetContext& c) { return makeIbNetBackend(c); }});
  // NCCL calls its TCP backend "Socket": NCCL_NET=Socket means the same here.
  all.push_back({"Socket", makeTcpNetBackend});
  // UCX where it is built (NCCL offers it as a plugin); libucp is loaded only when a
  // communicator starts the backend, which fails naming why if it cannot.
  if (ucxBuiltIn()) {
    all.push_back({"UCX", [](const NetContext& c) { return makeUcxNetBackend(c); }});
    all.push_back({"UCX_RMA", [](const NetContext& c) { return makeUcxNetBackend(c, {}, true); }});
  }
  return all;
}

NetBackendSpec findNetBackend(const std::string& name) {
  std::vector<NetBackendSpec> all = netBackends();
  std::string names;
  for (const NetBackendSpec& b : all) {
    if (strcasecmp(b.name.c_str(), name.c_str()) == 0) return b;
    names += (names.empty() ? "" : ", ") + b.name;
  }
  std::string failures;
  for (const std::string& f : processNetPlugins().failures) failures += "; " + f;
  if (!ucxBuiltIn()) failures += "; UCX: " + ucxUnavailable();
  if (!verbsBuiltIn()) failures += "; IB: " + verbsUnavailable();
  LOOM_THROW(kInvalidArgument, "NCCL_NET=%s: no network backend of that name; this process has: %s%s",
             name.c_str(), names.c_str(), failures.c_str());
}

std::string selectedNetBackend() { return kNet.get(); }

StartedNet startNetBackend(const NetContext& ctx) {
  std::string name = selectedNetBackend();
  if (!name.empty()) {
    NetBackendSpec spec = findNetBackend(name);
    StartedNet n{spec.make(ctx), spec.name};
    if (n.backend->devices() < 1)
      LOOM_THROW(kSystemError, "rank %d: NCCL_NET=%s: the %s backend found no network device",
                 ctx.rank, name.c_str(), spec.name.c_str());
    return n;
  }
  const PluginLoad& plugins = processNetPlugins();
  for (const auto& p : plugins.plugins) {
    try {
      StartedNet n{makePluginNetBackend(p, ctx), p->name()};
      LOOM_INFO(kLogNet | kLogInit, "rank %d: NET/Plugin: using %s", ctx.rank,
                p->describe().c_str());
      return n;
    } catch (const Error& e) {
      // As NCCL: a plugin that does not start gives way to the next, then the built-ins.
      if (plugins.requested)
        LOOM_WARN("%s; trying the next network", e.what());
      else
        LOOM_INFO(kLogNet | kLogInit, "%s; trying the next network", e.what());
    }
  }
  // As NCCL: verbs where an RDMA port is active, unless NCCL_IB_DISABLE; a port that
  // fails to start gives way to the socket transport. A malformed NCCL_IB_* value fails
  // the init instead (kInvalidArgument: the job asked for something verbs cannot do).
  std::string why;
  if (ibIsDefault(&why)) {
    try {
      StartedNet n{makeIbNetBackend(ctx), "IB"};
      LOOM_INFO(kLogNet | kLogInit, "rank %d: NET/IB: using verbs", ctx.rank);
      return n;
    } catch (const Error& e) {
      if (e.code() == Code::kInvalidArgument) throw;
      LOOM_WARN("%s; using the socket transport", e.what());
    }
  } else {
    LOOM_INFO(kLogNet | kLogInit, "rank %d: NET/IB: not used: %s", ctx.rank, why.c_str());
  }
  return {};
}

}  // namespace loom
