// NCCL net plugins, loaded as NCCL 2.28 loads them, and seen through one interface.
//
// NCCL_NET_PLUGIN unset: "libnccl-net.so"; "none" (any case) or empty: no plugin; else a
// comma list, each entry tried as given and then as libnccl-net-<entry>.so (unless it
// holds a '/' or is already lib*.so). In each library the newest ncclNetPlugin_v<N>
// symbol wins (v11 down to v6). PluginApi presents every version in v11's shape with
// size_t sizes: the adapters narrow sizes for v6-v8 (at most 1 GiB a message, as NCCL),
// drop what older versions lack, and init v6-v10 plugins once per process (they have no
// per-communicator context) while v11 plugins get a context per communicator.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transports/net/net_backend.h"
#include "transports/net/plugin_abi.h"

namespace loom {

class PluginApi {
 public:
  virtual ~PluginApi() = default;
  int version() const { return version_; }
  const std::string& name() const { return name_; }  // the plugin's own name (NCCL_NET)
  const std::string& path() const { return path_; }
  std::string describe() const;  // "<name> (v<N>, <path>)"

  using R = netabi::Result;
  // Per communicator; v6-v10: the first init of the process calls the plugin's.
  virtual R init(void** ctx, uint64_t commId) = 0;
  virtual void finalize(void* ctx) = 0;
  virtual R devices(int* n) = 0;
  virtual R properties(int dev, NetProperties* p) = 0;
  virtual R listen(void* ctx, int dev, void* handle, void** comm) = 0;
  virtual R connect(void* ctx, int dev, void* handle, void** comm) = 0;
  virtual R accept(void* listenComm, void** comm) = 0;
  virtual R regMr(void* comm, void* data, size_t bytes, int type, void** mh) = 0;
  virtual R regMrDmaBuf(void* comm, void* data, size_t bytes, int type, uint64_t offset, int fd,
                        void** mh) = 0;
  virtual R deregMr(void* comm, void* mh) = 0;
  virtual R isend(void* comm, void* data, size_t bytes, int tag, void* mh, void** req) = 0;
  virtual R irecv(void* comm, void* data, size_t bytes, int tag, void* mh, void** req) = 0;
  virtual R iflush(void* comm, void* data, int bytes, void* mh, void** req) = 0;
  virtual R test(void* req, int* done, int* bytes) = 0;
  virtual R closeSend(void* comm) = 0;
  virtual R closeRecv(void* comm) = 0;
  virtual R closeListen(void* comm) = 0;

 protected:
  PluginApi(int version, std::string name, std::string path)
      : version_(version), name_(std::move(name)), path_(std::move(path)) {}

 private:
  int version_;
  std::string name_;
  std::string path_;
};

// What a plugin prints through the logger NCCL hands it (ncclDebugLogger_t), as Loom's log
// line: under the subsystems it names, else `defaultSubsys`, after "<prefix>: ".
void pluginLogV(uint64_t defaultSubsys, const char* prefix, int level, unsigned long flags,
                const char* file, int line, const char* fmt, va_list ap);

// "ncclSystemError" and so on.
const char* netResultName(netabi::Result r);

// The libraries one NCCL_NET_PLUGIN entry names, in the order they are tried: as given,
// then <prefix>-<entry>.so unless it holds a '/' or is already lib*.so (NCCL's rule for its
// plugins of every kind: prefix libnccl-net, libnccl-tuner ...).
std::vector<std::string> pluginLibraryNames(const std::string& entry, const char* prefix = "libnccl-net");

struct PluginLoad {
  std::vector<std::shared_ptr<PluginApi>> plugins;  // in NCCL_NET_PLUGIN's order
  std::vector<std::string> failures;  // per entry: the names tried and dlerror, or no symbol
  bool requested = false;             // NCCL_NET_PLUGIN was set (not to none)
};

// Loads what `spec` (NCCL_NET_PLUGIN's value; null: unset) names. Never throws.
PluginLoad loadNetPlugins(const char* spec);
// For this process's NCCL_NET_PLUGIN, loaded once per distinct value; libraries stay
// loaded for the life of the process.
const PluginLoad& processNetPlugins();

}  // namespace loom
