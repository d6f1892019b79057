// all_reduce_perf: every rank ends with the reduction of all ranks' buffers.
#include "bench/common/collectives.h"

namespace loom::bench {
namespace {

class AllReduce final : public Collective {
 public:
  const char* name() const override { return "AllReduce"; }
  Counts counts(size_t count, size_t, int) const override { return {count, count, count, 0, 0}; }
  double algBytesFactor(int) const override { return 1; }
  // Ring all-reduce moves 2(n-1)/n of the buffer through each link.
  double busBwFactor(int n) const override { return 2.0 * (n - 1) / n; }
  bool sweepsOps() const override { return true; }
  bool sweepsRoots() const override { return false; }
  ncclResult_t run(const CallArgs& a) const override {
    return ncclAllReduce(a.send, a.recv, a.count, a.type, a.op, a.comm, a.stream);
  }
  void fill(const DataContext& c) const override {
    memset(c.recv, 0, c.counts.recvCount * c.eltSize());
    fillReduceInput(c.reducePattern(), c.input(), c.counts.sendCount, c.rank, 0);
  }
  int64_t check(const DataContext& c) const override {
    return countWrongReduced(c.reducePattern(), c.result(), c.counts.recvCount, 0);
  }
};

}  // namespace

const Collective& allReduceCollective() {
  static const AllReduce kInstance;
  return kInstance;
}

}  // namespace loom::bench
