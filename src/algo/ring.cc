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

Plan start(Collective c, const Ring& ring) {
  Plan p;
  p.coll = c;
  p.algo = Algorithm::kRing;
  p.channels.resize(1);
  (void)ring;
  return p;
}

}  // namespace

// Every rank sends before it receives in each ring step, so a step may carry at most what
// a connection FIFO holds; larger messages go round the ring in slices of `chunkBytes`
// per rank (and those slices pipeline through the FIFO slot by slot).
namespace {
size_t sliceElems(size_t chunkBytes, size_t elt) { return std::max<size_t>(1, chunkBytes / elt); }
}  // namespace

Plan ringAllReduce(const Ring& ring, size_t count, size_t elt, size_t chunkBytes) {
  Plan plan = start(Collective::kAllReduce, ring);
  int n = ring.size();
  PlanBuilder b(plan.channels[0], ring.next(), ring.prev());
  if (n == 1) {
    b.copy(sendBuf(0), recvBuf(0), count * elt);
    return plan;
  }
  const size_t perLoop = n * sliceElems(chunkBytes, elt);
  for (size_t base = 0; base < count; base += perLoop) {
    size_t loopCount = std::min(perLoop, count - base);
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
    b.last().flags |= kShare;
    for (int j = 1; j < n - 1; ++j) {
      c = chunk(r - j);
      b.recvCopySend(recvBuf(c.off), c.bytes);
      b.last().flags |= kShare;
    }
    c = chunk(r + 1);
    b.recv(recvBuf(c.off), c.bytes);
  }
  return plan;
}

Plan ringAllGather(const Ring& ring, int rank, size_t count, size_t elt, size_t chunkBytes) {
  Plan plan = start(Collective::kAllGather, ring);
  int n = ring.size();
  size_t bytes = count * elt;
  PlanBuilder b(plan.channels[0], ring.next(), ring.prev());
  if (n == 1) {
    b.copy(sendBuf(0), recvBuf(rank * bytes), bytes);
    return plan;
  }
  const size_t step = sliceElems(chunkBytes, elt);
  for (size_t base = 0; base < count; base += step) {
    size_t off = base * elt, len = (std::min(step, count - base)) * elt;
    // Our own block goes around the ring and, in the same pass over it, into place (a
    // send with a dst copies there too; nothing to copy when in-place).
    b.add(StepOp::kSend, sendBuf(off), recvBuf(rank * bytes + off), len, kShare);
    for (int j = 1; j < n - 1; ++j) {
      b.recvCopySend(recvBuf(ring.at(ring.pos - j) * bytes + off), len);
      b.last().flags |= kShare;
    }
    b.recv(recvBuf(ring.at(ring.pos - (n - 1)) * bytes + off), len);
  }
  return plan;
}

Plan ringReduceScatter(const Ring& ring, int rank, size_t count, size_t elt, size_t chunkBytes) {
  Plan plan = start(Collective::kReduceScatter, ring);
  int n = ring.size();
  size_t bytes = count * elt;
  PlanBuilder b(plan.channels[0], ring.next(), ring.prev());
  if (n == 1) {
    b.copy(sendBuf(0), recvBuf(0), bytes);
    return plan;
  }
  const size_t step = sliceElems(chunkBytes, elt);
  for (size_t base = 0; base < count; base += step) {
    size_t off = base * elt, len = (std::min(step, count - base)) * elt;
    // Block of rank ring[k] travels from ring position k+1 around to position k.
    b.send(sendBuf(ring.at(ring.pos - 1) * bytes + off), len);
    for (int j = 2; j < n; ++j)
      b.recvReduceSend(sendBuf(ring.at(ring.pos - j) * bytes + off), len);
    b.recvReduceCopy(sendBuf(rank * bytes + off), recvBuf(off), len);
  }
  return plan;
}

Plan ringBroadcast(const Ring& ring, int rank, int root, size_t count, size_t elt) {
  Plan plan = start(Collective::kBroadcast, ring);
  int n = ring.size();
  size_t bytes = count * elt;
  PlanBuilder b(plan.channels[0], ring.next(), ring.prev());
  // A chain from the root; each step is pipelined slot by slot by the executor.
  int dist = ring.distanceFrom(root);
  if (rank == root) {
    b.copy(sendBuf(0), recvBuf(0), bytes);
    if (n > 1) {
      b.send(sendBuf(0), bytes);
      b.last().flags |= kShare;
    }
  } else if (dist == n - 1) {
    b.recv(recvBuf(0), bytes);
  } else {
    b.recvCopySend(recvBuf(0), bytes);
    b.last().flags |= kShare;
  }
  return plan;
}

Plan ringReduce(const Ring& ring, int rank, int root, size_t count, size_t elt) {
  Plan plan = start(Collective::kReduce, ring);
  int n = ring.size();
  size_t bytes = count * elt;
  PlanBuilder b(plan.channels[0], ring.next(), ring.prev());
  // The chain starts just after the root and ends at it.
  int dist = ring.distanceFrom(root);
  if (n == 1) {
    b.copy(sendBuf(0), recvBuf(0), bytes);
  } else if (rank == root) {
    b.recvReduceCopy(sendBuf(0), recvBuf(0), bytes);
  } else if (dist == 1) {
    b.send(sendBuf(0), bytes);
  } else {
    b.recvReduceSend(sendBuf(0), bytes);
  }
  return plan;
}

}  // namespace loom
