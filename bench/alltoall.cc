// alltoall_perf: block j of rank i's send buffer ends as block i of rank j's receive buffer.
#include "bench/common/collectives.h"

namespace loom::bench {
namespace {

class AllToAll final : public Collective {
 public:
  const char* name() const override { return "AlltoAll"; }
  Counts counts(size_t count, size_t eltSize, int n) const override {
    size_t block = perRankBlock(count, eltSize, n);
    return {block * n, block * n, block, 0, 0};
  }
  double algBytesFactor(int n) const override { return n; }
  double busBwFactor(int n) const override { return double(n - 1) / n; }
  bool sweepsOps() const override { return false; }
  bool sweepsRoots() const override { return false; }
  bool checksInPlace() const override { return false; }
  ncclResult_t run(const CallArgs& a) const override {
    return ncclAlltoAll(a.send, a.recv, a.count, a.type, a.comm, a.stream);
  }
  void fill(const DataContext& c) const override {
    memset(c.recv, 0, c.counts.recvCount * c.eltSize());
    fillCopyInput(c.seed, c.eltSize(), c.input(), c.counts.sendCount, c.rank, 0);
  }
  int64_t check(const DataContext& c) const override {
    int64_t wrong = 0;
    size_t block = c.counts.paramCount;
    for (int r = 0; r < c.nranks; ++r)
      wrong += countWrongCopy(c.seed, c.eltSize(), c.result() + r * block * c.eltSize(), block, r,
                              block * c.rank);
    return wrong;
  }
};

}  // namespace

const Collective& allToAllCollective() {
  static const AllToAll kInstance;
  return kInstance;
}

}  // namespace loom::bench
