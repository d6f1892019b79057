// Reduction kernels in GB/s (bytes of inputs read plus output written, per second) next to
// memcpy (bytes read plus written) on the same buffer sizes, for every data type and op and
// every CPU instruction set this machine has.
//
//   loom_reduce_bench --benchmark_filter='^(memcpy|float/sum)/' --benchmark_repetitions=5
//                     --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/arith.h"
#include "kernels/reduce.h"

namespace loom {
namespace {

constexpr size_t kSizes[] = {4 << 10, 256 << 10, 32 << 20};  // bytes per buffer

// A page-aligned buffer, touched so page faults stay out of the timing.
struct Buffer {
  explicit Buffer(size_t bytes) : bytes(bytes) {
    p = static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
    std::memset(p, 0, bytes);
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  size_t bytes;
  char* p;
};

// Fills with a small non-zero value of the type (1.0 for floats, 1 for integers), so that
// products and sums stay ordinary numbers whatever the iteration count.
void fillOnes(Buffer& b, int dtype) {
  size_t size = dtypeSize(dtype), n = b.bytes / size;
  uint64_t one = 1;
  switch (DataType(dtype)) {
    case DataType::kFloat16:
      one = floatToHalf(1.0f);
      break;
    case DataType::kBfloat16:
      one = floatToBf16(1.0f);
      break;
    case DataType::kFloat8e4m3:
      one = floatToFp8e4m3(1.0f);
      break;
    case DataType::kFloat8e5m2:
      one = floatToFp8e5m2(1.0f);
      break;
    case DataType::kFloat32:
      one = floatBits(1.0f);
      break;
    case DataType::kFloat64:
      one = doubleBits(1.0);
      break;
    default:
      break;
  }
  for (size_t i = 0; i < n; ++i) std::memcpy(b.p + i * size, &one, size);
}

void memcpyBench(benchmark::State& state, size_t bytes) {
  Buffer src(bytes), dst(bytes);
  for (auto _ : state) {
    std::memcpy(dst.p, src.p, bytes);
    benchmark::DoNotOptimize(dst.p);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(2 * bytes));
}

// op: 0..4 as ncclRedOp_t (4 = avg), 5 = SumPostDiv by 2 (integers' avg post-op included).
void reduceBench(benchmark::State& state, int dtype, int op, CpuIsa isa, size_t bytes) {
  Reducer r = (op == 5 ? Reducer::sumPostDiv(dtype, 2) : Reducer::make(dtype, op, 2)).withIsa(isa);
  size_t n = bytes / r.eltSize;
  Buffer a(bytes), b(bytes), dst(bytes);
  fillOnes(a, dtype);
  fillOnes(b, dtype);
  for (auto _ : state) {
    r.reduce(dst.p, a.p, b.p, n);
    benchmark::DoNotOptimize(dst.p);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(3 * bytes));
}

std::string sizeName(size_t bytes) {
  return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + "MiB"
                            : std::to_string(bytes >> 10) + "KiB";
}

void registerAll() {
  const char* ops[] = {"sum", "prod", "max", "min", "avg", "sumpostdiv"};
  for (size_t bytes : kSizes) {
    benchmark::RegisterBenchmark(("memcpy/" + sizeName(bytes)).c_str(), memcpyBench, bytes);
  }
  for (int isa = kNumCpuIsas - 1; isa >= 0; --isa) {
    if (!cpuIsaSupported(CpuIsa(isa))) continue;
    for (int dtype = 0; dtype < kNumDataTypes; ++dtype) {
      for (int op = 0; op < 6; ++op) {
        for (size_t bytes : kSizes) {
          std::string name = std::string(dtypeName(dtype)) + "/" + ops[op] + "/" +
                             cpuIsaName(CpuIsa(isa)) + "/" + sizeName(bytes);
          benchmark::RegisterBenchmark(name.c_str(), reduceBench, dtype, op, CpuIsa(isa), bytes);
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  loom::registerAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
