// The single error boundary (DESIGN.md decision 4). Every extern "C" entry point runs its
// body through loom::api::guard(), which turns loom::Error (and any other exception) into
// an ncclResult_t, records the message for ncclGetLastError (per thread, and per
// communicator when one is involved), logs it once at WARN, and never lets an exception
// cross the C boundary.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>
#include <utility>

#include "base/error.h"

namespace loom::api {

// Records `msg` as the last error of the calling thread and, if comm != nullptr, of comm.
void recordError(ncclComm_t comm, ncclResult_t code, const std::string& msg);
void clearThreadError();
const char* threadLastError();

ncclResult_t handleException(const char* fn, ncclComm_t comm);

// Counts the calling thread in comm's calls if comm is live (api/comm.cc), so that an
// abort or destroy on another thread frees comm only after the call has left.
bool enterCall(ncclComm_t comm, uint64_t serial = 0);
void leaveCall(ncclComm_t comm);

// The whole call, its error recording included, is one of comm's calls: from the first
// check of comm to the last write of its error, comm cannot be freed under it.
template <typename Fn>
ncclResult_t guard(const char* fn, ncclComm_t comm, Fn&& body) noexcept {
  struct Hold {
    ncclComm_t c;
    ~Hold() {
      if (c) leaveCall(c);
    }
  } hold{enterCall(comm) ? comm : nullptr};
  try {
    return std::forward<Fn>(body)();
  } catch (...) {
    return handleException(fn, comm);
  }
}

}  // namespace loom::api

// An NCCL entry point is defined under its own name, where grep and tools find it:
//   LOOM_NCCL_API ncclResult_t ncclAllReduce(...) { ... }
// exported and weak, as NCCL's are, so profilers and shims can interpose on it. Its
// profiling name pncclX is a strong alias (LOOM_NCCL_PROFILING_ALIAS(ncclX), at the end of
// the file), so calls made through pncclX always reach Loom's code.
#define LOOM_NCCL_API extern "C" __attribute__((visibility("default"), weak))
#define LOOM_NCCL_PROFILING_ALIAS(func) \
  extern "C" __attribute__((visibility("default"), alias(#func))) decltype(func) p##func
