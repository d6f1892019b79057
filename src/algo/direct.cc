#include "algo/direct.h"

namespace loom {

Plan directAllReduce(int n, int rank, size_t count, size_t elt) {
  Plan plan;
  plan.coll = Collective::kAllReduce;
  plan.algo = Algorithm::kDirect;
  size_t bytes = count * elt;
  // Sends first, all of them: the caller only picks this for messages that fit in a
  // connection FIFO, so they complete without waiting for the peers; only then is recv
  // written, which keeps in-place operation safe.
  plan.channels.resize(1);
  PlanBuilder b(plan.channels[0], -1, -1);
  for (int j = 0; j < n; ++j) {
    if (j == rank) continue;
    b.setPeers(j, -1);
    b.send(sendBuf(0), bytes);
  }
  // Our own input is reduced in its rank-order place, after recv has been written: keep
  // a copy, since in-place operation overwrites the input.
  plan.scratchBytes = bytes;
  BufRef own{Buf::kScratch, 0};
  b.copyAsIs(sendBuf(0), own, bytes);
  for (int j = 0; j < n; ++j) {
    if (j == 0) {
      if (rank == 0) {
        b.copy(own, partial(recvBuf(0)), bytes);
      } else {
        b.setPeers(-1, 0);
        b.recv(partial(recvBuf(0)), bytes);
      }
    } else if (j == rank) {
      b.localReduce(own, partial(recvBuf(0)), bytes);
    } else {
      b.setPeers(-1, j);
      b.recvReduceCopy(partial(recvBuf(0)), partial(recvBuf(0)), bytes);
    }
  }
  b.finish(recvBuf(0), bytes);
  return plan;
}

}  // namespace loom
