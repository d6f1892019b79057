// Loom's C API as this extension reaches it: resolved from libloom.so itself (dlopen with
// RTLD_LOCAL, then dlsym on that handle), never through the process's global symbol
// scope, where a CUDA build of torch may already have put another libnccl.so.2 whose
// nccl* symbols would take these calls.
#pragma once

#include <nccl.h>

#include <string>

namespace loom_torch {

struct LoomApi {
  decltype(&ncclGetUniqueId) getUniqueId;
  decltype(&ncclCommInitRank) commInitRank;
  decltype(&ncclCommDestroy) commDestroy;
  decltype(&ncclCommAbort) commAbort;
  decltype(&ncclCommSplit) commSplit;
  decltype(&ncclCommShrink) commShrink;
  decltype(&ncclGetErrorString) getErrorString;
  decltype(&ncclGetLastError) getLastError;
  decltype(&ncclAllReduce) allReduce;
  decltype(&ncclBroadcast) broadcast;
  decltype(&ncclReduce) reduce;
  decltype(&ncclAllGather) allGather;
  decltype(&ncclReduceScatter) reduceScatter;
  decltype(&ncclSend) send;
  decltype(&ncclRecv) recv;
  decltype(&ncclGroupStart) groupStart;
  decltype(&ncclGroupEnd) groupEnd;
  decltype(&ncclRedOpCreatePreMulSum) redOpCreatePreMulSum;
  decltype(&ncclRedOpDestroy) redOpDestroy;
  decltype(&ncclGetVersion) getVersion;
  std::string path;
};

// Loads libloom once (LOOM_TORCH_LIBRARY, else the library this extension was built
// against); throws std::runtime_error naming the path and dlerror when it cannot.
const LoomApi& loomApi();

}  // namespace loom_torch
