#include "bench/common/cuda_memory.h"

#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <mutex>

#include "bench/common/bench_error.h"

namespace loom::bench {

using CUresult = int;
using CUdeviceptr = unsigned long long;

struct CudaDriver::Api {
  CUresult (*init)(unsigned);
  CUresult (*deviceGetCount)(int*);
  CUresult (*deviceGetName)(char*, int, int);
  CUresult (*primaryCtxRetain)(void**, int);
  CUresult (*ctxSetCurrent)(void*);
  CUresult (*memAlloc)(CUdeviceptr*, size_t);
  CUresult (*memFree)(CUdeviceptr);
  CUresult (*streamCreate)(void**, unsigned);
  CUresult (*streamDestroy)(void*);
  CUresult (*streamSynchronize)(void*);
  CUresult (*memcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*memcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*getErrorString)(CUresult, const char**);
  // Optional: CUDA graphs.
  CUresult (*beginCapture)(void*, int);
  CUresult (*endCapture)(void*, void**);
  CUresult (*instantiate)(void**, void*, unsigned long long);
  CUresult (*graphLaunch)(void*, void*);
  CUresult (*execDestroy)(void*);
  CUresult (*graphDestroy)(void*);
};

namespace {

template <typename Fn>
bool bind(void* lib, Fn*& fn, const char* name) {
  fn = reinterpret_cast<Fn*>(dlsym(lib, name));
  return fn != nullptr;
}

}  // namespace

const CudaDriver* CudaDriver::get(std::string* why) {
  static std::once_flag once;
  static CudaDriver* drv = nullptr;
  static std::string absent;
  std::call_once(once, [] {
    const char* env = getenv("LOOM_CUDA_DRIVER_LIBRARY");
    const char* path = env && *env ? env : "libcuda.so.1";
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      absent = std::string("no CUDA driver (") + dlerror() + ")";
      return;
    }
    auto* api = new Api{};
    bool ok = bind(lib, api->init, "cuInit") && bind(lib, api->deviceGetCount, "cuDeviceGetCount") &&
              bind(lib, api->primaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
              bind(lib, api->ctxSetCurrent, "cuCtxSetCurrent") &&
              bind(lib, api->memAlloc, "cuMemAlloc_v2") && bind(lib, api->memFree, "cuMemFree_v2") &&
              bind(lib, api->streamCreate, "cuStreamCreate") &&
              bind(lib, api->streamDestroy, "cuStreamDestroy_v2") &&
              bind(lib, api->streamSynchronize, "cuStreamSynchronize") &&
              bind(lib, api->memcpyHtoD, "cuMemcpyHtoD_v2") &&
              bind(lib, api->memcpyDtoH, "cuMemcpyDtoH_v2");
    bind(lib, api->deviceGetName, "cuDeviceGetName");
    bind(lib, api->getErrorString, "cuGetErrorString");
    bind(lib, api->beginCapture, "cuStreamBeginCapture_v2");
    bind(lib, api->endCapture, "cuStreamEndCapture");
    bind(lib, api->instantiate, "cuGraphInstantiateWithFlags");
    bind(lib, api->graphLaunch, "cuGraphLaunch");
    bind(lib, api->execDestroy, "cuGraphExecDestroy");
    bind(lib, api->graphDestroy, "cuGraphDestroy");
    int count = 0;
    if (!ok) {
      absent = std::string(path) + " lacks a CUDA driver function the tools use";
    } else if (CUresult r = api->init(0); r != 0) {
      absent = "cuInit failed (CUDA error " + std::to_string(r) + "): no usable GPU";
    } else if (api->deviceGetCount(&count) != 0 || count < 1) {
      absent = "the CUDA driver reports no GPU";
    } else {
      drv = new CudaDriver();  // kept for the process's life, as the driver is
      drv->api_ = api;
      drv->count_ = count;
      return;
    }
    delete api;
  });
  if (!drv && why) *why = absent;
  return drv;
}

namespace {

void check(const CudaDriver::Api* api, CUresult r, const char* what) {
  if (r == 0) return;
  const char* text = nullptr;
  if (api->getErrorString) api->getErrorString(r, &text);
  benchFail(Status::kCudaError, "%s failed: %s (CUDA error %d)", what, text ? text : "?", r);
}

}  // namespace

void CudaDriver::makeCurrent(int device) const {
  void* ctx = nullptr;
  check(api_, api_->primaryCtxRetain(&ctx, device), "cuDevicePrimaryCtxRetain");
  check(api_, api_->ctxSetCurrent(ctx), "cuCtxSetCurrent");
}

void* CudaDriver::alloc(size_t bytes) const {
  CUdeviceptr p = 0;
  check(api_, api_->memAlloc(&p, bytes), "cuMemAlloc");
  return reinterpret_cast<void*>(p);
}

void CudaDriver::free(void* p) const {
  if (p) api_->memFree(reinterpret_cast<CUdeviceptr>(p));
}

void* CudaDriver::createStream() const {
  void* s = nullptr;
  check(api_, api_->streamCreate(&s, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate");
  return s;
}

void CudaDriver::destroyStream(void* s) const {
  if (s) api_->streamDestroy(s);
}

void CudaDriver::sync(void* stream) const {
  check(api_, api_->streamSynchronize(stream), "cuStreamSynchronize");
}

void CudaDriver::toDevice(void* dst, const void* src, size_t bytes) const {
  if (!bytes) return;
  check(api_, api_->memcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, bytes), "cuMemcpyHtoD");
  // From pageable memory the copy may return before the device holds the bytes (the legacy
  // stream still moves them), and a rank's stream is non-blocking: nothing would order the
  // collective after it. Waiting for the legacy stream (CU_STREAM_LEGACY) does, without
  // waiting for another rank's stream as a context-wide sync would.
  check(api_, api_->streamSynchronize(reinterpret_cast<void*>(0x1)), "cuStreamSynchronize (legacy)");
}

void CudaDriver::toHost(void* dst, const void* src, size_t bytes) const {
  if (bytes) check(api_, api_->memcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), bytes), "cuMemcpyDtoH");
}

std::string CudaDriver::name(int device) const {
  char buf[256] = {};
  if (!api_->deviceGetName || api_->deviceGetName(buf, sizeof(buf) - 1, device) != 0)
    return "CUDA device " + std::to_string(device);
  return buf;
}

bool CudaDriver::hasGraphs() const {
  return api_->beginCapture && api_->endCapture && api_->instantiate && api_->graphLaunch &&
         api_->execDestroy && api_->graphDestroy;
}

void CudaDriver::beginCapture(void* stream) const {
  check(api_, api_->beginCapture(stream, 1 /* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL */),
        "cuStreamBeginCapture");
}

void* CudaDriver::endCapture(void* stream) const {
  void* graph = nullptr;
  check(api_, api_->endCapture(stream, &graph), "cuStreamEndCapture");
  void* exec = nullptr;
  CUresult r = api_->instantiate(&exec, graph, 0);
  api_->graphDestroy(graph);  // the executable keeps what it needs
  check(api_, r, "cuGraphInstantiateWithFlags");
  return exec;
}

void CudaDriver::discardCapture(void* stream) const {
  void* graph = nullptr;
  if (api_->endCapture(stream, &graph) == 0 && graph) api_->graphDestroy(graph);
}

void CudaDriver::launchGraph(void* exec, void* stream) const {
  check(api_, api_->graphLaunch(exec, stream), "cuGraphLaunch");
}

void CudaDriver::destroyGraph(void* exec) const {
  if (exec) api_->execDestroy(exec);
}

DeviceBuffer::DeviceBuffer(const CudaDriver& drv, size_t bytes, bool viaNccl)
    : drv_(drv), size_(bytes), viaNccl_(viaNccl) {
  size_t n = bytes < 64 ? 64 : bytes;
  if (viaNccl_) {
    void* d = nullptr;
    if (ncclMemAlloc(&d, n) != ncclSuccess)
      benchFail(Status::kNcclError, "ncclMemAlloc of %zu bytes failed: %s", n,
                ncclGetLastError(nullptr));
    dev_ = static_cast<char*>(d);
  } else {
    dev_ = static_cast<char*>(drv_.alloc(n));
  }
  void* p = nullptr;
  if (posix_memalign(&p, 4096, n) != 0) {
    release();
    benchFail(Status::kInternalError, "cannot allocate %zu bytes of host memory", bytes);
  }
  host_ = static_cast<char*>(p);
}

void DeviceBuffer::release() {
  if (viaNccl_) ncclMemFree(dev_);
  else drv_.free(dev_);
}

DeviceBuffer::~DeviceBuffer() {
  release();
  ::free(host_);
}

void DeviceBuffer::upload(const void* mirrorPtr, size_t bytes) const {
  drv_.toDevice(onDevice(mirrorPtr), mirrorPtr, bytes);
}

void DeviceBuffer::download(const void* mirrorPtr, size_t bytes) const {
  drv_.toHost(const_cast<void*>(mirrorPtr), onDevice(mirrorPtr), bytes);
}

}  // namespace loom::bench
