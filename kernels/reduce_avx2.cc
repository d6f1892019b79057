// CPU loops for AVX2 + F16C: kernels/cpu_loops.h's templates built for 256-bit vectors, its
// fp16 loops at 8 lanes through the hardware half<->float conversions.

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

// cpu_loops.h's vector-width policy: 8 halves per 256-bit vector of floats.
struct Half8 {
  using Float = __m256;
  static constexpr size_t kLanes = 8;

  static Float load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // Round to nearest even; NaN becomes the canonical 0x7fff as in the scalar conversion.
  static __m128i toHalf(Float v) {
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    __m128i nan16 =
        _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
    return _mm_blendv_epi8(h, _mm_set1_epi16(0x7fff), nan16);
  }
  static void store(uint16_t* p, Float v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), toHalf(v));
  }
  static Float splat(float x) { return _mm256_set1_ps(x); }
  static Float roundToHalf(Float v) { return _mm256_cvtph_ps(toHalf(v)); }
};

}  // namespace
}  // namespace cpu_avx2

void fillAvx2Kernels(CpuKernelTable* table) {
  cpu_avx2::fillAllTypes(table);
  cpu_avx2::fillF16Vector<cpu_avx2::Half8>(table);
}

}  // namespace loom
#pragma GCC pop_options
