// NCCL profiler plugins, loaded as NCCL loads them, fed the events of the work Loom runs.
//
// NCCL_PROFILER_PLUGIN unset: "libnccl-profiler.so"; "none" (any case): no plugin;
// "STATIC_PLUGIN": the program itself; else the name as given, then
// libnccl-profiler-<name>.so (unless it holds a '/' or is already lib*.so). When none of those loads, the NCCL net plugin libraries this process loaded are
// searched, as NCCL searches its own. The newest ncclProfiler_v<N> symbol wins (v6 down to
// v4). Loaded once per process and never unloaded; each communicator initialises the plugin
// for itself (a failed init: no events for that communicator; NCCL goes on calling the
// plugin with the context it did not make) and finalises it when destroyed. The activation
// mask the plugin sets at init is one per process, as NCCL's, read when each event would be
// made (NCCL notes it once per call for the call's events).
//
// The events, as NCCL emits them (v5 and v6; v4 has no API events):
//   GroupApi     from a group's first operation to the outermost ncclGroupEnd's return
//                (depth 1: a lone call's implicit group); states GroupStartApiStop at once,
//                GroupEndApiStart when the group end begins
//   CollApi, P2pApi   the call itself (argument checks, recording), child of GroupApi
//   Group        a communicator's part of a launch (v4's parent of its tasks)
//   Coll, P2p    each operation of the launch, started and stopped when it is queued
//                (child of its API event; v4: of the Group), with NCCL's per-collective
//                sequence number and Loom's algorithm, protocol and channels
//   KernelCh     each channel of the operation while the host engine runs it (child of
//                the Coll / P2p), started when it begins, its KernelChStop state carrying
//                the end; pTimer is the host's clock (CLOCK_REALTIME, ns) where NCCL
//                passes the GPU's globaltimer
// Device memory on the staged path: the task events are made when the call is queued (on the
// calling thread, with the caller's device buffers, the plan the host engine will run), the
// channel events when the host engine runs it (its time, not the copies to and from the
// device); none in a CUDA graph's capture; the device executor's kernels
// and the direct copies of ranks on one device get the API events only. Loom does not emit
// ProxyOp, ProxyStep, ProxyCtrl, NetPlugin or KernelLaunch events; calls served by stock
// NCCL's shadow communicator are stock NCCL's to report (it loads the plugin itself).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "algo/collective.h"
#include "engine/plugin_library.h"

namespace loom {

// The libraries NCCL_PROFILER_PLUGIN's value (null: unset) names, in the order they are tried.
std::vector<std::string> profilerLibraryNames(const char* spec);

// What this process's NCCL_PROFILER_PLUGIN loads (loading it if need be): "<name> (v<N>,
// <path>)" with *path set, or why there is none with *path empty.
std::string processProfilerPlugin(std::string* path);

class Profiler {
 public:
  // The process's profiler plugin initialised for one communicator; null when there is
  // none or its init failed.
  static std::unique_ptr<Profiler> open(uint64_t commHash, const char* commName, int nNodes, int nranks,
                                        int rank);
  ~Profiler();  // the plugin's finalize

  // Whether the activation mask has any of `mask`'s bits (profabi::k*).
  bool wants(int mask) const;

  // API events (v5+); null when the mask or the version leaves them out.
  void* startGroupApi(int depth, bool captured);
  void* startCollApi(void* groupApi, Collective coll, size_t count, int dtype, int root, void* stream,
                     bool captured);
  void* startP2pApi(void* groupApi, bool isSend, size_t count, int dtype, void* stream, bool captured);
  // A launch's events on this communicator.
  void* startGroup();
  void* startColl(void* api, void* group, Collective coll, const void* sendbuff, void* recvbuff, size_t count,
                  int dtype, int root, int nChannels, const char* algo, const char* proto);
  void* startP2p(void* api, void* group, bool isSend, void* buff, size_t count, int dtype, int peer);
  void* startKernelCh(void* task, int channel, uint64_t pTimer);
  void record(void* event, int state, uint64_t pTimer = 0);
  void stop(void* event);  // nothing for null

 private:
  Profiler(const PluginLibrary& lib, void* ctx, int rank) : lib_(lib), ctx_(ctx), rank_(rank) {}
  const PluginLibrary& lib_;
  void* ctx_;
  int rank_;
  std::array<std::atomic<uint64_t>, kCollectiveCount> seq_{};  // NCCL's per-collective numbers
};

// The channel events of one queued operation: made when the engine queues it, run by the
// executor that runs it (begin when it starts, end when it completes or fails).
class TaskProfile {
 public:
  TaskProfile(Profiler* p, std::vector<void*> parents, int channels)
      : prof_(p), parents_(std::move(parents)), channels_(channels) {}
  ~TaskProfile() { end(); }  // a task dropped before it ran: nothing was started
  void begin();
  void end();

 private:
  Profiler* prof_;
  std::vector<void*> parents_;  // the operations' Coll / P2p events (null ones skipped)
  int channels_;                // per parent
  std::vector<void*> running_;
  bool begun_ = false, ended_ = false;
};

}  // namespace loom
