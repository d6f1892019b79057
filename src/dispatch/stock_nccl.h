// The stock NCCL library that Loom may hand calls to (the fallback, LOOM_NCCL_FALLBACK).
//
// Found by absolute path, never by the bare name "libnccl.so.2": under LD_PRELOAD, or with
// Loom's drop-in first on the library path, that name is Loom itself. Candidates, in order:
// LOOM_NCCL_LIBRARY alone when it is set; else libnccl.so.2 in each LD_LIBRARY_PATH
// directory, the loader cache (/etc/ld.so.cache), the CUDA toolkit (CUDA_HOME, CUDA_PATH,
// /usr/local/cuda) and PyTorch's wheel (nvidia/nccl/lib beside a loaded library of a
// site-packages directory). A candidate that is the file Loom runs from (same device and
// inode), or any library exporting Loom's own entry points, is refused.
//
// The library is opened RTLD_LOCAL | RTLD_DEEPBIND: its calls to its own entry points (stock
// NCCL's ncclBroadcast calls its ncclBroadcast) must bind inside it, not to the process's
// first definition, which is Loom's when Loom is preloaded or linked first. Sanitizer
// runtimes refuse RTLD_DEEPBIND, so sanitizer builds report the fallback unavailable.
#pragma once

#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

namespace loom::dispatch {

// Stock NCCL's entry points, bound from the library found.
struct StockApi {
  ncclResult_t (*getVersion)(int*) = nullptr;
  ncclResult_t (*getUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*commInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*commDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*commAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*commGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  const char* (*getErrorString)(ncclResult_t) = nullptr;
  const char* (*getLastError)(ncclComm_t) = nullptr;
  ncclResult_t (*allReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                         cudaStream_t) = nullptr;
  ncclResult_t (*allGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*reduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*groupStart)() = nullptr;
  ncclResult_t (*groupEnd)() = nullptr;
};

class StockNccl {
 public:
  ~StockNccl();
  StockNccl(const StockNccl&) = delete;
  StockNccl& operator=(const StockNccl&) = delete;

  const std::string& path() const { return path_; }  // absolute
  int version() const { return version_; }           // its ncclGetVersion
  const StockApi& api() const { return api_; }

  // Opens the library at `path` (absolute) as described above. nullptr with `why` set when
  // it is missing, is Loom, is no NCCL, or cannot be opened here.
  static std::unique_ptr<StockNccl> open(const std::string& path, std::string* why);

 private:
  StockNccl() = default;
  void* handle_ = nullptr;
  std::string path_;
  int version_ = 0;
  StockApi api_;
};

// Where the stock library may be, in the order tried (absolute paths, existing files,
// each file once).
std::vector<std::string> stockNcclCandidates();

// The first candidate that opens, or nullptr; `tried` (if given) says what each refused
// candidate was and why ("none found" when there were none).
std::unique_ptr<StockNccl> findStockNccl(std::string* tried = nullptr);

// The process's stock library, found and opened on first use, then kept for the life of
// the process (communicators of stock NCCL may be live until exit). nullptr when there is
// none; `why` as for findStockNccl.
const StockNccl* stockNccl(std::string* why = nullptr);

// Whether this build can open a stock library at all (not under a sanitizer runtime).
bool stockNcclSupportedInThisBuild();

}  // namespace loom::dispatch
