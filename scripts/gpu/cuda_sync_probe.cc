// Which CUDA driver calls wait for another stream of the same context that is held by
// cuStreamWaitValue32 on a host flag, as a staged collective holds its stream until the
// other ranks arrive. With ranks as threads in one context, such a call on one rank's
// thread while another rank's stream waits for it is a deadlock. Run by
// scripts/gpu_check.sh on a GPU (built at prepare: g++ -O1 cuda_sync_probe.cc -ldl -lpthread).
// Prints one line per call: "returns" or "WAITS" (it returned only after the flag was set).
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUstream = void*;
using CUcontext = void*;
using CUevent = void*;

#define API(X)                                                                       \
  X(cuInit, CUresult (*)(unsigned))                                                  \
  X(cuDevicePrimaryCtxRetain, CUresult (*)(CUcontext*, int))                         \
  X(cuCtxSetCurrent, CUresult (*)(CUcontext))                                        \
  X(cuStreamCreate, CUresult (*)(CUstream*, unsigned))                               \
  X(cuStreamDestroy_v2, CUresult (*)(CUstream))                                      \
  X(cuStreamSynchronize, CUresult (*)(CUstream))                                     \
  X(cuStreamWaitValue32_v2, CUresult (*)(CUstream, CUdeviceptr, uint32_t, unsigned)) \
  X(cuMemHostAlloc, CUresult (*)(void**, size_t, unsigned))                          \
  X(cuMemHostGetDevicePointer_v2, CUresult (*)(CUdeviceptr*, void*, unsigned))       \
  X(cuMemFreeHost, CUresult (*)(void*))                                              \
  X(cuMemAllocHost_v2, CUresult (*)(void**, size_t))                                 \
  X(cuMemAlloc_v2, CUresult (*)(CUdeviceptr*, size_t))                               \
  X(cuMemFree_v2, CUresult (*)(CUdeviceptr))                                         \
  X(cuMemHostRegister_v2, CUresult (*)(void*, size_t, unsigned))                     \
  X(cuMemHostUnregister, CUresult (*)(void*))                                        \
  X(cuMemcpyHtoD_v2, CUresult (*)(CUdeviceptr, const void*, size_t))                 \
  X(cuMemcpyDtoH_v2, CUresult (*)(void*, CUdeviceptr, size_t))                       \
  X(cuMemcpyAsync, CUresult (*)(CUdeviceptr, CUdeviceptr, size_t, CUstream))         \
  X(cuMemsetD8_v2, CUresult (*)(CUdeviceptr, unsigned char, size_t))                 \
  X(cuLaunchHostFunc, CUresult (*)(CUstream, void (*)(void*), void*))                \
  X(cuEventCreate, CUresult (*)(CUevent*, unsigned))                                 \
  X(cuEventRecord, CUresult (*)(CUevent, CUstream))                                  \
  X(cuEventSynchronize, CUresult (*)(CUevent))                                       \
  X(cuEventDestroy_v2, CUresult (*)(CUevent))                                      \
  X(cuStreamBeginCapture_v2, CUresult (*)(CUstream, int))                            \
  X(cuStreamEndCapture, CUresult (*)(CUstream, void**))                              \
  X(cuGraphInstantiateWithFlags, CUresult (*)(void**, void*, unsigned long long))    \
  X(cuGraphLaunch, CUresult (*)(void*, CUstream))                                    \
  X(cuGraphExecDestroy, CUresult (*)(void*))                                         \
  X(cuGraphDestroy, CUresult (*)(void*))

#define DECL(name, type) \
  using name##_t = type;  \
  name##_t name;
struct Api {
  API(DECL)
} d;

int main() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) return std::printf("probe: no libcuda.so.1\n"), 2;
#define BIND(name, type)                                               \
  d.name = reinterpret_cast<type>(dlsym(lib, #name));                  \
  if (!d.name) return std::printf("probe: no %s\n", #name), 2;
  API(BIND)
  CUcontext ctx = nullptr;
  if (d.cuInit(0) || d.cuDevicePrimaryCtxRetain(&ctx, 0) || d.cuCtxSetCurrent(ctx))
    return std::printf("probe: no context\n"), 2;
  CUstream held = nullptr, other = nullptr;
  d.cuStreamCreate(&held, 1);
  d.cuStreamCreate(&other, 1);
  void* flagHost = nullptr;
  d.cuMemHostAlloc(&flagHost, 4096, 1 | 2);
  CUdeviceptr flagDev = 0;
  d.cuMemHostGetDevicePointer_v2(&flagDev, flagHost, 0);
  auto* flag = static_cast<volatile uint32_t*>(flagHost);
  CUdeviceptr dev = 0;
  d.cuMemAlloc_v2(&dev, 1 << 20);
  void* pinned = nullptr;
  d.cuMemAllocHost_v2(&pinned, 1 << 20);
  std::vector<char> pageable(1 << 20, 1);
  int stuck = 0;

  auto probe = [&](const char* name, std::function<void()> setup, std::function<CUresult()> call) {
    setup();
    *flag = 0;
    d.cuStreamWaitValue32_v2(held, flagDev, 1, 0 /* EQ */);
    std::atomic<bool> done{false};
    std::atomic<int> rc{-1};
    std::thread t([&] {
      d.cuCtxSetCurrent(ctx);
      rc = call();
      done = true;
    });
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    while (!done && std::chrono::steady_clock::now() < until) usleep(1000);
    const bool waited = !done;
    *flag = 1;
    until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (!done && std::chrono::steady_clock::now() < until) usleep(1000);
    if (!done) {
      std::printf("probe: %-58s STILL BLOCKED after the flag was set\n", name);
      ++stuck;
      t.detach();
      return;
    }
    t.join();
    d.cuStreamSynchronize(held);
    std::printf("probe: %-58s %s (rc %d)\n", name, waited ? "WAITS" : "returns", rc.load());
    std::fflush(stdout);
  };
  auto none = [] {};
  void* h = nullptr;
  CUdeviceptr p = 0;
  void* reg = nullptr;
  probe("cuMemHostAlloc 64 KiB", none, [&] { return d.cuMemHostAlloc(&h, 1 << 16, 1 | 2); });
  probe("cuMemFreeHost", none, [&] { return d.cuMemFreeHost(h); });
  probe("cuMemAllocHost 64 KiB", none, [&] { return d.cuMemAllocHost_v2(&h, 1 << 16); });
  probe("cuMemFreeHost (cuMemAllocHost's)", none, [&] { return d.cuMemFreeHost(h); });
  probe("cuMemAlloc 1 MiB", none, [&] { return d.cuMemAlloc_v2(&p, 1 << 20); });
  probe("cuMemFree", none, [&] { return d.cuMemFree_v2(p); });
  probe("cuMemHostRegister 1 MiB", [&] { reg = aligned_alloc(4096, 1 << 20); },
        [&] { return d.cuMemHostRegister_v2(reg, 1 << 20, 1 | 2); });
  probe("cuMemHostUnregister", none, [&] { return d.cuMemHostUnregister(reg); });
  probe("cuMemcpyHtoD 64 KiB pageable", none, [&] { return d.cuMemcpyHtoD_v2(dev, pageable.data(), 1 << 16); });
  probe("cuMemcpyDtoH 64 KiB pageable", none, [&] { return d.cuMemcpyDtoH_v2(pageable.data(), dev, 1 << 16); });
  probe("cuMemcpyHtoD 64 KiB pinned", none, [&] { return d.cuMemcpyHtoD_v2(dev, pinned, 1 << 16); });
  probe("cuMemsetD8 1 MiB", none, [&] { return d.cuMemsetD8_v2(dev, 0, 1 << 20); });
  probe("cuStreamSynchronize(CU_STREAM_LEGACY)", none,
        [&] { return d.cuStreamSynchronize(reinterpret_cast<CUstream>(0x1)); });
  probe("cuMemcpyAsync pinned->device on another stream + its sync", none, [&] {
    CUresult r = d.cuMemcpyAsync(dev, reinterpret_cast<CUdeviceptr>(pinned), 1 << 16, other);
    return r ? r : d.cuStreamSynchronize(other);
  });
  probe("cuMemcpyAsync pageable->device on another stream + its sync", none, [&] {
    CUresult r = d.cuMemcpyAsync(dev, reinterpret_cast<CUdeviceptr>(pageable.data()), 1 << 16, other);
    return r ? r : d.cuStreamSynchronize(other);
  });
  probe("cuLaunchHostFunc on another stream + its sync", none, [&] {
    CUresult r = d.cuLaunchHostFunc(other, [](void*) {}, nullptr);
    return r ? r : d.cuStreamSynchronize(other);
  });
  probe("cuStreamCreate + cuStreamDestroy", none, [&] {
    CUstream s = nullptr;
    CUresult r = d.cuStreamCreate(&s, 1);
    return r ? r : d.cuStreamDestroy_v2(s);
  });
  probe("cuEventCreate/Record(another stream)/Synchronize/Destroy", none, [&] {
    CUevent e = nullptr;
    CUresult r = d.cuEventCreate(&e, 2);
    if (!r) r = d.cuEventRecord(e, other);
    if (!r) r = d.cuEventSynchronize(e);
    d.cuEventDestroy_v2(e);
    return r;
  });
  probe("32 more streams, a copy on each + their syncs", none, [&] {
    CUresult r = 0;
    std::vector<CUstream> ss(32);
    for (auto& s : ss) r |= d.cuStreamCreate(&s, 1);
    for (auto& s : ss) r |= d.cuMemcpyAsync(dev, reinterpret_cast<CUdeviceptr>(pinned), 4096, s);
    for (auto& s : ss) r |= d.cuStreamSynchronize(s);
    for (auto& s : ss) d.cuStreamDestroy_v2(s);
    return r;
  });
  // CUDA graphs, as a benchmark's rank thread captures, instantiates, replays and destroys
  // its own while another rank's stream is held.
  void* graph = nullptr;
  void* exec = nullptr;
  auto capture = [&] {
    d.cuStreamBeginCapture_v2(other, 1 /* thread local */);
    d.cuMemcpyAsync(dev, reinterpret_cast<CUdeviceptr>(pinned), 4096, other);
    d.cuLaunchHostFunc(other, [](void*) {}, nullptr);
    return d.cuStreamEndCapture(other, &graph);
  };
  probe("stream capture (copy + host function) on another stream", none, capture);
  probe("cuGraphInstantiateWithFlags", none, [&] { return d.cuGraphInstantiateWithFlags(&exec, graph, 0); });
  probe("cuGraphLaunch on another stream + its sync", none, [&] {
    CUresult r = d.cuGraphLaunch(exec, other);
    return r ? r : d.cuStreamSynchronize(other);
  });
  probe("cuGraphExecDestroy", none, [&] { return d.cuGraphExecDestroy(exec); });
  probe("cuGraphDestroy", none, [&] { return d.cuGraphDestroy(graph); });
  std::printf("probe: done, %d call(s) still blocked\n", stuck);
  std::fflush(stdout);
  _exit(stuck ? 3 : 0);
}
