// reduce_scatter_perf: rank r ends with block r of the reduction of all ranks' buffers.
#include "bench/common/collectives.h"

namespace loom::bench {
namespace {

class ReduceScatter final : public Collective {
 public:
  const char* name() const override { return "ReduceScatter"; }
  Counts counts(size_t count, size_t eltSize, int n) const override {
    size_t base = perRankBlock(count, eltSize, n);
    return {base * n, base, base, 0, base};
  }
  double algBytesFactor(int n) const override { return n; }
  double busBwFactor(int n) const override { return double(n - 1) / n; }
  bool sweepsOps() const override { return true; }
  bool sweepsRoots() const override { return false; }
  ncclResult_t run(const CallArgs& a) const override {
    return ncclReduceScatter(a.send, a.recv, a.count, a.type, a.op, a.comm, a.stream);
  }
  void fill(const DataContext& c) const override {
    memset(c.recv, 0, c.counts.recvCount * c.eltSize());
    fillReduceInput(c.reducePattern(), c.input(), c.counts.sendCount, c.rank, 0);
  }
  int64_t check(const DataContext& c) const override {
    size_t block = c.counts.recvCount;
    return countWrongReduced(c.reducePattern(), c.result(), block, block * c.rank);
  }
};

}  // namespace

const Collective& reduceScatterCollective() {
  static const ReduceScatter kInstance;
  return kInstance;
}

}  // namespace loom::bench
