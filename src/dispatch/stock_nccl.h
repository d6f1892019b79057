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

#include "base/dl.h"
#include "dispatch/nccl_extra_abi.h"

namespace loom::dispatch {

// Stock NCCL's entry points, bound from the library found (nccl.h's own signatures).
struct StockApi {
  decltype(&ncclGetVersion) getVersion = nullptr;
  decltype(&ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&ncclCommInitRank) commInitRank = nullptr;
  decltype(&ncclCommDestroy) commDestroy = nullptr;
  decltype(&ncclCommAbort) commAbort = nullptr;
  decltype(&ncclCommGetAsyncError) commGetAsyncError = nullptr;
  decltype(&ncclGetErrorString) getErrorString = nullptr;
  decltype(&ncclGetLastError) getLastError = nullptr;
  decltype(&ncclAllReduce) allReduce = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclReduce) reduce = nullptr;
  decltype(&ncclAllGather) allGather = nullptr;
  decltype(&ncclReduceScatter) reduceScatter = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) groupStart = nullptr;
  decltype(&ncclGroupEnd) groupEnd = nullptr;
  decltype(&ncclCommInitRankConfig) commInitRankConfig = nullptr;
  // Optional (nullptr when the library predates them): calls using them fail with a
  // message naming the missing entry point.
  decltype(&ncclCommFinalize) commFinalize = nullptr;
  decltype(&ncclRedOpCreatePreMulSum) redOpCreatePreMulSum = nullptr;
  decltype(&ncclRedOpDestroy) redOpDestroy = nullptr;
  // Buffer registration, windows and memory (NCCL >= 2.19 / 2.27).
  decltype(&ncclCommRegister) commRegister = nullptr;
  decltype(&ncclCommDeregister) commDeregister = nullptr;
  decltype(&ncclCommWindowRegister) commWindowRegister = nullptr;
  decltype(&ncclCommWindowDeregister) commWindowDeregister = nullptr;
  decltype(&ncclMemAlloc) memAlloc = nullptr;
  decltype(&ncclMemFree) memFree = nullptr;
  // The device API's host half (NCCL >= 2.28) and the window lookups (>= 2.29).
  decltype(&ncclDevCommCreate) devCommCreate = nullptr;
  decltype(&ncclDevCommDestroy) devCommDestroy = nullptr;
  decltype(&ncclTeamWorld) teamWorld = nullptr;
  decltype(&ncclTeamLsa) teamLsa = nullptr;
  decltype(&ncclTeamRail) teamRail = nullptr;
  decltype(&ncclTeamRankToWorld) teamRankToWorld = nullptr;
  decltype(&ncclTeamRankToLsa) teamRankToLsa = nullptr;
  decltype(&ncclGinBarrierCreateRequirement) ginBarrierCreateRequirement = nullptr;
  decltype(&ncclLsaBarrierCreateRequirement) lsaBarrierCreateRequirement = nullptr;
  decltype(&ncclLLA2ACalcSlots) llA2ACalcSlots = nullptr;
  decltype(&ncclLLA2ACreateRequirement) llA2ACreateRequirement = nullptr;
  decltype(&ncclWinGetUserPtr) winGetUserPtr = nullptr;
  decltype(&ncclGetLsaMultimemDevicePointer) getLsaMultimemDevicePointer = nullptr;
  decltype(&ncclGetPeerDevicePointer) getPeerDevicePointer = nullptr;
  decltype(&ncclPutSignal) putSignal = nullptr;
  decltype(&ncclSignal) signal = nullptr;
  decltype(&ncclWaitSignal) waitSignal = nullptr;
  decltype(&ncclCommMemStats) commMemStats = nullptr;
  decltype(&ncclCommSuspend) commSuspend = nullptr;
  decltype(&ncclCommResume) commResume = nullptr;
};

class StockNccl {
 public:
  // "error string (code): last error" for a result `rc` of this library; `comm` may be
  // null (stock NCCL then reports its last error of any communicator).
  std::string errorText(ncclResult_t rc, ncclComm_t comm) const;

  const std::string& path() const { return path_; }  // absolute
  int version() const { return version_; }           // its ncclGetVersion
  const StockApi& api() const { return api_; }

  // Opens the library at `path` (absolute) as described above. nullptr with `why` set when
  // it is missing, is Loom, is no NCCL, or cannot be opened here.
  static std::unique_ptr<StockNccl> open(const std::string& path, std::string* why);

 private:
  StockNccl() = default;
  DynLib lib_;  // closed with the object
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

// The stock library for this process's shadow communicators: found and opened on first
// use, never closed (stock NCCL keeps threads and CUDA state that outlive a dlclose).
// nullptr with `why` set when there is none.
const StockNccl* processStockNccl(std::string* why);

// Whether this build can open a stock library at all (not under a sanitizer runtime).
bool stockNcclSupportedInThisBuild();

}  // namespace loom::dispatch
