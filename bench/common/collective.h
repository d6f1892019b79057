// What one benchmark tool supplies to the shared harness: the collective's buffer sizes,
// its bandwidth formula, the call itself, and how to fill and check its data.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>

#include "bench/common/datatypes.h"
#include "bench/common/pattern.h"

namespace loom::bench {

// Element counts for one size, as nccl-tests' getCollByteCount computes them. The in-place
// offsets are per rank: rank r's in-place input lives at recv + sendInplaceOffset * r and
// its in-place result at recv + recvInplaceOffset * r.
struct Counts {
  size_t sendCount = 0;
  size_t recvCount = 0;
  size_t paramCount = 0;  // the `count` argument of the call
  size_t sendInplaceOffset = 0;
  size_t recvInplaceOffset = 0;
};

// nccl-tests rounds per-rank blocks down to a multiple of 16 bytes.
inline size_t perRankBlock(size_t count, size_t eltSize, int nranks) {
  return (count / static_cast<size_t>(nranks)) & ~(16 / eltSize - 1);
}

// One rank's view of one (type, op, root, placement) test, for fill() and check().
struct DataContext {
  const TypeInfo* type;
  const OpInfo* op;
  int rank;
  int nranks;
  int root;
  bool inPlace;
  uint64_t seed;
  Counts counts;
  void* send;  // the rank's send buffer (unused in place)
  void* recv;  // the rank's receive buffer

  ReducePattern reducePattern() const { return {type, op, nranks, seed}; }
  size_t eltSize() const { return type->size; }
  // Where this rank's input goes, and where its result is read.
  char* input() const {
    return inPlace ? static_cast<char*>(recv) + counts.sendInplaceOffset * rank * eltSize()
                   : static_cast<char*>(send);
  }
  char* result() const {
    return static_cast<char*>(recv) + (inPlace ? counts.recvInplaceOffset * rank * eltSize() : 0);
  }
};

struct CallArgs {
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
  ncclComm_t comm;
  cudaStream_t stream = nullptr;  // the rank's stream with device buffers
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual const char* name() const = 0;  // "AllReduce"
  virtual Counts counts(size_t count, size_t eltSize, int nranks) const = 0;
  // algbw = algBytesFactor * count * typesize / time; busbw = algbw * busBwFactor.
  virtual double algBytesFactor(int nranks) const = 0;
  virtual double busBwFactor(int nranks) const = 0;
  // The sweep nccl-tests runs: over -o operators, over -r roots.
  virtual bool sweepsOps() const = 0;
  virtual bool sweepsRoots() const = 0;
  // Whether the call reduces with the operator (sendrecv sweeps -o names but ignores them).
  virtual bool usesOp() const { return sweepsOps(); }
  // nccl-tests does not check in-place alltoall and sendrecv (#wrong is N/A).
  virtual bool checksInPlace() const { return true; }
  virtual ncclResult_t run(const CallArgs& a) const = 0;
  // Zeroes the result buffer and writes this rank's input.
  virtual void fill(const DataContext& c) const = 0;
  // Number of wrong elements in this rank's result.
  virtual int64_t check(const DataContext& c) const = 0;
};

}  // namespace loom::bench
