#include "loom_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>

#ifndef LOOM_LIBRARY
#define LOOM_LIBRARY "libloom.so"
#endif

namespace loom_torch {
namespace {

template <typename Fn>
void bind(void* lib, Fn*& fn, const char* name, const std::string& path) {
  fn = reinterpret_cast<Fn*>(dlsym(lib, name));
  if (!fn) throw std::runtime_error("loom: " + path + " lacks " + name + " (not Loom?)");
}

LoomApi load() {
  const char* env = getenv("LOOM_TORCH_LIBRARY");
  std::string path = env && *env ? env : LOOM_LIBRARY;
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    throw std::runtime_error("loom: cannot load " + path + ": " + (e ? e : "?") +
                             " (LOOM_TORCH_LIBRARY names another libloom.so)");
  }
  LoomApi a;
  a.path = path;
  bind(lib, a.getUniqueId, "ncclGetUniqueId", path);
  bind(lib, a.commInitRank, "ncclCommInitRank", path);
  bind(lib, a.commDestroy, "ncclCommDestroy", path);
  bind(lib, a.commAbort, "ncclCommAbort", path);
  bind(lib, a.commSplit, "ncclCommSplit", path);
  bind(lib, a.commShrink, "ncclCommShrink", path);
  bind(lib, a.getErrorString, "ncclGetErrorString", path);
  bind(lib, a.getLastError, "ncclGetLastError", path);
  bind(lib, a.allReduce, "ncclAllReduce", path);
  bind(lib, a.broadcast, "ncclBroadcast", path);
  bind(lib, a.reduce, "ncclReduce", path);
  bind(lib, a.allGather, "ncclAllGather", path);
  bind(lib, a.reduceScatter, "ncclReduceScatter", path);
  bind(lib, a.send, "ncclSend", path);
  bind(lib, a.recv, "ncclRecv", path);
  bind(lib, a.groupStart, "ncclGroupStart", path);
  bind(lib, a.groupEnd, "ncclGroupEnd", path);
  bind(lib, a.redOpCreatePreMulSum, "ncclRedOpCreatePreMulSum", path);
  bind(lib, a.redOpDestroy, "ncclRedOpDestroy", path);
  bind(lib, a.getVersion, "ncclGetVersion", path);
  return a;
}

}  // namespace

const LoomApi& loomApi() {
  static std::once_flag once;
  static LoomApi* api = nullptr;
  static std::string error;
  std::call_once(once, [] {
    try {
      api = new LoomApi(load());
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  if (!api) throw std::runtime_error(error);
  return *api;
}

}  // namespace loom_torch
