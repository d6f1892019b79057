#include "algo/direct.h"

namespace loom {

Plan directAllReduce(int n, int rank, size_t count, size_t elt) {
  Plan plan;
  plan.coll = Collective::kAllReduce;
  plan.algo = Algorithm::kDirect;
  size_t bytes = count * elt;
  plan.channels.resize(1);
  PlanBuilder b(plan.channels[0], -1, -1);
  if (n == 1) {
    b.copy(sendBuf(0), recvBuf(0), bytes);
    return plan;
  }
  // Sends first, all of them: the caller only picks this for messages that fit in a
  // connection FIFO, so they complete without waiting for the peers; only then is recv
  // written, which keeps in-place operation safe.
  for (int j = 0; j < n; ++j) {
    if (j == rank) continue;
    b.setPeers(j, -1);
    b.send(sendBuf(0), bytes);
  }
  // Every rank folds the inputs in rank order, ((x0 R x1) R x2) ..., so all get the same
  // bits. The reductions are commutative, so ranks 0 and 1 start from their own input and
  // the other's (x0 R x1 = x1 R x0 exactly). The last step writes the final result.
  const BufRef acc = recvBuf(0);
  auto into = [&](int j) { return partialIf(j < n - 1, acc); };
  int j = 2;
  if (rank <= 1) {
    b.setPeers(-1, 1 - rank);
    b.recvReduceCopy(sendBuf(0), into(1), bytes);
  } else {
    // A later rank's own input is folded in at its place, after recv has been written:
    // keep a copy, since in-place operation overwrites the input.
    plan.scratchBytes = bytes;
    const BufRef own{Buf::kScratch, 0};
    b.copyAsIs(sendBuf(0), own, bytes);
    b.setPeers(-1, 0);
    b.recv(partial(acc), bytes);
    for (j = 1; j < n; ++j) {
      if (j == rank) {
        b.localReduce(own, into(j), bytes);
      } else {
        b.setPeers(-1, j);
        b.recvReduceCopy(partial(acc), into(j), bytes);
      }
    }
  }
  for (; j < n; ++j) {
    b.setPeers(-1, j);
    b.recvReduceCopy(partial(acc), into(j), bytes);
  }
  return plan;
}

}  // namespace loom
