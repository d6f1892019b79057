#include "algo/ring.h"

#include <algorithm>

namespace loom {

Ring Ring::identity(int nranks, int rank) {
  Ring r;
  for (int i = 0; i < nranks; ++i) r.order.push_back(i);
  r.pos = rank;
  return r;
}

namespace {

// Element range of part i when `count` elements are split into n nearly equal parts.
struct Part {
  size_t off, bytes;
};
Part part(size_t count, int n, int i, size_t elt) {
  size_t b = count * i / n, e = count * (i + 1) / n;
  return {b * elt, (e - b) * elt};
}

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

}  // namespace

Plan ringAllReduce(const Ring& ring, size_t count, size_t elt, size_t chunkBytes, int channels) {
  int n = ring.size();
  if (n == 1) return localCopy(Collective::kAllReduce, recvBuf(0), count * elt);
  Plan plan = start(Collective::kAllReduce, channels);
  const size_t perLoop = n * sliceElems(chunkBytes, elt);
  for (size_t ch = 0; ch < plan.channels.size(); ++ch) {
    PlanBuilder b(plan.channels[ch], ring.next(), ring.prev());
    b.setConn(static_cast<int>(ch));
    const Share share = channelShare(count, static_cast<int>(plan.channels.size()), static_cast<int>(ch));
    for (size_t base = share.begin; base < share.end; base += perLoop) {
      size_t loopCount = std::min(perLoop, share.end - base);
      // Chunk k of this slice is reduced along the ring and ends, complete, on ring position
      // k; then it circulates once more so everyone has it.
      auto chunk = [&](int k) {
        Part p = part(loopCount, n, ((k % n) + n) % n, elt);
        p.off += base * elt;
        return p;
      };
      int r = ring.pos;
      Part c = chunk(r - 1);
      b.send(sendBuf(c.off), c.bytes);
      for (int j = 2; j < n; ++j) {
        c = chunk(r - j);
        b.recvReduceSend(sendBuf(c.off), c.bytes);
      }
      // From here on, what a rank sends is final data in its recv buffer, which no later
      // step changes: peers may read it from there (kShare).
      c = chunk(r);
      b.recvReduceCopySend(sendBuf(c.off), recvBuf(c.off), c.bytes);
      b.shareLast();
      for (int j = 1; j < n - 1; ++j) {
        c = chunk(r - j);
        b.recvCopySend(recvBuf(c.off), c.bytes);
        b.shareLast();
      }
      c = chunk(r + 1);
      b.recv(recvBuf(c.off), c.bytes);
    }
  }
  return plan;
}

Plan ringAllGather(const Ring& ring, int rank, size_t count, size_t elt, size_t chunkBytes, int channels) {
  int n = ring.size();
  size_t bytes = count * elt;
  if (n == 1) return localCopy(Collective::kAllGather, recvBuf(rank * bytes), bytes);
  Plan plan = start(Collective::kAllGather, channels);
  const size_t step = sliceElems(chunkBytes, elt);
  for (size_t ch = 0; ch < plan.channels.size(); ++ch) {
    PlanBuilder b(plan.channels[ch], ring.next(), ring.prev());
    b.setConn(static_cast<int>(ch));
    const Share share = channelShare(count, static_cast<int>(plan.channels.size()), static_cast<int>(ch));
    for (size_t base = share.begin; base < share.end; base += step) {
      size_t off = base * elt, len = (std::min(step, share.end - base)) * elt;
      // Our own block goes around the ring and, in the same pass over it, into place (a
      // send with a dst copies there too; nothing to copy when in-place).
      b.sendCopy(sendBuf(off), recvBuf(rank * bytes + off), len);
      b.shareLast();
      for (int j = 1; j < n - 1; ++j) {
        b.recvCopySend(recvBuf(ring.at(ring.pos - j) * bytes + off), len);
        b.shareLast();
      }
      b.recv(recvBuf(ring.at(ring.pos - (n - 1)) * bytes + off), len);
    }
  }
  return plan;
}

Plan ringReduceScatter(const Ring& ring, int rank, size_t count, size_t elt, size_t chunkBytes, int channels) {
  int n = ring.size();
  size_t bytes = count * elt;
  if (n == 1) return localCopy(Collective::kReduceScatter, recvBuf(0), bytes);
  Plan plan = start(Collective::kReduceScatter, channels);
  const size_t step = sliceElems(chunkBytes, elt);
  for (size_t ch = 0; ch < plan.channels.size(); ++ch) {
    PlanBuilder b(plan.channels[ch], ring.next(), ring.prev());
    b.setConn(static_cast<int>(ch));
    const Share share = channelShare(count, static_cast<int>(plan.channels.size()), static_cast<int>(ch));
    for (size_t base = share.begin; base < share.end; base += step) {
      size_t off = base * elt, len = (std::min(step, share.end - base)) * elt;
      // Block of rank ring[k] travels from ring position k+1 around to position k.
      b.send(sendBuf(ring.at(ring.pos - 1) * bytes + off), len);
      for (int j = 2; j < n; ++j)
        b.recvReduceSend(sendBuf(ring.at(ring.pos - j) * bytes + off), len);
      b.recvReduceCopy(sendBuf(rank * bytes + off), recvBuf(off), len);
    }
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
