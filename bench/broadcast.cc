// broadcast_perf: every rank ends with the root's buffer.
#include "bench/common/collectives.h"

namespace loom::bench {
namespace {

class Broadcast final : public Collective {
 public:
  const char* name() const override { return "Broadcast"; }
  Counts counts(size_t count, size_t, int) const override { return {count, count, count, 0, 0}; }
  double algBytesFactor(int) const override { return 1; }
  double busBwFactor(int) const override { return 1; }
  bool sweepsOps() const override { return false; }
  bool sweepsRoots() const override { return true; }
  ncclResult_t run(const CallArgs& a) const override {
    return ncclBroadcast(a.send, a.recv, a.count, a.type, a.root, a.comm, a.stream);
  }
  void fill(const DataContext& c) const override {
    memset(c.recv, 0, c.counts.recvCount * c.eltSize());
    if (c.rank == c.root)
      fillCopyInput(c.seed, c.eltSize(), c.input(), c.counts.sendCount, c.root, 0);
  }
  int64_t check(const DataContext& c) const override {
    return countWrongCopy(c.seed, c.eltSize(), c.result(), c.counts.recvCount, c.root, 0);
  }
};

}  // namespace

const Collective& broadcastCollective() {
  static const Broadcast kInstance;
  return kInstance;
}

}  // namespace loom::bench
