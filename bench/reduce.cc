// reduce_perf: the root ends with the reduction of all ranks' buffers; the other ranks'
// receive buffers must be left as they were.
#include "bench/common/collectives.h"

namespace loom::bench {
namespace {

class Reduce final : public Collective {
 public:
  const char* name() const override { return "Reduce"; }
  Counts counts(size_t count, size_t, int) const override { return {count, count, count, 0, 0}; }
  double algBytesFactor(int) const override { return 1; }
  double busBwFactor(int) const override { return 1; }
  bool sweepsOps() const override { return true; }
  bool sweepsRoots() const override { return true; }
  ncclResult_t run(const CallArgs& a) const override {
    return ncclReduce(a.send, a.recv, a.count, a.type, a.op, a.root, a.comm, a.stream);
  }
  void fill(const DataContext& c) const override {
    memset(c.recv, 0, c.counts.recvCount * c.eltSize());
    fillReduceInput(c.reducePattern(), c.input(), c.counts.sendCount, c.rank, 0);
  }
  int64_t check(const DataContext& c) const override {
    ReducePattern p = c.reducePattern();
    size_t n = c.counts.recvCount;
    if (c.rank == c.root) return countWrongReduced(p, c.result(), n, 0);
    // In place, a non-root's receive buffer holds its own input, untouched.
    return c.inPlace ? countWrongReduceInput(p, c.result(), n, c.rank, 0)
                     : countWrongZero(c.eltSize(), c.result(), n);
  }
};

}  // namespace

const Collective& reduceCollective() {
  static const Reduce kInstance;
  return kInstance;
}

}  // namespace loom::bench
