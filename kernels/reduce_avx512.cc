// CPU loops for AVX-512 (F, BW, VL) + F16C: kernels/cpu_loops.h's templates built for
// 512-bit vectors, its fp16 loops at 16 lanes through the hardware half<->float conversions.

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

// cpu_loops.h's vector-width policy: 16 halves per 512-bit vector of floats.
struct Half16 {
  using Float = __m512;
  static constexpr size_t kLanes = 16;

  static Float load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // Round to nearest even; NaN becomes the canonical 0x7fff as in the scalar conversion.
  static __m256i toHalf(Float v) {
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm256_mask_mov_epi16(h, nan, _mm256_set1_epi16(0x7fff));
  }
  static void store(uint16_t* p, Float v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), toHalf(v));
  }
  static Float splat(float x) { return _mm512_set1_ps(x); }
  static Float roundToHalf(Float v) { return _mm512_cvtph_ps(toHalf(v)); }
};

}  // namespace
}  // namespace cpu_avx512

void fillAvx512Kernels(CpuKernelTable* table) {
  cpu_avx512::fillAllTypes(table);
  cpu_avx512::fillF16Vector<cpu_avx512::Half16>(table);
}

}  // namespace loom
#pragma GCC pop_options
