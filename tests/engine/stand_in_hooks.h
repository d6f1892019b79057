// The stand-in driver's test hooks (stand_in_cuda.cc), reached by dlsym in the library
// that Loom itself loaded, so that the test and Loom share one driver state.
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <string>

namespace loomtest {

struct StandInHooks {
  void (*addRange)(const void* p, size_t bytes, unsigned memType, int managed, int device) =
      nullptr;
  void (*addDeviceRange)(const void* p, size_t bytes, int device) = nullptr;
  void (*clear)() = nullptr;
  void (*setCurrentDevice)(int device) = nullptr;
  void (*setInitResult)(int result) = nullptr;
  void (*setQueryResult)(int result) = nullptr;
  long (*queryCount)() = nullptr;

  // Stream hooks, bound by bindStreams (older stand-in uses need only the ones above).
  // stream: a CUstream, 0 / CU_STREAM_LEGACY, or CU_STREAM_PER_THREAD (the caller's).
  void (*pauseStream)(void* stream) = nullptr;   // starts nothing more until resumed
  void (*resumeStream)(void* stream) = nullptr;
  long (*streamOps)(void* stream) = nullptr;     // operations completed on it so far
  long (*liveUserObjects)() = nullptr;  // user objects whose destroy callback has not run
  // Sets the calling thread's own current device (as cuCtxSetCurrent; -1: none), or with
  // kFollowProcessDevice makes it follow setCurrentDevice's again; returns the previous one.
  int (*exchangeThreadDevice)(int device) = nullptr;
  static constexpr int kFollowProcessDevice = -100;

  // The library open reached: for dlsym of the stand-in's driver functions too.
  void* handle = nullptr;

  // flags: RTLD_NOLOAD to require that the stand-in is already loaded (by Loom), or
  // RTLD_NOW to load it first (to set its cuInit result before Loom probes). Returns ""
  // or why the hooks are not reachable.
  std::string open(const char* path, int flags) {
    void* h = dlopen(path, flags);
    if (!h) {
      const char* e = dlerror();
      return std::string("dlopen(") + path + "): " + (e ? e : "not loaded");
    }
    handle = h;
    bool ok = bind(h, addRange, "loomStandInAddRange") &&
              bind(h, addDeviceRange, "loomStandInAddDeviceRange") &&
              bind(h, clear, "loomStandInClear") &&
              bind(h, setCurrentDevice, "loomStandInSetCurrentDevice") &&
              bind(h, setInitResult, "loomStandInSetInitResult") &&
              bind(h, setQueryResult, "loomStandInSetQueryResult") &&
              bind(h, queryCount, "loomStandInQueryCount");
    return ok ? "" : std::string(path) + " lacks a loomStandIn hook";
  }

  // After open: binds the stream hooks; false if this stand-in lacks them.
  bool bindStreams() {
    return handle && bind(handle, pauseStream, "loomStandInPauseStream") &&
           bind(handle, resumeStream, "loomStandInResumeStream") &&
           bind(handle, streamOps, "loomStandInStreamOps") &&
           bind(handle, liveUserObjects, "loomStandInLiveUserObjects") &&
           bind(handle, exchangeThreadDevice, "loomStandInExchangeThreadDevice");
  }

 private:
  template <typename Fn>
  static bool bind(void* h, Fn*& fn, const char* name) {
    fn = reinterpret_cast<Fn*>(dlsym(h, name));
    return fn != nullptr;
  }
};

}  // namespace loomtest
