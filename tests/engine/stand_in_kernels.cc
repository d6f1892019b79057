// A stand-in for libloom-cuda-kernels.so (a test aid, with the stand-in driver): the module's
// loomCudaReduce and loomCudaReduceMulti, computed by Loom's CPU reductions (kernels/reduce.h) in a host function
// on the caller's stand-in stream, which reads and writes the stand-in's device memory
// through the stand-in's own hooks (loomStandInReadDevice, loomStandInWriteDevice). Selected with
// LOOM_CUDA_KERNELS_LIBRARY; the real module runs the same arithmetic on a GPU
// (tests/kernels/cuda_parity_test.cc checks it against the CPU loops there).
#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "kernels/arith.h"
#include "kernels/cuda/cuda_kernels_abi.h"
#include "kernels/reduce.h"

namespace {

using HostFn = void (*)(void*);
using MoveFn = void (*)(void* dst, const void* src, size_t n);
int (*gLaunchHostFunc)(void* stream, HostFn fn, void* user) = nullptr;
MoveFn gRead = nullptr, gWrite = nullptr;

bool bindDriver() {
  static const bool ok = [] {
    const char* path = getenv("LOOM_CUDA_DRIVER_LIBRARY");
    void* h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return false;
    gLaunchHostFunc = reinterpret_cast<decltype(gLaunchHostFunc)>(dlsym(h, "cuLaunchHostFunc"));
    gRead = reinterpret_cast<MoveFn>(dlsym(h, "loomStandInReadDevice"));
    gWrite = reinterpret_cast<MoveFn>(dlsym(h, "loomStandInWriteDevice"));
    return gLaunchHostFunc && gRead && gWrite;
  }();
  return ok;
}

struct Call {
  int fn;
  loom::Reducer red;
  void* dst;
  const void* a;
  const void* b;
  size_t n;
};

void run(void* p) {
  std::unique_ptr<Call> c(static_cast<Call*>(p));
  const size_t bytes = c->n * c->red.eltSize;
  std::vector<char> a(bytes), b(bytes), d(bytes);
  gRead(a.data(), c->a, bytes);
  if (c->b) gRead(b.data(), c->b, bytes);
  switch (c->fn) {
    case LOOM_CUDA_FN_REDUCE: c->red.reduce(d.data(), a.data(), b.data(), c->n); break;
    case LOOM_CUDA_FN_REDUCE2: c->red.reduce2(d.data(), a.data(), b.data(), c->n); break;
    case LOOM_CUDA_FN_PRE: c->red.pre(d.data(), a.data(), c->n); break;
    default: c->red.post(d.data(), a.data(), c->n); break;
  }
  gWrite(c->dst, d.data(), bytes);
}

// The reducer that (dtype, kind, scalarBits) name, as kernels/reduce.h builds them.
bool reducerOf(int dtype, int kind, uint64_t scalarBits, loom::Reducer* out) {
  using loom::RedKind;
  try {
    switch (RedKind(kind)) {
      case RedKind::kSum: *out = loom::Reducer::make(dtype, 0, 1); return true;
      case RedKind::kProd: *out = loom::Reducer::make(dtype, 1, 1); return true;
      case RedKind::kMax: *out = loom::Reducer::make(dtype, 2, 1); return true;
      case RedKind::kMin: *out = loom::Reducer::make(dtype, 3, 1); return true;
      case RedKind::kPreMulSum: *out = loom::Reducer::preMulSum(dtype, &scalarBits); return true;
      case RedKind::kSumPostDiv:  // integers only (floats average with PreMulSum)
        if (dtype >= 6) return false;
        *out = loom::Reducer::sumPostDiv(dtype, static_cast<int>(scalarBits));
        return true;
    }
  } catch (...) {
  }
  return false;
}

// loomCudaReduceMulti's work: the chain of CPU steps it stands for (pre of input 0, each
// other input reduced in with its own scalar, post), every input read before any output is
// written (an output may be an input).
struct MultiCall {
  int dtype;
  loom::Reducer red;
  loomCudaMulti m;
  size_t n;
};

void runMulti(void* p) {
  std::unique_ptr<MultiCall> c(static_cast<MultiCall*>(p));
  const size_t bytes = c->n * c->red.eltSize;
  std::vector<std::vector<char>> in(static_cast<size_t>(c->m.nin), std::vector<char>(bytes));
  for (int i = 0; i < c->m.nin; ++i) gRead(in[static_cast<size_t>(i)].data(), c->m.in[i], bytes);
  std::vector<char> acc = in[0];
  const bool pre = c->red.hasPre();
  if (pre) loom::Reducer::preMulSum(c->dtype, &c->m.inScalar[0]).pre(acc.data(), in[0].data(), c->n);
  for (int i = 1; i < c->m.nin; ++i) {
    const char* x = in[static_cast<size_t>(i)].data();
    if (pre)
      loom::Reducer::preMulSum(c->dtype, &c->m.inScalar[i]).reduce(acc.data(), acc.data(), x, c->n);
    else
      c->red.reduce2(acc.data(), acc.data(), x, c->n);
  }
  c->red.post(acc.data(), acc.data(), c->n);
  for (int j = 0; j < c->m.nout; ++j) gWrite(c->m.out[j], acc.data(), bytes);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int loomCudaReduceMulti(
    int dtype, int kind, uint64_t postBits, const loomCudaMulti* m, size_t n,
    loomCudaStream_t stream) {
  if (!bindDriver()) return 3;  // cudaErrorInitializationError
  if (getenv("LOOM_STAND_IN_KERNELS_FAIL")) return 209;
  if (!m || m->nin < 1 || m->nin > LOOM_CUDA_MULTI_MAX || m->nout < 0 ||
      m->nout > LOOM_CUDA_MULTI_MAX)
    return 1;
  for (int i = 0; i < m->nin; ++i)
    if (!m->in[i]) return 1;
  for (int j = 0; j < m->nout; ++j)
    if (!m->out[j]) return 1;
  loom::Reducer red;
  if (!reducerOf(dtype, kind, postBits, &red)) return 1;
  if (n == 0 || m->nout == 0) return 0;
  auto c = std::make_unique<MultiCall>(MultiCall{dtype, red, *m, n});
  if (gLaunchHostFunc(stream, runMulti, c.get()) != 0) return 400;
  c.release();
  return 0;
}

extern "C" __attribute__((visibility("default"))) int loomCudaReduce(
    int fn, int dtype, int kind, uint64_t scalarBits, void* dst, const void* a, const void* b,
    size_t n, loomCudaStream_t stream) {
  if (!bindDriver()) return 3;  // cudaErrorInitializationError
  // A module that loads but cannot run here (cudaErrorNoKernelImageForDevice), for tests.
  if (getenv("LOOM_STAND_IN_KERNELS_FAIL")) return 209;
  loom::Reducer red;
  if (fn < LOOM_CUDA_FN_REDUCE || fn > LOOM_CUDA_FN_POST || !reducerOf(dtype, kind, scalarBits, &red))
    return 1;  // cudaErrorInvalidValue
  if (n == 0) return 0;
  const bool binary = fn == LOOM_CUDA_FN_REDUCE || fn == LOOM_CUDA_FN_REDUCE2;
  auto c = std::make_unique<Call>(Call{fn, red, dst, a, binary ? b : nullptr, n});
  if (gLaunchHostFunc(stream, run, c.get()) != 0) return 400;  // cudaErrorInvalidResourceHandle
  c.release();
  return 0;
}

extern "C" __attribute__((visibility("default"))) int loomCudaKernelsAbiVersion(void) {
  return LOOM_CUDA_KERNELS_ABI_VERSION;
}
