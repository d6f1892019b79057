// all_gather_perf: every rank ends with all ranks' blocks, in rank order.
#include "bench/common/collectives.h"

namespace loom::bench {
namespace {

class AllGather final : public Collective {
 public:
  const char* name() const override { return "AllGather"; }
  Counts counts(size_t count, size_t eltSize, int n) const override {
    size_t base = perRankBlock(count, eltSize, n);
    return {base, base * n, base, base, 0};
  }
  double algBytesFactor(int n) const override { return n; }
  double busBwFactor(int n) const override { return double(n - 1) / n; }
  bool sweepsOps() const override { return false; }
  bool sweepsRoots() const override { return false; }
  ncclResult_t run(const CallArgs& a) const override {
    return ncclAllGather(a.send, a.recv, a.count, a.type, a.comm, a.stream);
  }
  void fill(const DataContext& c) const override {
    memset(c.recv, 0, c.counts.recvCount * c.eltSize());
    fillCopyInput(c.seed, c.eltSize(), c.input(), c.counts.sendCount, c.rank, 0);
  }
  int64_t check(const DataContext& c) const override {
    int64_t wrong = 0;
    size_t block = c.counts.sendCount;
    for (int r = 0; r < c.nranks; ++r)
      wrong +=
          countWrongCopy(c.seed, c.eltSize(), c.result() + r * block * c.eltSize(), block, r, 0);
    return wrong;
  }
};

}  // namespace

const Collective& allGatherCollective() {
  static const AllGather kInstance;
  return kInstance;
}

}  // namespace loom::bench
