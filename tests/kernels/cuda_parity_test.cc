// The CUDA module (libloom-cuda-kernels.so) against the CPU loops, bit for bit, for every
// data type x kind x function, reached the way the engine reaches it: dlopen + dlsym, with
// the CUDA runtime also dlopen'ed. Skipped, saying why, where the module was not built,
// where no CUDA runtime loads, or where no GPU is visible.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/dl.h"
#include "kernels/cuda/cuda_kernels_abi.h"
#include "kernels/reduce.h"
#include "kernels/reduce_model.h"

namespace loom {
namespace {

// The few CUDA runtime calls the test needs, declared by hand (no CUDA headers here).
struct CudaRuntime {
  int (*getDeviceCount)(int*) = nullptr;
  int (*malloc)(void**, size_t) = nullptr;
  int (*free)(void*) = nullptr;
  int (*memcpy)(void*, const void*, size_t, int) = nullptr;  // kind 4: cudaMemcpyDefault
  int (*deviceSynchronize)() = nullptr;
  DynLib lib;
};

constexpr int kMemcpyDefault = 4;

struct CudaEnv {
  CudaRuntime rt;
  DynLib module;
  loomCudaReduce_t reduce = nullptr;
  loomCudaReduceMulti_t reduceMulti = nullptr;
  std::string skipReason;
};

CudaEnv& env() {
  static CudaEnv* e = [] {
    auto* e = new CudaEnv;
    std::string err;
    e->module = DynLib::open({LOOM_CUDA_KERNELS_PATH}, &err);
    if (!e->module.loaded()) {
      e->skipReason = "CUDA kernels module not built or not loadable: " + err;
      return e;
    }
    loomCudaKernelsAbiVersion_t version = nullptr;
    if (!e->module.bind(version, "loomCudaKernelsAbiVersion") ||
        !e->module.bind(e->reduce, "loomCudaReduce") ||
        !e->module.bind(e->reduceMulti, "loomCudaReduceMulti")) {
      e->skipReason = "module lacks its entry points";
      return e;
    }
    if (version() != LOOM_CUDA_KERNELS_ABI_VERSION) {
      e->skipReason = "module ABI version mismatch";
      return e;
    }
    e->rt.lib = DynLib::open({"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                              "/usr/local/cuda/lib64/libcudart.so"},
                             &err);
    CudaRuntime& rt = e->rt;
    if (!rt.lib.loaded() || !rt.lib.bind(rt.getDeviceCount, "cudaGetDeviceCount") ||
        !rt.lib.bind(rt.malloc, "cudaMalloc") || !rt.lib.bind(rt.free, "cudaFree") ||
        !rt.lib.bind(rt.memcpy, "cudaMemcpy") ||
        !rt.lib.bind(rt.deviceSynchronize, "cudaDeviceSynchronize")) {
      e->skipReason = "no usable CUDA runtime library: " + err;
      return e;
    }
    int count = 0;
    if (rt.getDeviceCount(&count) != 0 || count == 0) {
      e->skipReason = "no CUDA device visible";
    }
    return e;
  }();
  return *e;
}

struct DeviceBuf {
  explicit DeviceBuf(size_t bytes) { EXPECT_EQ(env().rt.malloc(&p, bytes ? bytes : 1), 0); }
  ~DeviceBuf() { env().rt.free(p); }
  void* p = nullptr;
};

// Whether the GPU's n elements are the CPU's (test::sameResult), naming the first that is not.
::testing::AssertionResult sameElements(const test::TypeModel& t, const std::vector<uint8_t>& got,
                                        const std::vector<uint8_t>& want, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint64_t g = 0, w = 0;
    std::memcpy(&g, &got[i * t.size], t.size);
    std::memcpy(&w, &want[i * t.size], t.size);
    if (!test::sameResult(t, g, w))
      return ::testing::AssertionFailure() << "[" << i << "] gpu 0x" << std::hex << g << " cpu 0x" << w;
  }
  return ::testing::AssertionSuccess();
}

class CudaParityTest : public ::testing::TestWithParam<int> {};

TEST_P(CudaParityTest, MatchesCpuBitForBit) {
  CudaEnv& e = env();
  if (!e.skipReason.empty()) GTEST_SKIP() << e.skipReason;
  const test::TypeModel& t = test::kTypes[GetParam()];
  std::vector<Reducer> reducers;
  for (int op = 0; op <= 4; ++op) reducers.push_back(Reducer::make(t.dtype, op, 3));
  uint64_t scalar = t.family == test::Family::kInt ? 7 : t.fromDouble(-0.3);
  reducers.push_back(Reducer::preMulSum(t.dtype, &scalar));
  reducers.push_back(Reducer::sumPostDiv(t.dtype, 5));
  for (size_t n : {size_t(1), size_t(17), size_t(100003)}) {
    size_t bytes = n * t.size;
    std::mt19937_64 rng(n);
    std::vector<uint8_t> a(bytes), b(bytes), want(bytes), got(bytes);
    for (size_t i = 0; i < n; ++i) {
      uint64_t x = test::randomElement(t, rng), y = test::randomElement(t, rng);
      std::memcpy(&a[i * t.size], &x, t.size);
      std::memcpy(&b[i * t.size], &y, t.size);
    }
    DeviceBuf da(bytes), db(bytes), dd(bytes);
    ASSERT_EQ(e.rt.memcpy(da.p, a.data(), bytes, kMemcpyDefault), 0);
    ASSERT_EQ(e.rt.memcpy(db.p, b.data(), bytes, kMemcpyDefault), 0);
    for (const Reducer& r : reducers) {
      for (int fn = LOOM_CUDA_FN_REDUCE; fn <= LOOM_CUDA_FN_POST; ++fn) {
        switch (fn) {
          case LOOM_CUDA_FN_REDUCE:
            r.reduce(want.data(), a.data(), b.data(), n);
            break;
          case LOOM_CUDA_FN_REDUCE2:
            r.reduce2(want.data(), a.data(), b.data(), n);
            break;
          case LOOM_CUDA_FN_PRE:
            r.pre(want.data(), a.data(), n);
            break;
          default:
            r.post(want.data(), a.data(), n);
            break;
        }
        ASSERT_EQ(e.reduce(fn, r.dtype, int(r.kind), r.scalarBits, dd.p, da.p, db.p, n, nullptr),
                  0);
        ASSERT_EQ(e.rt.deviceSynchronize(), 0);
        ASSERT_EQ(e.rt.memcpy(got.data(), dd.p, bytes, kMemcpyDefault), 0);
        ASSERT_TRUE(sameElements(t, got, want, n))
            << t.name << " kind=" << redKindName(r.kind) << " fn=" << fn << " n=" << n;
      }
    }
  }
}

// loomCudaReduceMulti (one pass over k inputs into several outputs, one of them an input)
// against the chain of CPU steps the engine would otherwise run: pre(in0), then each input
// reduced in (with its own scalar for PreMulSum), then post.
TEST_P(CudaParityTest, MultiMatchesTheCpuChainBitForBit) {
  CudaEnv& e = env();
  if (!e.skipReason.empty()) GTEST_SKIP() << e.skipReason;
  const test::TypeModel& t = test::kTypes[GetParam()];
  constexpr int k = 5;
  std::vector<Reducer> reducers;
  for (int op = 0; op <= 4; ++op) reducers.push_back(Reducer::make(t.dtype, op, k));
  uint64_t scalar = t.family == test::Family::kInt ? 7 : t.fromDouble(-0.3);
  reducers.push_back(Reducer::preMulSum(t.dtype, &scalar));
  reducers.push_back(Reducer::sumPostDiv(t.dtype, k));
  for (size_t n : {size_t(1), size_t(17), size_t(100003)}) {
    const size_t bytes = n * t.size;
    std::mt19937_64 rng(n + 7);
    std::vector<std::vector<uint8_t>> in(k, std::vector<uint8_t>(bytes));
    for (auto& v : in)
      for (size_t i = 0; i < n; ++i) {
        uint64_t x = test::randomElement(t, rng);
        std::memcpy(&v[i * t.size], &x, t.size);
      }
    std::vector<std::unique_ptr<DeviceBuf>> din;
    for (int i = 0; i < k; ++i) din.push_back(std::make_unique<DeviceBuf>(bytes + 16));
    DeviceBuf dout(bytes + 16);
    // Aligned (16-byte packs) and shifted by one element (the element-wise path alone).
    for (size_t shift : {size_t(0), size_t(t.size)})
    for (const Reducer& r : reducers) {
      auto at = [&](void* p) { return static_cast<void*>(static_cast<char*>(p) + shift); };
      // Each input's own scalar where the kind has one (PreMulSum: a rank's ncclScalar).
      std::vector<uint64_t> scalars(k, r.scalarBits);
      if (r.hasPre())
        for (int i = 0; i < k; ++i)
          scalars[i] = t.family == test::Family::kInt ? uint64_t(3 + i) : t.fromDouble(-0.3 + 0.1 * i);
      std::vector<uint8_t> want = in[0], got(bytes);
      if (r.hasPre()) Reducer::preMulSum(t.dtype, &scalars[0]).pre(want.data(), in[0].data(), n);
      for (int i = 1; i < k; ++i) {
        if (r.hasPre()) Reducer::preMulSum(t.dtype, &scalars[i]).reduce(want.data(), want.data(), in[i].data(), n);
        else r.reduce2(want.data(), want.data(), in[i].data(), n);
      }
      r.post(want.data(), want.data(), n);
      loomCudaMulti m{};
      m.nin = k;
      m.nout = 2;
      for (int i = 0; i < k; ++i) {
        ASSERT_EQ(e.rt.memcpy(at(din[i]->p), in[i].data(), bytes, kMemcpyDefault), 0);
        m.in[i] = at(din[i]->p);
        m.inScalar[i] = scalars[i];
      }
      m.out[0] = at(dout.p);
      m.out[1] = at(din[2]->p);  // in place: an input is also an output
      ASSERT_EQ(e.reduceMulti(r.dtype, int(r.kind), r.scalarBits, &m, n, nullptr), 0);
      ASSERT_EQ(e.rt.deviceSynchronize(), 0);
      for (void* out : {at(dout.p), at(din[2]->p)}) {
        ASSERT_EQ(e.rt.memcpy(got.data(), out, bytes, kMemcpyDefault), 0);
        ASSERT_TRUE(sameElements(t, got, want, n))
            << t.name << " kind=" << redKindName(r.kind) << " n=" << n
            << (out == at(dout.p) ? " (output)" : " (in place)") << " shift " << shift;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, CudaParityTest, ::testing::Range(0, kNumDataTypes),
                         [](const auto& info) {
                           return std::string(test::kTypes[info.param].name);
                         });

}  // namespace
}  // namespace loom
