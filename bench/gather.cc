// gather_perf: the root ends with every rank's block, in rank order; the other ranks'
// receive buffers must be left as they were.
#include "bench/common/collectives.h"

namespace loom::bench {
namespace {

class Gather final : public Collective {
 public:
  const char* name() const override { return "Gather"; }
  Counts counts(size_t count, size_t eltSize, int n) const override {
    size_t base = perRankBlock(count, eltSize, n);
    return {base, base * n, base, base, 0};
  }
  double algBytesFactor(int n) const override { return n; }
  double busBwFactor(int n) const override { return double(n - 1) / n; }
  bool sweepsOps() const override { return false; }
  bool sweepsRoots() const override { return true; }
  ncclResult_t run(const CallArgs& a) const override {
    if (a.count == 0) return ncclSuccess;  // as nccl-tests
    return ncclGather(a.send, a.recv, a.count, a.type, a.root, a.comm, a.stream);
  }
  void fill(const DataContext& c) const override {
    memset(c.recv, 0, c.counts.recvCount * c.eltSize());
    fillCopyInput(c.seed, c.eltSize(), c.input(), c.counts.sendCount, c.rank, 0);
  }
  int64_t check(const DataContext& c) const override {
    size_t block = c.counts.sendCount, es = c.eltSize();
    int64_t wrong = 0;
    for (int r = 0; r < c.nranks; ++r) {
      const char* got = c.result() + r * block * es;
      if (c.rank == c.root || (c.inPlace && r == c.rank))
        wrong += countWrongCopy(c.seed, es, got, block, r, 0);
      else
        wrong += countWrongZero(es, got, block);
    }
    return wrong;
  }
};

}  // namespace

const Collective& gatherCollective() {
  static const Gather kInstance;
  return kInstance;
}

}  // namespace loom::bench
