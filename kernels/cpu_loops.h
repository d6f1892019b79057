// The CPU loops, as templates over kernels/arith.h's element functors. Included only by
// the reduce_<isa>.cc files, each after its `#pragma GCC target`, inside a namespace of
// its own (LOOM_CPU_NS) so that the instantiations for different instruction sets are
// distinct symbols and the linker can never hand AVX-512 code to a generic caller.
//
// The loops take restrict pointers so the compiler vectorises them without runtime
// overlap checks. A destination that is the same pointer as an input is legal for the
// Reducer API, so each loop first picks the variant whose pointers really are distinct.
#pragma once

#ifndef LOOM_CPU_NS
#error "define LOOM_CPU_NS before including kernels/cpu_loops.h"
#endif

#include <cstring>

#include "kernels/arith.h"
#include "kernels/cpu_kernels.h"

namespace loom {
namespace LOOM_CPU_NS {

template <typename S, typename F>
LOOM_INLINE void loopDistinct(S* __restrict d, const S* __restrict a, const S* __restrict b,
                              size_t n, F f) {
  for (size_t i = 0; i < n; ++i) d[i] = f(a[i], b[i]);
}
template <typename S, typename F>
LOOM_INLINE void loopIntoA(S* __restrict d, const S* __restrict b, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) d[i] = f(d[i], b[i]);
}
template <typename S, typename F>
LOOM_INLINE void loopIntoB(S* __restrict d, const S* __restrict a, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) d[i] = f(a[i], d[i]);
}
template <typename S, typename F>
LOOM_INLINE void loopSelf(S* d, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) d[i] = f(d[i], d[i]);
}

template <typename S, typename F>
LOOM_INLINE void binaryLoop(S* d, const S* a, const S* b, size_t n, F f) {
  if (d == a && d == b) {
    loopSelf(d, n, f);
  } else if (d == a) {
    loopIntoA(d, b, n, f);
  } else if (d == b) {
    loopIntoB(d, a, n, f);
  } else {
    loopDistinct(d, a, b, n, f);  // a == b is fine: restrict only matters for writes
  }
}

template <typename S, typename F>
LOOM_INLINE void unaryDistinct(S* __restrict d, const S* __restrict s, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) d[i] = f(s[i]);
}
template <typename S, typename F>
LOOM_INLINE void unaryInPlace(S* __restrict d, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) d[i] = f(d[i]);
}
template <typename S, typename F>
LOOM_INLINE void unaryLoop(S* d, const S* s, size_t n, F f) {
  if (d == s) {
    unaryInPlace(d, n, f);
  } else {
    unaryDistinct(d, s, n, f);
  }
}

template <DataType D>
LOOM_INLINE typename Traits<D>::Acc scaleOf(const RedScalars& s) {
  using Acc = typename Traits<D>::Acc;
  if constexpr (std::is_same<Acc, double>::value) {
    return s.f64;
  } else if constexpr (std::is_same<Acc, float>::value) {
    return s.f32;
  } else {
    return Acc(s.u64);
  }
}

template <DataType D, typename Op>
void binaryEntry(void* dst, const void* a, const void* b, size_t n, const RedScalars&) {
  using S = typename Traits<D>::Storage;
  binaryLoop(static_cast<S*>(dst), static_cast<const S*>(a), static_cast<const S*>(b), n,
             ReduceElt<D, Op>{});
}

template <DataType D>
void preSumEntry(void* dst, const void* a, const void* b, size_t n, const RedScalars& s) {
  using S = typename Traits<D>::Storage;
  binaryLoop(static_cast<S*>(dst), static_cast<const S*>(a), static_cast<const S*>(b), n,
             PreSumElt<D>{scaleOf<D>(s)});
}

template <DataType D>
void scaleEntry(void* dst, const void* src, size_t n, const RedScalars& s) {
  using S = typename Traits<D>::Storage;
  unaryLoop(static_cast<S*>(dst), static_cast<const S*>(src), n, ScaleElt<D>{scaleOf<D>(s)});
}

template <DataType D>
void divEntry(void* dst, const void* src, size_t n, const RedScalars& s) {
  using S = typename Traits<D>::Storage;
  using Wide = typename DivElt<D>::Wide;
  unaryLoop(static_cast<S*>(dst), static_cast<const S*>(src), n, DivElt<D>{Wide(s.u64)});
}

template <DataType D>
void fillType(CpuKernelTable* t) {
  constexpr int i = int(D);
  t->binary[i][0] = binaryEntry<D, OpSum>;
  t->binary[i][1] = binaryEntry<D, OpProd>;
  t->binary[i][2] = binaryEntry<D, OpMax>;
  t->binary[i][3] = binaryEntry<D, OpMin>;
  t->preSum[i] = preSumEntry<D>;
  t->pre[i] = scaleEntry<D>;
  if constexpr (Traits<D>::kIsFloat) {
    t->post[i] = scaleEntry<D>;
  } else {
    t->post[i] = divEntry<D>;
  }
}

inline void fillAllTypes(CpuKernelTable* t) {
  fillType<DataType::kInt8>(t);
  fillType<DataType::kUint8>(t);
  fillType<DataType::kInt32>(t);
  fillType<DataType::kUint32>(t);
  fillType<DataType::kInt64>(t);
  fillType<DataType::kUint64>(t);
  fillType<DataType::kFloat16>(t);
  fillType<DataType::kFloat32>(t);
  fillType<DataType::kFloat64>(t);
  fillType<DataType::kBfloat16>(t);
  fillType<DataType::kFloat8e4m3>(t);
  fillType<DataType::kFloat8e5m2>(t);
}

}  // namespace LOOM_CPU_NS
}  // namespace loom
