#include "dispatch/stock_nccl.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>

#include "base/config.h"
#include "base/error.h"

namespace loom::dispatch {
namespace {

StringKnob kNcclLibrary("LOOM_NCCL_LIBRARY", "", "",
                        "Absolute path of the stock libnccl.so.2 that Loom may hand calls to "
                        "(default: the first found in LD_LIBRARY_PATH, the loader cache, the "
                        "CUDA toolkit, PyTorch's nvidia/nccl/lib; never Loom itself)");

constexpr const char* kName = "libnccl.so.2";

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool ok = false;
};

FileId idOf(const std::string& path) {
  struct stat st;
  if (path.empty() || stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return {};
  return {st.st_dev, st.st_ino, true};
}

// The file this code runs from: libloom.so, the drop-in libnccl.so.2, or a program that
// links Loom statically.
FileId loomFile() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&loomFile), &info) == 0 || !info.dli_fname) return {};
  return idOf(info.dli_fname);
}

std::vector<std::string> splitPath(const char* value) {
  std::vector<std::string> out;
  std::stringstream ss(value ? value : "");
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty()) out.push_back(dir);
  return out;
}

// Paths in the loader cache ending in /libnccl.so.2: the cache's string table holds them
// as NUL-terminated strings, whatever the version of its header.
std::vector<std::string> loaderCachePaths() {
  std::ifstream f("/etc/ld.so.cache", std::ios::binary);
  if (!f) return {};
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  const std::string suffix = std::string("/") + kName;
  size_t start = 0;
  while (start < data.size()) {
    size_t end = data.find('\0', start);
    if (end == std::string::npos) end = data.size();
    if (data[start] == '/' && end - start > suffix.size() &&
        data.compare(end - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(data.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// PyTorch's CUDA wheels ship NCCL as the nvidia-nccl package: <site-packages>/nvidia/nccl/
// lib. Any loaded library under a site-packages (or dist-packages) directory names one.
std::vector<std::string> wheelPaths() {
  std::vector<std::string> dirs;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) -> int {
        auto* out = static_cast<std::vector<std::string>*>(arg);
        const std::string name = info->dlpi_name ? info->dlpi_name : "";
        for (const char* marker : {"/site-packages/", "/dist-packages/"}) {
          size_t at = name.find(marker);
          if (at != std::string::npos) out->push_back(name.substr(0, at + strlen(marker)));
        }
        return 0;
      },
      &dirs);
  std::vector<std::string> out;
  for (const std::string& d : dirs) out.push_back(d + "nvidia/nccl/lib/" + kName);
  return out;
}

}  // namespace

bool stockNcclSupportedInThisBuild() { return !kSanitized; }

std::vector<std::string> stockNcclCandidates() {
  std::vector<std::string> raw;
  if (kNcclLibrary.isSet()) {
    raw.push_back(kNcclLibrary.get());
  } else {
    for (const std::string& d : splitPath(getenv("LD_LIBRARY_PATH"))) raw.push_back(d + "/" + kName);
    for (const std::string& p : loaderCachePaths()) raw.push_back(p);
    std::vector<std::string> roots;
    for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
      if (const char* v = getenv(var); v && *v) roots.push_back(v);
    roots.push_back("/usr/local/cuda");
    for (const std::string& r : roots)
      for (const char* lib : {"/lib64/", "/lib/"}) raw.push_back(r + lib + kName);
    for (const std::string& p : wheelPaths()) raw.push_back(p);
  }
  // Absolute, existing, each file once (several names often reach one file).
  std::vector<std::string> out;
  std::vector<FileId> seen;
  for (const std::string& p : raw) {
    char* real = realpath(p.c_str(), nullptr);
    if (!real) continue;
    std::string abs = real;
    free(real);
    FileId id = idOf(abs);
    if (!id.ok) continue;
    bool dup = false;
    for (const FileId& s : seen) dup |= s.dev == id.dev && s.ino == id.ino;
    if (dup) continue;
    seen.push_back(id);
    out.push_back(abs);
  }
  return out;
}

std::unique_ptr<StockNccl> StockNccl::open(const std::string& path, std::string* why) {
  auto refuse = [&](const std::string& reason) {
    if (why) *why = path + ": " + reason;
    return nullptr;
  };
  if (path.empty() || path[0] != '/') return refuse("not an absolute path");
  const FileId id = idOf(path), self = loomFile();
  if (!id.ok) return refuse("no such file");
  if (self.ok && id.dev == self.dev && id.ino == self.ino)
    return refuse("is Loom itself (the file this process runs Loom from)");
  if (kSanitized)
    return refuse("not opened in a sanitizer build: the sanitizer runtime refuses RTLD_DEEPBIND, "
                  "which keeps stock NCCL's calls to itself inside it");
  std::string error;
  DynLib dl = DynLib::open({path}, &error, RTLD_DEEPBIND);
  if (!dl.loaded()) return refuse("cannot be opened: " + error);
  if (dl.symbol("loomGetVersionString") != nullptr) return refuse("is a build of Loom, not stock NCCL");
  std::unique_ptr<StockNccl> lib(new StockNccl());
  lib->lib_ = std::move(dl);
  lib->path_ = path;
  StockApi& a = lib->api_;
  const char* missing = nullptr;
  auto need = [&](auto& fn, const char* name) {
    if (!lib->lib_.bind(fn, name) && !missing) missing = name;
  };
  need(a.getVersion, "ncclGetVersion");
  need(a.getUniqueId, "ncclGetUniqueId");
  need(a.commInitRank, "ncclCommInitRank");
  need(a.commDestroy, "ncclCommDestroy");
  need(a.commAbort, "ncclCommAbort");
  need(a.commGetAsyncError, "ncclCommGetAsyncError");
  need(a.getErrorString, "ncclGetErrorString");
  need(a.getLastError, "ncclGetLastError");
  need(a.allReduce, "ncclAllReduce");
  need(a.broadcast, "ncclBroadcast");
  need(a.reduce, "ncclReduce");
  need(a.allGather, "ncclAllGather");
  need(a.reduceScatter, "ncclReduceScatter");
  need(a.send, "ncclSend");
  need(a.recv, "ncclRecv");
  need(a.groupStart, "ncclGroupStart");
  need(a.groupEnd, "ncclGroupEnd");
  need(a.commInitRankConfig, "ncclCommInitRankConfig");
  lib->lib_.bind(a.commFinalize, "ncclCommFinalize");
  lib->lib_.bind(a.redOpCreatePreMulSum, "ncclRedOpCreatePreMulSum");
  lib->lib_.bind(a.redOpDestroy, "ncclRedOpDestroy");
  lib->lib_.bind(a.commRegister, "ncclCommRegister");
  lib->lib_.bind(a.commDeregister, "ncclCommDeregister");
  lib->lib_.bind(a.commWindowRegister, "ncclCommWindowRegister");
  lib->lib_.bind(a.commWindowDeregister, "ncclCommWindowDeregister");
  lib->lib_.bind(a.memAlloc, "ncclMemAlloc");
  lib->lib_.bind(a.memFree, "ncclMemFree");
  lib->lib_.bind(a.devCommCreate, "ncclDevCommCreate");
  lib->lib_.bind(a.devCommDestroy, "ncclDevCommDestroy");
  lib->lib_.bind(a.teamWorld, "ncclTeamWorld");
  lib->lib_.bind(a.teamLsa, "ncclTeamLsa");
  lib->lib_.bind(a.teamRail, "ncclTeamRail");
  lib->lib_.bind(a.teamRankToWorld, "ncclTeamRankToWorld");
  lib->lib_.bind(a.teamRankToLsa, "ncclTeamRankToLsa");
  lib->lib_.bind(a.ginBarrierCreateRequirement, "ncclGinBarrierCreateRequirement");
  lib->lib_.bind(a.lsaBarrierCreateRequirement, "ncclLsaBarrierCreateRequirement");
  lib->lib_.bind(a.llA2ACalcSlots, "ncclLLA2ACalcSlots");
  lib->lib_.bind(a.llA2ACreateRequirement, "ncclLLA2ACreateRequirement");
  lib->lib_.bind(a.winGetUserPtr, "ncclWinGetUserPtr");
  lib->lib_.bind(a.getLsaMultimemDevicePointer, "ncclGetLsaMultimemDevicePointer");
  lib->lib_.bind(a.getPeerDevicePointer, "ncclGetPeerDevicePointer");
  lib->lib_.bind(a.putSignal, "ncclPutSignal");
  lib->lib_.bind(a.signal, "ncclSignal");
  lib->lib_.bind(a.waitSignal, "ncclWaitSignal");
  lib->lib_.bind(a.commMemStats, "ncclCommMemStats");
  lib->lib_.bind(a.commSuspend, "ncclCommSuspend");
  lib->lib_.bind(a.commResume, "ncclCommResume");
  if (missing) return refuse(std::string("is not an NCCL library (no ") + missing + ")");
  if (a.getVersion(&lib->version_) != ncclSuccess || lib->version_ <= 0)
    return refuse("its ncclGetVersion failed");
  return lib;
}

std::unique_ptr<StockNccl> findStockNccl(std::string* tried) {
  std::string refused;
  const std::vector<std::string> candidates = stockNcclCandidates();
  if (kNcclLibrary.isSet() && candidates.empty())
    refused = "LOOM_NCCL_LIBRARY=" + kNcclLibrary.get() + ": no such file";
  for (const std::string& c : candidates) {
    std::string why;
    if (auto lib = StockNccl::open(c, &why)) return lib;
    if (!refused.empty()) refused += "; ";
    refused += why;
  }
  if (tried) *tried = refused.empty() ? "none found" : refused;
  return nullptr;
}

std::string StockNccl::errorText(ncclResult_t rc, ncclComm_t comm) const {
  const char* last = api_.getLastError(comm);
  return strprintf("%s (%d)%s%s", api_.getErrorString(rc), static_cast<int>(rc),
                   last && *last ? ": " : "", last ? last : "");
}

const StockNccl* processStockNccl(std::string* why) {
  static std::once_flag once;
  static const StockNccl* lib = nullptr;
  static std::string* refused = nullptr;
  std::call_once(once, [] {
    std::string tried;
    lib = findStockNccl(&tried).release();  // never freed: see the header
    if (!lib) refused = new std::string(tried);
  });
  if (!lib && why) *why = *refused;
  return lib;
}

}  // namespace loom::dispatch
