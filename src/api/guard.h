// The single error boundary (DESIGN.md decision 4). Every extern "C" entry point runs its
// body through loom::api::guard(), which turns loom::Error (and any other exception) into
// an ncclResult_t, records the message for ncclGetLastError (per thread, and per
// communicator when one is involved), logs it once at WARN, and never lets an exception
// cross the C boundary.
#pragma once

#include <nccl.h>

#include <string>
#include <utility>

#include "base/error.h"

namespace loom::api {

// Records `msg` as the last error of the calling thread and, if comm != nullptr, of comm.
void recordError(ncclComm_t comm, ncclResult_t code, const std::string& msg);
void clearThreadError();
const char* threadLastError();

ncclResult_t handleException(const char* fn, ncclComm_t comm);

template <typename Fn>
ncclResult_t guard(const char* fn, ncclComm_t comm, Fn&& body) noexcept {
  try {
    return std::forward<Fn>(body)();
  } catch (...) {
    return handleException(fn, comm);
  }
}

}  // namespace loom::api

// Defines `pncclX` and exports `ncclX` as a weak alias of it, like NCCL, so profilers can
// interpose on either name.
#define LOOM_NCCL_API(ret, func, ...)                                                        \
  extern "C" __attribute__((visibility("default"), weak, alias("p" #func))) ret func(__VA_ARGS__); \
  extern "C" __attribute__((visibility("default"))) ret p##func(__VA_ARGS__)
