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
  b.copy(sendBuf(0), own, bytes, kSrcPartial | kDstPartial);
  for (int j = 0; j < n; ++j) {
    if (j == 0) {
      if (rank == 0) {
        b.copy(own, recvBuf(0), bytes, kDstPartial);
      } else {
        b.setPeers(-1, 0);
        b.add(StepOp::kRecv, {}, recvBuf(0), bytes, kDstPartial);
      }
    } else if (j == rank) {
      b.localReduce(own, recvBuf(0), bytes, kDstPartial);
    } else {
      b.setPeers(-1, j);
      b.add(StepOp::kRecvReduceCopy, recvBuf(0), recvBuf(0), bytes, kSrcPartial | kDstPartial);
    }
  }
  b.copy(recvBuf(0), recvBuf(0), bytes, kSrcPartial);
  return plan;
}

}  // namespace loom
