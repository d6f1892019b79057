// sendrecv_perf: a ring of point-to-point transfers, rank r sends to r+1 and receives
// from r-1 in one group.
#include "bench/common/collectives.h"

namespace loom::bench {
namespace {

class SendRecv final : public Collective {
 public:
  const char* name() const override { return "SendRecv"; }
  Counts counts(size_t count, size_t, int) const override { return {count, count, count, 0, 0}; }
  double algBytesFactor(int) const override { return 1; }
  double busBwFactor(int) const override { return 1; }
  bool sweepsOps() const override { return true; }  // nccl-tests prints the -o names
  bool sweepsRoots() const override { return false; }
  bool usesOp() const override { return false; }
  bool checksInPlace() const override { return false; }
  ncclResult_t run(const CallArgs& a) const override {
    int n = 0, rank = 0;
    if (ncclResult_t r = ncclCommCount(a.comm, &n); r != ncclSuccess) return r;
    if (ncclResult_t r = ncclCommUserRank(a.comm, &rank); r != ncclSuccess) return r;
    if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return r;
    ncclResult_t s = ncclSend(a.send, a.count, a.type, (rank + 1) % n, a.comm, a.stream);
    ncclResult_t v = ncclRecv(a.recv, a.count, a.type, (rank - 1 + n) % n, a.comm, a.stream);
    ncclResult_t e = ncclGroupEnd();
    return s != ncclSuccess ? s : v != ncclSuccess ? v : e;
  }
  void fill(const DataContext& c) const override {
    memset(c.recv, 0, c.counts.recvCount * c.eltSize());
    fillCopyInput(c.seed, c.eltSize(), c.input(), c.counts.sendCount, c.rank, 0);
  }
  int64_t check(const DataContext& c) const override {
    int from = (c.rank - 1 + c.nranks) % c.nranks;
    return countWrongCopy(c.seed, c.eltSize(), c.result(), c.counts.recvCount, from, 0);
  }
};

}  // namespace

const Collective& sendRecvCollective() {
  static const SendRecv kInstance;
  return kInstance;
}

}  // namespace loom::bench
