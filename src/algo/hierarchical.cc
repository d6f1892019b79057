#include "algo/hierarchical.h"

#include <algorithm>
#include <functional>
#include <tuple>
#include <utility>

#include "algo/ring_phases.h"
#include "base/error.h"

namespace loom {

int HostLayout::minLocal() const {
  size_t m = hosts.empty() ? 0 : hosts[0].size();
  for (const auto& h : hosts) m = std::min(m, h.size());
  return static_cast<int>(m);
}

int HostLayout::maxLocal() const {
  size_t m = 0;
  for (const auto& h : hosts) m = std::max(m, h.size());
  return static_cast<int>(m);
}

HostLayout HostLayout::single(int nranks, int rank) {
  HostLayout l;
  l.hosts.resize(1);
  for (int r = 0; r < nranks; ++r) l.hosts[0].push_back(r);
  l.local = rank;
  return l;
}

namespace {

using ringphase::Piece;
using ringphase::PieceFn;
using ringphase::Seg;
using ringphase::slice;
using ringphase::SubRing;
using ringphase::total;

// Part i of `bytes` split into n nearly equal parts on element boundaries.
Seg part(size_t base, size_t bytes, size_t elt, int n, int i) {
  size_t count = bytes / elt;
  size_t b = count * i / n, e = count * (i + 1) / n;
  return {base + b * elt, base + b * elt, (e - b) * elt};
}

// An empty plan on `channels` channels: each takes its share of the buffer over
// connections of its own, so one share's network phase overlaps another's intra-host
// phases (how many pays off is the cost model's call: algo::planShape).
Plan start(Collective c, int channels) {
  Plan p;
  p.coll = c;
  p.algo = Algorithm::kHierarchical;
  p.channels.resize(static_cast<size_t>(std::max(1, channels)));
  return p;
}

std::vector<int> rail(const HostLayout& l, int j) {
  std::vector<int> g;
  for (const auto& h : l.hosts) g.push_back(h[j]);
  return g;
}

// The part of every per-rank block a channel moves: bytes [off, off + len) of each block,
// blocks `stride` bytes apart in rank order.
struct Blocks {
  size_t stride, off, len;
};

// Rails for collectives on per-rank blocks: local rank o of a host belongs to rail o % R,
// and that rail's rank (local o % R) carries o's block across hosts. Every rail has a
// rank on every host; with the same number of ranks everywhere each carries one block.
// The blocks of host h's rail-k ranks, in rank order: where they sit in a buffer of
// blocks in rank order (src) and where they go (dst: packed from `packedAt` in steps of
// the block part, or the same place when packedAt < 0).
Piece railGroupBlocks(const HostLayout& l, int h, int k, const Blocks& b, long packedAt) {
  const int R = l.minLocal();
  Piece p;
  for (size_t o = k; o < l.hosts[h].size(); o += R) {
    size_t at = l.hosts[h][o] * b.stride + b.off;
    p.push_back({at, packedAt < 0 ? at : packedAt + p.size() * b.len, b.len});
  }
  return p;
}

// Rail k's blocks on every host, in host order (what local rank k sums or gathers), packed
// from `packedAt` or in place (< 0).
Piece railAllBlocks(const HostLayout& l, int k, const Blocks& b, long packedAt) {
  Piece p;
  for (int h = 0; h < l.nhosts(); ++h) {
    long at = packedAt < 0 ? -1 : packedAt + static_cast<long>(p.size() * b.len);
    Piece q = railGroupBlocks(l, h, k, b, at);
    p.insert(p.end(), q.begin(), q.end());
  }
  return p;
}

void checkLayout(const HostLayout& l) {
  if (l.nhosts() < 1 || l.host >= l.nhosts() || l.local >= static_cast<int>(l.hosts[l.host].size()))
    LOOM_THROW(kInternalError, "hierarchical: bad host layout");
}

// The host the root is on.
int hostOf(const HostLayout& l, int root) {
  for (int h = 0; h < l.nhosts(); ++h)
    for (int r : l.hosts[h])
      if (r == root) return h;
  LOOM_THROW(kInternalError, "hierarchical: root %d is on no host", root);
}

// Channel c of `channels`: its share of count elements, as (byte offset, bytes).
std::pair<size_t, size_t> channelBytes(size_t count, size_t elt, int channels, int c) {
  const Share s = channelShare(count, channels, c);
  return {s.begin * elt, s.size() * elt};
}

// Part k < R of [base, base + bytes) belongs to local rank k; local ranks >= R own nothing.
PieceFn ownedParts(size_t base, size_t bytes, size_t elt, int R) {
  return [=](int k) { return k < R ? Piece{part(base, bytes, elt, R, k)} : Piece{}; };
}

// What broadcast and reduce share: the chain of rail k runs through local rank k of every
// host, from (broadcast) or to (reduce) the root's host; `dist` is this rank's host's
// distance after the root's along it.
struct RootedChains {
  RootedChains(const HostLayout& layout, int r)
      : l(layout), root(r), R(l.minLocal()), N(l.nhosts()), rootHost(hostOf(l, r)),
        me(l.hosts[l.host][l.local]), dist((l.host - rootHost + N) % N) {}
  int member(int d, int k) const { return l.hosts[(rootHost + d) % N][k]; }
  const HostLayout& l;
  int root, R, N, rootHost, me, dist;
};

// The R parts of [base, base + bytes), chunk by chunk, the parts interleaved (chunk 0 of
// every part, then chunk 1, ...) so that a rank feeding several chains feeds them all.
void forEachPartChunk(size_t base, size_t bytes, size_t elt, int R, size_t chunk,
                      const std::function<void(int k, const Seg& s)>& fn) {
  const size_t longest = part(base, bytes, elt, R, R - 1).len;
  for (size_t cb = 0; cb < longest; cb += chunk)
    for (int k = 0; k < R; ++k)
      for (const Seg& s : slice(Piece{part(base, bytes, elt, R, k)}, cb, chunk)) fn(k, s);
}

}  // namespace

Plan hierarchicalAllReduce(const HostLayout& l, size_t count, size_t elt, size_t chunk, int nch) {
  checkLayout(l);
  Plan plan = start(Collective::kAllReduce, nch);
  const int channels = static_cast<int>(plan.channels.size());
  const int R = l.minLocal();
  SubRing host{l.hosts[l.host], l.local};
  // A rank alone on its host has nothing to combine locally: its rail reads the input.
  const bool alone = host.size() == 1;
  for (int c = 0; c < channels; ++c) {
    PlanBuilder b(plan.channels[c], -1, -1);
    b.setConn(c);
    const auto [base, bytes] = channelBytes(count, elt, channels, c);
    const PieceFn owned = ownedParts(base, bytes, elt, R);
    if (!alone) ringphase::reduceScatter(b, host, owned, Buf::kSend, Buf::kRecv, false, true, chunk);
    if (l.local < R) {
      std::vector<int> group = rail(l, l.local);
      SubRing net{group, l.host};
      Seg mine = part(base, bytes, elt, R, l.local);
      ringphase::allReduce(b, net, mine.dst, mine.len, elt, alone ? Buf::kSend : Buf::kRecv,
                    !alone, chunk, false);
    }
    ringphase::allGather(b, host, owned, Buf::kRecv, chunk, {true});
  }
  return plan;
}

Plan hierarchicalReduceScatter(const HostLayout& l, size_t count, size_t elt, size_t chunk, int nch) {
  checkLayout(l);
  Plan plan = start(Collective::kReduceScatter, nch);
  const int channels = static_cast<int>(plan.channels.size());
  const size_t B = count * elt;
  const int R = l.minLocal();
  const std::vector<int>& mine = l.hosts[l.host];
  SubRing host{mine, l.local};
  for (int c = 0; c < channels; ++c) {
    const Share share = channelShare(count, channels, c);
    if (share.size() == 0 && c > 0) continue;
    const size_t off = share.begin * elt, len = share.size() * elt;
    PlanBuilder b(plan.channels[c], -1, -1);
    b.setConn(c);
    const Blocks blk{B, off, len};
    // 1. Local rank k < R sums, over its host, this channel's part of the blocks of rail k
    //    on every host (packed into its scratch). Local ranks >= R only relay.
    const long packedAt = static_cast<long>(plan.scratchBytes);
    PieceFn sums = [&](int k) { return k < R ? railAllBlocks(l, k, blk, packedAt) : Piece{}; };
    if (l.local < R) plan.scratchBytes += total(sums(l.local));
    ringphase::reduceScatter(b, host, sums, Buf::kSend, Buf::kScratch, false, true, chunk);
    if (l.local >= R) {
      // 3. (for a rank beyond the rails) its block, finished by its rail's rank.
      b.setPeers(-1, mine[l.local % R]);
      if (len) b.recv(partial(recvBuf(off)), len);
      continue;
    }
    // 2. Each rail finishes every host's blocks of that rail: the block of local rank k
    //    lands in its receive buffer, the others (hosts with more ranks than R) in scratch.
    std::vector<int> group = rail(l, l.local);
    SubRing net{group, l.host};
    const Piece packed = sums(l.local);
    const bool direct = mine.size() <= static_cast<size_t>(R);
    const size_t finals = plan.scratchBytes;
    PieceFn finish = [&](int m) {
      // Where host m's rail blocks sit in this rank's packed scratch, and where they end up.
      Piece p;
      size_t first = 0;
      for (int h = 0; h < m; ++h) first += railGroupBlocks(l, h, l.local, blk, -1).size();
      Piece blocks = railGroupBlocks(l, m, l.local, blk, -1);
      for (size_t i = 0; i < blocks.size(); ++i)
        p.push_back({packed[first + i].dst, direct ? off : finals + i * len, len});
      return p;
    };
    Buf out = direct ? Buf::kRecv : Buf::kScratch;
    if (!direct) plan.scratchBytes += total(finish(l.host));
    ringphase::reduceScatter(b, net, finish, Buf::kScratch, out, true, false, chunk);
    if (!direct && len) {
      // 3. Hand the finished blocks to their owners on this host.
      b.copyAsIs({Buf::kScratch, finals}, recvBuf(off), len);
      for (size_t o = l.local + R, i = 1; o < mine.size(); o += R, ++i) {
        b.setPeers(mine[o], -1);
        b.send(partial({Buf::kScratch, finals + i * len}), len);
      }
    }
  }
  return plan;
}

Plan hierarchicalAllGather(const HostLayout& l, size_t count, size_t elt, size_t chunk, int nch) {
  checkLayout(l);
  Plan plan = start(Collective::kAllGather, nch);
  const int channels = static_cast<int>(plan.channels.size());
  const size_t B = count * elt;
  const int R = l.minLocal();
  const std::vector<int>& mine = l.hosts[l.host];
  const int me = mine[l.local];
  for (int c = 0; c < channels; ++c) {
    const Share share = channelShare(count, channels, c);
    if (share.size() == 0 && c > 0) continue;
    const size_t off = share.begin * elt, len = share.size() * elt;
    PlanBuilder b(plan.channels[c], -1, -1);
    b.setConn(c);
    const Blocks blk{B, off, len};
    // 1. Every block into place; a rank beyond the rails also hands its block to its rail.
    if (l.local < R) {
      b.copyAsIs(sendBuf(off), recvBuf(me * B + off), len);
      for (size_t o = l.local + R; o < mine.size(); o += R) {
        b.setPeers(-1, mine[o]);
        if (len) b.recv(partial(recvBuf(mine[o] * B + off)), len);
      }
      // 2. Each rail gathers its blocks of every host.
      std::vector<int> group = rail(l, l.local);
      SubRing net{group, l.host};
      PieceFn railPiece = [&](int m) { return railGroupBlocks(l, m, l.local, blk, -1); };
      ringphase::allGather(b, net, railPiece, Buf::kRecv, chunk, {false});
    } else {
      b.setPeers(mine[l.local % R], -1);
      if (len) b.sendCopy(partial(sendBuf(off)), partial(recvBuf(me * B + off)), len);
      else b.copyAsIs(sendBuf(off), recvBuf(me * B + off), len);
    }
    // 3. Within the host, each rail's rank passes on what its rail gathered.
    SubRing host{mine, l.local};
    PieceFn gathered = [&](int k) { return k < R ? railAllBlocks(l, k, blk, -1) : Piece{}; };
    ringphase::allGather(b, host, gathered, Buf::kRecv, chunk, {true});
  }
  return plan;
}

Plan hierarchicalBroadcast(const HostLayout& l, int root, size_t count, size_t elt, size_t chunk,
                           int nch) {
  checkLayout(l);
  Plan plan = start(Collective::kBroadcast, nch);
  const int channels = static_cast<int>(plan.channels.size());
  const RootedChains ch(l, root);
  const int R = ch.R, me = ch.me, dist = ch.dist;
  // The root gathers its host's parts in scratch (not in its receive buffer, which peers
  // read from while the parts it already holds would be written again).
  SubRing host{l.hosts[l.host], l.local};
  const bool gatherAtRoot = me == root && host.size() > 1;
  if (gatherAtRoot) plan.scratchBytes = count * elt;
  for (int c = 0; c < channels; ++c) {
    PlanBuilder b(plan.channels[c], -1, -1);
    b.setConn(c);
    const auto [base, bytes] = channelBytes(count, elt, channels, c);
    if (me == root) b.copyAsIs({Buf::kSend, base}, recvBuf(base), bytes);
    // 1-2. Part k goes down a chain: root -> local rank k of the root's host (when that is
    //      not the root) -> local rank k of each following host.
    forEachPartChunk(base, bytes, elt, R, chunk, [&](int k, const Seg& g) {
      const int relay = ch.member(0, k);
      if (me == root) {
        const int to = relay != root ? relay : ch.N > 1 ? ch.member(1, k) : -1;
        if (to < 0) return;
        b.setPeers(to, -1);
        b.send(partial({Buf::kSend, g.src}), g.len);
        b.shareLast();
      } else if (k == l.local) {
        const int from = dist == 0 ? root : dist == 1 ? relay : ch.member(dist - 1, k);
        const int to = dist == ch.N - 1 ? -1 : ch.member(dist + 1, k);
        b.setPeers(to, from);
        if (to < 0) {
          b.recv(partial(recvBuf(g.dst)), g.len);
        } else {
          b.recvCopySend(partial(recvBuf(g.dst)), g.len);
          b.shareLast();
        }
      }
    });
    // 3. Every host all-gathers the parts its rails brought.
    const PieceFn owned = ownedParts(base, bytes, elt, R);
    if (gatherAtRoot && l.local < R) {
      const Seg own = part(base, bytes, elt, R, l.local);
      b.copyAsIs({Buf::kSend, own.src}, {Buf::kScratch, own.dst}, own.len);
    }
    ringphase::allGather(b, host, owned, gatherAtRoot ? Buf::kScratch : Buf::kRecv, chunk, {true});
  }
  return plan;
}

Plan hierarchicalReduce(const HostLayout& l, int root, size_t count, size_t elt, size_t chunk, int nch) {
  checkLayout(l);
  Plan plan = start(Collective::kReduce, nch);
  const int channels = static_cast<int>(plan.channels.size());
  const RootedChains ch(l, root);
  const int R = ch.R, N = ch.N, me = ch.me, dist = ch.dist;
  SubRing host{l.hosts[l.host], l.local};
  const bool alone = host.size() == 1;
  if (!alone) plan.scratchBytes = count * elt;
  // A rank alone on its host feeds its chain from its input.
  const Buf src = alone ? Buf::kSend : Buf::kScratch;
  for (int c = 0; c < channels; ++c) {
    PlanBuilder b(plan.channels[c], -1, -1);
    b.setConn(c);
    const auto [base, bytes] = channelBytes(count, elt, channels, c);
    // 1. Local rank k < R sums part k over its host (in scratch).
    const PieceFn owned = ownedParts(base, bytes, elt, R);
    if (!alone) ringphase::reduceScatter(b, host, owned, Buf::kSend, Buf::kScratch, false, true, chunk);
    // 2. Part k goes up a chain: local rank k of the host after the root's, of the next,
    //    ..., of the root's host, and on to the root when that is another rank.
    forEachPartChunk(base, bytes, elt, R, chunk, [&](int k, const Seg& g) {
      const int relay = ch.member(0, k);
      if (k == l.local) {
        const int to = dist == 0 ? (me == root ? -1 : root) : ch.member((dist + 1) % N, k);
        const int from = dist == 1 || (dist == 0 && N == 1) ? -1 : ch.member((dist + N - 1) % N, k);
        b.setPeers(to, from);
        const BufRef in = partialIf(!alone, {src, g.src});
        if (from < 0 && to < 0) b.copy(in, recvBuf(g.dst), g.len);
        else if (from < 0) b.send(in, g.len);
        else if (to < 0) b.recvReduceCopy(in, recvBuf(g.dst), g.len);
        else b.recvReduceSend(in, g.len);
      } else if (me == root && relay != root) {
        b.setPeers(-1, relay);
        b.recv(recvBuf(g.dst), g.len);
      }
    });
  }
  return plan;
}

}  // namespace loom
