// CPU loops for AVX-512 (F, BW, VL) + F16C: the generic templates at 512-bit width, and
// fp16 through the hardware half<->float conversions.

// fp-contract=off: a pre-op's product is rounded before the sum, as on the device (never
// fused). no-trapping-math: lets the vectoriser evaluate both arms of the conversions'
// selects; nothing here reads FP exception flags. Set before the includes so that it also
// governs kernels/arith.h's inline functions as inlined here.
#pragma GCC optimize("fp-contract=off", "no-trapping-math")

#include <immintrin.h>

#include "kernels/arith.h"
#include "kernels/cpu_kernels.h"

// AVX-512F implies FMA, so fp-contract=off above is what keeps products unfused.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,f16c")
// GCC 12's AVX-512 conversion intrinsics self-initialise an undefined vector (PR 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define LOOM_CPU_NS cpu_avx512
#include "kernels/cpu_loops.h"

namespace loom {
namespace cpu_avx512 {
namespace {

constexpr DataType kF16 = DataType::kFloat16;

inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Round to nearest even; NaN becomes the canonical 0x7fff as in the scalar conversion.
inline __m256i toHalf16(__m512 v) {
  __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm256_mask_mov_epi16(h, nan, _mm256_set1_epi16(0x7fff));
}
inline void store16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), toHalf16(v));
}

// Vector bodies; exact aliasing of dst with an input is fine because each block is
// loaded before it is stored.
struct VecSum {
  __m512 operator()(__m512 a, __m512 b) const { return a + b; }
};
struct VecProd {
  __m512 operator()(__m512 a, __m512 b) const { return a * b; }
};
struct VecPreSum {
  __m512 s;
  __m512 operator()(__m512 a, __m512 b) const { return a + _mm512_cvtph_ps(toHalf16(b * s)); }
};

template <typename V, typename F>
void f16Binary(void* dst, const void* av, const void* bv, size_t n, V vop, F sop) {
  auto* d = static_cast<uint16_t*>(dst);
  auto* a = static_cast<const uint16_t*>(av);
  auto* b = static_cast<const uint16_t*>(bv);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 x0 = load16(a + i), x1 = load16(a + i + 16);
    __m512 y0 = load16(b + i), y1 = load16(b + i + 16);
    store16(d + i, vop(x0, y0));
    store16(d + i + 16, vop(x1, y1));
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
  f16Binary(d, a, b, n, VecPreSum{_mm512_set1_ps(s.f32)}, PreSumElt<kF16>{s.f32});
}
void f16Scale(void* dst, const void* src, size_t n, const RedScalars& s) {
  auto* d = static_cast<uint16_t*>(dst);
  auto* x = static_cast<const uint16_t*>(src);
  __m512 vs = _mm512_set1_ps(s.f32);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) store16(d + i, load16(x + i) * vs);
  ScaleElt<kF16> sop{s.f32};
  for (; i < n; ++i) d[i] = sop(x[i]);
}

}  // namespace
}  // namespace cpu_avx512

void fillAvx512Kernels(CpuKernelTable* table) {
  cpu_avx512::fillAllTypes(table);
  constexpr int h = int(DataType::kFloat16);
  table->binary[h][0] = cpu_avx512::f16Sum;
  table->binary[h][1] = cpu_avx512::f16Prod;
  table->preSum[h] = cpu_avx512::f16PreSum;
  table->pre[h] = cpu_avx512::f16Scale;
  table->post[h] = cpu_avx512::f16Scale;
}

}  // namespace loom
#pragma GCC pop_options
