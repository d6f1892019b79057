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

Plan start(Collective c, int channels) {
  Plan p;
  p.coll = c;
  p.algo = Algorithm::kRing;
  p.channels.resize(static_cast<size_t>(std::max(1, channels)));
  return p;
}

// A one-rank ring: the result is the input.
Plan localCopy(Collective c, BufRef to, size_t bytes) {
  Plan p = start(c, 1);
  PlanBuilder(p.channels[0], -1, -1).copy(sendBuf(0), to, bytes);
  return p;
}

// Every rank sends before it receives in each ring step, so a step may carry at most what
// a connection FIFO holds; larger messages go round the ring in slices of `chunkBytes`
// per rank (and those slices pipeline through the FIFO slot by slot).
size_t sliceElems(size_t chunkBytes, size_t elt) { return std::max<size_t>(1, chunkBytes / elt); }

// Calls fn(begin, count) for each slice of at most `slice` elements of a channel's share;
// the first channel's empty share is one empty step, so that a zero-byte call still meets
// its peers.
template <typename Fn>
void forEachSlice(const Share& share, int channel, size_t slice, Fn fn) {
  if (share.size() == 0) {
    if (channel == 0) fn(share.begin, size_t{0});
    return;
  }
  for (size_t b = share.begin; b < share.end; b += slice) fn(b, std::min(slice, share.end - b));
}

// Position k's piece for collectives over per-rank blocks of `block` bytes: bytes
// [begin, begin + len) of ring rank order[k]'s block on one side (the source when
// blockedIsSrc: reduce-scatter's input; else the destination: all-gather's output) and the
// same bytes of the rank's single block on the other.
ringphase::PieceFn blockPieces(const Ring& ring, size_t block, size_t begin, size_t len,
                               bool blockedIsSrc) {
  return [=, &ring](int k) {
    size_t blocked = ring.order[k] * block + begin;
    return ringphase::Piece{blockedIsSrc ? ringphase::Seg{blocked, begin, len}
                                         : ringphase::Seg{begin, blocked, len}};
  };
}

}  // namespace

// The flat ring collectives are the ring phases (ring_phases.h) with the whole
// communicator as the group, one channel per share of the buffer.

Plan ringAllReduce(const Ring& ring, size_t count, size_t elt, size_t chunkBytes, int channels) {
  int n = ring.size();
  if (n == 1) return localCopy(Collective::kAllReduce, recvBuf(0), count * elt);
  Plan plan = start(Collective::kAllReduce, channels);
  const ringphase::SubRing all{ring.order, ring.pos};
  for (size_t ch = 0; ch < plan.channels.size(); ++ch) {
    PlanBuilder b(plan.channels[ch], -1, -1);
    b.setConn(static_cast<int>(ch));
    const Share share = channelShare(count, static_cast<int>(plan.channels.size()), static_cast<int>(ch));
    // Completed chunks are final data in recv, which no later step changes: peers may
    // read them from there (kShare).
    ringphase::allReduce(b, all, share.begin * elt, share.size() * elt, elt, Buf::kSend, false,
                         sliceElems(chunkBytes, elt) * elt, true);
  }
  return plan;
}

Plan ringAllGather(const Ring& ring, int rank, size_t count, size_t elt, size_t chunkBytes, int channels) {
  int n = ring.size();
  size_t bytes = count * elt;
  if (n == 1) return localCopy(Collective::kAllGather, recvBuf(rank * bytes), bytes);
  Plan plan = start(Collective::kAllGather, channels);
  const ringphase::SubRing all{ring.order, ring.pos};
  // Our own block goes around the ring and, in the same pass over it, into place (a send
  // with a dst copies there too; nothing to copy when in-place). What we send stays in
  // place until the end: peers may read it there.
  const ringphase::GatherOptions opts{true, false, Buf::kSend};
  for (size_t ch = 0; ch < plan.channels.size(); ++ch) {
    PlanBuilder b(plan.channels[ch], -1, -1);
    b.setConn(static_cast<int>(ch));
    const Share share = channelShare(count, static_cast<int>(plan.channels.size()), static_cast<int>(ch));
    ringphase::allGather(b, all, blockPieces(ring, bytes, share.begin * elt, share.size() * elt, false),
                         Buf::kRecv, sliceElems(chunkBytes, elt) * elt, opts);
  }
  return plan;
}

Plan ringReduceScatter(const Ring& ring, int /*rank*/, size_t count, size_t elt, size_t chunkBytes, int channels) {
  int n = ring.size();
  size_t bytes = count * elt;
  if (n == 1) return localCopy(Collective::kReduceScatter, recvBuf(0), bytes);
  Plan plan = start(Collective::kReduceScatter, channels);
  const ringphase::SubRing all{ring.order, ring.pos};
  for (size_t ch = 0; ch < plan.channels.size(); ++ch) {
    PlanBuilder b(plan.channels[ch], -1, -1);
    b.setConn(static_cast<int>(ch));
    const Share share = channelShare(count, static_cast<int>(plan.channels.size()), static_cast<int>(ch));
    // Block of rank ring[k] travels from ring position k+1 around to position k.
    ringphase::reduceScatter(b, all, blockPieces(ring, bytes, share.begin * elt, share.size() * elt, true),
                             Buf::kSend, Buf::kRecv, false, false, sliceElems(chunkBytes, elt) * elt);
  }
  return plan;
}

Plan ringBroadcast(const Ring& ring, int rank, int root, size_t count, size_t elt, size_t chunkBytes,
                   int channels) {
  int n = ring.size();
  if (n == 1) return localCopy(Collective::kBroadcast, recvBuf(0), count * elt);
  Plan plan = start(Collective::kBroadcast, channels);
  const size_t slice = chunkBytes == 0 ? std::max<size_t>(count, 1) : sliceElems(chunkBytes, elt);
  // A chain from the root; each step is pipelined slot by slot by the executor.
  int dist = ring.distanceFrom(root);
  for (size_t ch = 0; ch < plan.channels.size(); ++ch) {
    PlanBuilder b(plan.channels[ch], ring.next(), ring.prev());
    b.setConn(static_cast<int>(ch));
    const Share share = channelShare(count, static_cast<int>(plan.channels.size()), static_cast<int>(ch));
    if (rank == root && (share.size() > 0 || ch == 0))
      b.copy(sendBuf(share.begin * elt), recvBuf(share.begin * elt), share.size() * elt);
    forEachSlice(share, static_cast<int>(ch), slice, [&](size_t begin, size_t len) {
      const size_t off = begin * elt, bytes = len * elt;
      if (rank == root) {
        b.send(sendBuf(off), bytes);
        b.shareLast();
      } else if (dist == n - 1) {
        b.recv(recvBuf(off), bytes);
      } else {
        b.recvCopySend(recvBuf(off), bytes);
        b.shareLast();
      }
    });
  }
  return plan;
}

Plan ringReduce(const Ring& ring, int rank, int root, size_t count, size_t elt, size_t chunkBytes, int channels) {
  int n = ring.size();
  if (n == 1) return localCopy(Collective::kReduce, recvBuf(0), count * elt);
  Plan plan = start(Collective::kReduce, channels);
  const size_t slice = chunkBytes == 0 ? std::max<size_t>(count, 1) : sliceElems(chunkBytes, elt);
  // The chain starts just after the root and ends at it.
  int dist = ring.distanceFrom(root);
  for (size_t ch = 0; ch < plan.channels.size(); ++ch) {
    PlanBuilder b(plan.channels[ch], ring.next(), ring.prev());
    b.setConn(static_cast<int>(ch));
    const Share share = channelShare(count, static_cast<int>(plan.channels.size()), static_cast<int>(ch));
    forEachSlice(share, static_cast<int>(ch), slice, [&](size_t begin, size_t len) {
      const size_t off = begin * elt, bytes = len * elt;
      if (rank == root) b.recvReduceCopy(sendBuf(off), recvBuf(off), bytes);
      else if (dist == 1) b.send(sendBuf(off), bytes);
      else b.recvReduceSend(sendBuf(off), bytes);
    });
  }
  return plan;
}

}  // namespace loom
