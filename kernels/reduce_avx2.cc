// CPU loops for AVX2 + F16C: the generic templates at 256-bit width, and fp16 through the
// hardware half<->float conversions.

// fp-contract=off: a pre-op's product is rounded before the sum, as on the device (never
// fused). no-trapping-math: lets the vectoriser evaluate both arms of the conversions'
// selects; nothing here reads FP exception flags. Set before the includes so that it also
// governs kernels/arith.h's inline functions as inlined here.
#pragma GCC optimize("fp-contract=off", "no-trapping-math")

#include <immintrin.h>

#include "kernels/arith.h"
#include "kernels/cpu_kernels.h"

// No "fma" in the target either, for the same reason as fp-contract=off above.
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#define LOOM_CPU_NS cpu_avx2
#include "kernels/cpu_loops.h"

namespace loom {
namespace cpu_avx2 {
namespace {

constexpr DataType kF16 = DataType::kFloat16;

inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Round to nearest even; NaN becomes the canonical 0x7fff as in the scalar conversion.
inline __m128i toHalf8(__m256 v) {
  __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
  return _mm_blendv_epi8(h, _mm_set1_epi16(0x7fff), nan16);
}
inline void store8(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), toHalf8(v));
}

// Vector bodies; exact aliasing of dst with an input is fine because each block is
// loaded before it is stored.
struct VecSum {
  __m256 operator()(__m256 a, __m256 b) const { return a + b; }
};
struct VecProd {
  __m256 operator()(__m256 a, __m256 b) const { return a * b; }
};
struct VecPreSum {
  __m256 s;
  __m256 operator()(__m256 a, __m256 b) const { return a + _mm256_cvtph_ps(toHalf8(b * s)); }
};

template <typename V, typename F>
void f16Binary(void* dst, const void* av, const void* bv, size_t n, V vop, F sop) {
  auto* d = static_cast<uint16_t*>(dst);
  auto* a = static_cast<const uint16_t*>(av);
  auto* b = static_cast<const uint16_t*>(bv);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 x0 = load8(a + i), x1 = load8(a + i + 8);
    __m256 y0 = load8(b + i), y1 = load8(b + i + 8);
    store8(d + i, vop(x0, y0));
    store8(d + i + 8, vop(x1, y1));
  }
  for (; i < n; ++i) d[i] = sop(a[i], b[i]);
}

void f16Sum(void* d, const void* a, const void* b, size_t n, const RedScalars&) {
  f16Binary(d, a, b, n, VecSum{}, ReduceElt<kF16, OpSum>{});
}
void f16Prod(void* d, const void* a, const void* b, size_t n, const RedScalars&) {
  f16Binary(d, a, b, n, VecProd{}, ReduceElt<kF16, OpProd>{});
}
void f16PreSum(void* d, const void* a, const void* b, size_t n, const RedScalars& s) {
  f16Binary(d, a, b, n, VecPreSum{_mm256_set1_ps(s.f32)}, PreSumElt<kF16>{s.f32});
}
void f16Scale(void* dst, const void* src, size_t n, const RedScalars& s) {
  auto* d = static_cast<uint16_t*>(dst);
  auto* x = static_cast<const uint16_t*>(src);
  __m256 vs = _mm256_set1_ps(s.f32);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) store8(d + i, load8(x + i) * vs);
  ScaleElt<kF16> sop{s.f32};
  for (; i < n; ++i) d[i] = sop(x[i]);
}

}  // namespace
}  // namespace cpu_avx2

void fillAvx2Kernels(CpuKernelTable* table) {
  cpu_avx2::fillAllTypes(table);
  constexpr int h = int(DataType::kFloat16);
  table->binary[h][0] = cpu_avx2::f16Sum;
  table->binary[h][1] = cpu_avx2::f16Prod;
  table->preSum[h] = cpu_avx2::f16PreSum;
  table->pre[h] = cpu_avx2::f16Scale;
  table->post[h] = cpu_avx2::f16Scale;
}

}  // namespace loom
#pragma GCC pop_options
