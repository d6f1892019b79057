// scatter_perf: rank r ends with block r of the root's buffer.
#include "bench/common/collectives.h"

namespace loom::bench {
namespace {

class Scatter final : public Collective {
 public:
  const char* name() const override { return "Scatter"; }
  Counts counts(size_t count, size_t eltSize, int n) const override {
    size_t base = perRankBlock(count, eltSize, n);
    return {base * n, base, base, 0, base};
  }
  double algBytesFactor(int n) const override { return n; }
  double busBwFactor(int n) const override { return double(n - 1) / n; }
  bool sweepsOps() const override { return false; }
  bool sweepsRoots() const override { return true; }
  ncclResult_t run(const CallArgs& a) const override {
    if (a.count == 0) return ncclSuccess;  // as nccl-tests
    return ncclScatter(a.send, a.recv, a.count, a.type, a.root, a.comm, a.stream);
  }
  void fill(const DataContext& c) const override {
    memset(c.recv, 0, c.counts.recvCount * c.eltSize());
    if (c.rank == c.root)
      fillCopyInput(c.seed, c.eltSize(), c.input(), c.counts.sendCount, c.root, 0);
  }
  int64_t check(const DataContext& c) const override {
    size_t block = c.counts.recvCount;
    return countWrongCopy(c.seed, c.eltSize(), c.result(), block, c.root, block * c.rank);
  }
};

}  // namespace

const Collective& scatterCollective() {
  static const Scatter kInstance;
  return kInstance;
}

}  // namespace loom::bench
