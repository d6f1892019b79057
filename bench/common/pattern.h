// Deterministic per-rank input data and the checks against it (-c).
//
// Every rank can compute every other rank's input from (seed, rank, index) alone, so each
// rank checks its own results with no communication. Reduction inputs are small integers
// (or 1/2/-1 for prod) sized so that every partial result is exactly representable in the
// type: the expected value is then exact whatever order the library reduces in. The only
// inexact case is the floating-point average (of non-negative inputs), which is checked
// with a tolerance of a few ulps of the result. Copy collectives move pseudo-random bits
// and are checked bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bench/common/datatypes.h"

namespace loom::bench {

struct ReducePattern {
  const TypeInfo* type;
  const OpInfo* op;
  int nranks;
  uint64_t seed;
};

// Input element `index` of `rank` for a reduction (a small integer-valued double).
double reduceInput(const ReducePattern& p, int rank, size_t index);
// The premultiplier ncclRedOpCreatePreMulSum gets on `rank` ("mulsum").
double preMulScalar(int rank);
// The correct result at `index` of reducing all ranks' inputs.
double reduceExpected(const ReducePattern& p, size_t index);
// The same, and the sum of the inputs' magnitudes (the scale of rounding errors).
double reduceExpectedScaled(const ReducePattern& p, size_t index, double* absSum);
// Whether results are compared exactly (everything but floating-point avg).
bool reduceIsExact(const ReducePattern& p);

// dst[i] = reduceInput(p, rank, offset + i) for i < count.
void fillReduceInput(const ReducePattern& p, void* dst, size_t count, int rank, size_t offset);
// Elements i < count with got[i] != reduceExpected(p, offset + i) (within tolerance).
int64_t countWrongReduced(const ReducePattern& p, const void* got, size_t count, size_t offset);
// Elements i < count with got[i] != reduceInput(p, rank, offset + i): a buffer the
// collective must leave alone.
int64_t countWrongReduceInput(const ReducePattern& p, const void* got, size_t count, int rank,
                              size_t offset);

// Writes the value 1 of `type` over [dst, dst + bytes), element after element (a final
// partial element gets the leading bytes of one): data every type reduces as an ordinary
// number, never a denormal or NaN, and no page of it left all zeros.
void fillOnes(const TypeInfo& type, void* dst, size_t bytes);

// Copy pattern: the bytes of element `offset + i` of `rank`'s data, eltSize bytes each.
void fillCopyInput(uint64_t seed, size_t eltSize, void* dst, size_t count, int rank, size_t offset);
int64_t countWrongCopy(uint64_t seed, size_t eltSize, const void* got, size_t count, int rank,
                       size_t offset);
// Elements i < count that are not all-zero bytes.
int64_t countWrongZero(size_t eltSize, const void* got, size_t count);

}  // namespace loom::bench
