// The CPU loops, as templates over kernels/arith.h's element functors and, for fp16 on
// CPUs with F16C, over a vector width. Included only by the reduce_<isa>.cc files, each
// after its `#pragma GCC target`, inside a namespace of its own (LOOM_CPU_NS) so that the
// instantiations for different instruction sets are distinct symbols and the linker can
// never hand AVX-512 code to a generic caller.
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

// ---- fp16 through the hardware conversions, at any vector width --------------------------
// The compiler cannot vectorise the scalar half<->float conversions well, but F16C converts
// a vector at a time. An ISA file supplies the width as a policy V:
//   V::Float              a vector of V::kLanes floats (GCC vector type: + and * work)
//   V::load(p)            kLanes halves at p, widened
//   V::store(p, v)        v rounded to halves (RNE, NaN -> 0x7fff as halfToFloat's inverse)
//   V::splat(x)           x in every lane
//   V::roundToHalf(v)     v rounded to half precision and widened again
// Each vector op rounds once per element exactly as the scalar functors do, so every width
// gives the scalar loops' bits; the scalar tail handles what is left of n.

template <class V>
struct VecSum {
  typename V::Float operator()(typename V::Float a, typename V::Float b) const { return a + b; }
};
template <class V>
struct VecProd {
  typename V::Float operator()(typename V::Float a, typename V::Float b) const { return a * b; }
};
// The scaled value is rounded to the type before the sum, as PreSumElt does.
template <class V>
struct VecPreSum {
  typename V::Float s;
  typename V::Float operator()(typename V::Float a, typename V::Float b) const {
    return a + V::roundToHalf(b * s);
  }
};

// Two vectors per step: each block is loaded before it is stored, so dst may be the same
// pointer as an input.
template <class V, typename VecOp, typename EltOp>
void f16Binary(void* dst, const void* av, const void* bv, size_t n, VecOp vop, EltOp sop) {
  constexpr size_t kL = V::kLanes;
  auto* d = static_cast<uint16_t*>(dst);
  auto* a = static_cast<const uint16_t*>(av);
  auto* b = static_cast<const uint16_t*>(bv);
  size_t i = 0;
  for (; i + 2 * kL <= n; i += 2 * kL) {
    typename V::Float x0 = V::load(a + i), x1 = V::load(a + i + kL);
    typename V::Float y0 = V::load(b + i), y1 = V::load(b + i + kL);
    V::store(d + i, vop(x0, y0));
    V::store(d + i + kL, vop(x1, y1));
  }
  for (; i < n; ++i) d[i] = sop(a[i], b[i]);
}

template <class V>
void f16Sum(void* d, const void* a, const void* b, size_t n, const RedScalars&) {
  f16Binary<V>(d, a, b, n, VecSum<V>{}, ReduceElt<DataType::kFloat16, OpSum>{});
}
template <class V>
void f16Prod(void* d, const void* a, const void* b, size_t n, const RedScalars&) {
  f16Binary<V>(d, a, b, n, VecProd<V>{}, ReduceElt<DataType::kFloat16, OpProd>{});
}
template <class V>
void f16PreSum(void* d, const void* a, const void* b, size_t n, const RedScalars& s) {
  f16Binary<V>(d, a, b, n, VecPreSum<V>{V::splat(s.f32)}, PreSumElt<DataType::kFloat16>{s.f32});
}
template <class V>
void f16Scale(void* dst, const void* src, size_t n, const RedScalars& s) {
  constexpr size_t kL = V::kLanes;
  auto* d = static_cast<uint16_t*>(dst);
  auto* x = static_cast<const uint16_t*>(src);
  typename V::Float vs = V::splat(s.f32);
  size_t i = 0;
  for (; i + kL <= n; i += kL) V::store(d + i, V::load(x + i) * vs);
  ScaleElt<DataType::kFloat16> sop{s.f32};
  for (; i < n; ++i) d[i] = sop(x[i]);
}

// Over fillAllTypes' fp16 entries for sum, product and the scale steps; max and min keep
// the loops fillAllTypes gave them.
template <class V>
void fillF16Vector(CpuKernelTable* t) {
  constexpr int h = int(DataType::kFloat16);
  t->binary[h][0] = f16Sum<V>;
  t->binary[h][1] = f16Prod<V>;
  t->preSum[h] = f16PreSum<V>;
  t->pre[h] = f16Scale<V>;
  t->post[h] = f16Scale<V>;
}

}  // namespace LOOM_CPU_NS
}  // namespace loom
