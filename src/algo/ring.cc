#include "algo/ring.h"

#include <algorithm>

#include "algo/ring_phases.h"

namespace loom {

Ring Ring::identity(int nranks, int rank) {
  Ring r;
  for (int i = 0; i < nranks; ++i) r.order.push_back(i);
  r.pos = rank;
  return r;
}

namespace {

// A size-free plan (see Loop in plan.h): channel c works on share c of the buffer.
Plan start(Collective c, int channels) {
  Plan p;
  p.coll = c;
  p.algo = Algorithm::kRing;
  p.channels.resize(static_cast<size_t>(std::max(1, channels)));
  p.shares = static_cast<int>(p.channels.size());
  return p;
}

// A one-rank ring: the result is the input (placed in block `block` of the output).
Plan localCopy(Collective c, size_t block) {
  Plan p = start(c, 1);
  PlanBuilder b(p.channels[0], -1, -1);
  b.beginLoop(0, 1, true);
  b.copy(sendBuf(0), {Buf::kRecv, block}, 0);
  return p;
}

// Every rank sends before it receives in each ring step, so a step may carry at most what
// a connection FIFO holds; larger messages go round the ring in slices of `chunkBytes`
// per rank (and those slices pipeline through the FIFO slot by slot). 0: one slice.
size_t sliceElems(size_t chunkBytes, size_t elt) {
  return chunkBytes == 0 ? 0 : std::max<size_t>(1, chunkBytes / elt);
}

}  // namespace

// The flat ring collectives are the ring phases (ring_phases.h) with the whole
// communicator as the group, one channel per share of the buffer, as size-free loops.

Plan ringAllReduce(const std::vector<Ring>& rings, size_t elt, size_t chunkBytes, int channels) {
  int n = rings[0].size();
  if (n == 1) return localCopy(Collective::kAllReduce, 0);
  Plan plan = start(Collective::kAllReduce, channels);
  for (size_t ch = 0; ch < plan.channels.size(); ++ch) {
    const Ring& ring = rings[ch % rings.size()];
    const ringphase::SubRing all{ring.order, ring.pos};
    PlanBuilder b(plan.channels[ch], -1, -1);
    b.setConn(static_cast<int>(ch));
    // A round: one slice per ring position.
    b.beginLoop(n * sliceElems(chunkBytes, elt), n, false);
    // Completed chunks are final data in recv, which no later step changes: peers may
    // read them from there (kShare).
    ringphase::allReduceBody(b, all, Buf::kSend, true);
  }
  return plan;
}

Plan ringAllGather(const std::vector<Ring>& rings, int rank, size_t elt, size_t chunkBytes, int channels) {
  if (rings[0].size() == 1) return localCopy(Collective::kAllGather, static_cast<size_t>(rank));
  Plan plan = start(Collective::kAllGather, channels);
  // Our own block goes around the ring and, in the same pass over it, into place (a send
  // with a dst copies there too; nothing to copy when in-place). What we send stays in
  // place until the end: peers may read it there.
  const ringphase::GatherOptions opts{true, false, Buf::kSend};
  for (size_t ch = 0; ch < plan.channels.size(); ++ch) {
    const Ring& ring = rings[ch % rings.size()];
    const ringphase::SubRing all{ring.order, ring.pos};
    PlanBuilder b(plan.channels[ch], -1, -1);
    b.setConn(static_cast<int>(ch));
    b.beginLoop(sliceElems(chunkBytes, elt), 1, false);
    // Position k's data: our single input block, ring rank order[k]'s output block.
    ringphase::allGatherBody(b, all, [&](int k) { return ringphase::Seg{0, static_cast<size_t>(ring.order[k]), 0}; },
                             Buf::kRecv, opts);
  }
  return plan;
}

Plan ringReduceScatter(const std::vector<Ring>& rings, int /*rank*/, size_t elt, size_t chunkBytes, int channels) {
  if (rings[0].size() == 1) return localCopy(Collective::kReduceScatter, 0);
  Plan plan = start(Collective::kReduceScatter, channels);
  for (size_t ch = 0; ch < plan.channels.size(); ++ch) {
    const Ring& ring = rings[ch % rings.size()];
    const ringphase::SubRing all{ring.order, ring.pos};
    PlanBuilder b(plan.channels[ch], -1, -1);
    b.setConn(static_cast<int>(ch));
    b.beginLoop(sliceElems(chunkBytes, elt), 1, false);
    // Block of rank ring[k] travels from ring position k+1 around to position k.
    ringphase::reduceScatterBody(b, all, [&](int k) { return ringphase::Seg{static_cast<size_t>(ring.order[k]), 0, 0}; },
                                 Buf::kSend, Buf::kRecv);
  }
  return plan;
}

Plan ringBroadcast(const std::vector<Ring>& rings, int rank, int root, size_t elt, size_t chunkBytes,
                   int channels) {
  int n = rings[0].size();
  if (n == 1) return localCopy(Collective::kBroadcast, 0);
  Plan plan = start(Collective::kBroadcast, channels);
  // A chain from the root; each step is pipelined slot by slot by the executor. The first
  // channel's empty share is one empty step, so that a zero-byte call still meets its peers.
  for (size_t ch = 0; ch < plan.channels.size(); ++ch) {
    const Ring& ring = rings[ch % rings.size()];
    const int dist = ring.distanceFrom(root);
    PlanBuilder b(plan.channels[ch], ring.next(), ring.prev());
    b.setConn(static_cast<int>(ch));
    if (rank == root) {
      b.beginLoop(0, 1, ch == 0);
      b.copy(sendBuf(0), recvBuf(0), 0);
    }
    b.beginLoop(sliceElems(chunkBytes, elt), 1, ch == 0);
    if (rank == root) {
      b.send(sendBuf(0), 0);
      b.shareLast();
    } else if (dist == n - 1) {
      b.recv(recvBuf(0), 0);
    } else {
      b.recvCopySend(recvBuf(0), 0);
      b.shareLast();
    }
  }
  return plan;
}

Plan ringReduce(const std::vector<Ring>& rings, int rank, int root, size_t elt, size_t chunkBytes, int channels) {
  int n = rings[0].size();
  if (n == 1) return localCopy(Collective::kReduce, 0);
  Plan plan = start(Collective::kReduce, channels);
  // The chain starts just after the root and ends at it.
  for (size_t ch = 0; ch < plan.channels.size(); ++ch) {
    const Ring& ring = rings[ch % rings.size()];
    const int dist = ring.distanceFrom(root);
    PlanBuilder b(plan.channels[ch], ring.next(), ring.prev());
    b.setConn(static_cast<int>(ch));
    b.beginLoop(sliceElems(chunkBytes, elt), 1, ch == 0);
    if (rank == root) b.recvReduceCopy(sendBuf(0), recvBuf(0), 0);
    else if (dist == 1) b.send(sendBuf(0), 0);
    else b.recvReduceSend(sendBuf(0), 0);
  }
  return plan;
}

}  // namespace loom
