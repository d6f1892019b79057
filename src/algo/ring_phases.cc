#include "algo/ring_phases.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace loom {
namespace ringphase {

size_t total(const Piece& p) {
  size_t t = 0;
  for (const Seg& s : p) t += s.len;
  return t;
}

Piece slice(const Piece& p, size_t begin, size_t len) {
  Piece out;
  size_t at = 0;
  for (const Seg& s : p) {
    size_t b = std::max(begin, at), e = std::min(begin + len, at + s.len);
    if (b < e) out.push_back({s.src + (b - at), s.dst + (b - at), e - b});
    at += s.len;
  }
  return out;
}

namespace {

size_t longest(const SubRing& r, const PieceFn& piece) {
  size_t m = 0;
  for (int k = 0; k < r.size(); ++k) m = std::max(m, total(piece(k)));
  return m;
}

}  // namespace

namespace {

// One pass of each phase: what every position does for one round of pieces. `segs(k)` is
// what position k holds this round: byte ranges in explicit plans, ranges of per-rank
// blocks with the step's piece in loop bodies (size-free plans, see Loop in plan.h).

template <typename Segs>
void reduceScatterPass(PlanBuilder& b, const SubRing& r, const Segs& segs, Buf srcBuf, Buf dstBuf,
                       bool srcPartial, bool dstPartial) {
  auto src = [&](size_t o) { return partialIf(srcPartial, {srcBuf, o}); };
  auto dst = [&](size_t o) { return partialIf(dstPartial, {dstBuf, o}); };
  const int n = r.size();
  for (const Seg& s : segs(r.wrap(r.pos - 1))) b.send(src(s.src), s.len);
  for (int j = 2; j < n; ++j)
    for (const Seg& s : segs(r.wrap(r.pos - j))) b.recvReduceSend(src(s.src), s.len);
  for (const Seg& s : segs(r.pos)) b.recvReduceCopy(src(s.src), dst(s.dst), s.len);
}

template <typename Segs>
void allGatherPass(PlanBuilder& b, const SubRing& r, const Segs& segs, Buf buf, const GatherOptions& o) {
  auto at = [&](Buf where, size_t off) { return partialIf(o.asIs, {where, off}); };
  auto shared = [&] {
    if (o.share) b.shareLast();
  };
  const int n = r.size();
  for (const Seg& s : segs(r.pos)) {
    if (o.ownFrom != Buf::kNone) b.sendCopy(at(o.ownFrom, s.src), at(buf, s.dst), s.len);
    else b.send(at(buf, s.dst), s.len);
    shared();
  }
  for (int j = 1; j < n - 1; ++j)
    for (const Seg& s : segs(r.wrap(r.pos - j))) {
      b.recvCopySend(at(buf, s.dst), s.len);
      shared();
    }
  for (const Seg& s : segs(r.wrap(r.pos - (n - 1)))) b.recv(at(buf, s.dst), s.len);
}

// `at(k)`: offset and length of position k's chunk this round, and which piece it is.
struct Part {
  size_t off, len;
  int piece;
};

template <typename At>
void allReducePass(PlanBuilder& b, const SubRing& r, const At& at, Buf srcBuf, bool srcPartial,
                   bool share) {
  auto src = [&](size_t o) { return partialIf(srcPartial, {srcBuf, o}); };
  auto shared = [&] {
    if (share) b.shareLast();
  };
  auto step = [&](int k) {
    const Part p = at(k);
    b.setPiece(p.piece);
    return std::make_pair(p.off, p.len);
  };
  const int n = r.size();
  auto [o, len] = step(r.pos - 1);
  b.send(src(o), len);
  for (int j = 2; j < n; ++j) {
    std::tie(o, len) = step(r.pos - j);
    b.recvReduceSend(src(o), len);
  }
  // From here on what a rank sends is final data in its receive buffer, which no later
  // step of this phase changes.
  std::tie(o, len) = step(r.pos);
  b.recvReduceCopySend(src(o), recvBuf(o), len);
  shared();
  for (int j = 1; j < n - 1; ++j) {
    std::tie(o, len) = step(r.pos - j);
    b.recvCopySend(recvBuf(o), len);
    shared();
  }
  std::tie(o, len) = step(r.pos + 1);
  b.recv(recvBuf(o), len);
  b.setPiece(0);
}

}  // namespace

void reduceScatter(PlanBuilder& b, const SubRing& r, const PieceFn& piece, Buf srcBuf,
                   Buf dstBuf, bool srcPartial, bool dstPartial, size_t chunk) {
  if (r.size() == 1) {
    for (const Seg& s : piece(0))
      b.copy(partialIf(srcPartial, {srcBuf, s.src}), partialIf(dstPartial, {dstBuf, s.dst}), s.len);
    return;
  }
  b.setPeers(r.group[r.wrap(r.pos + 1)], r.group[r.wrap(r.pos - 1)]);
  size_t len = longest(r, piece);
  for (size_t base = 0; base < len; base += chunk)
    reduceScatterPass(b, r, [&](int k) { return slice(piece(k), base, chunk); }, srcBuf, dstBuf,
                      srcPartial, dstPartial);
}

void allGather(PlanBuilder& b, const SubRing& r, const PieceFn& piece, Buf buf, size_t chunk,
               const GatherOptions& o) {
  if (r.size() == 1) return;
  b.setPeers(r.group[r.wrap(r.pos + 1)], r.group[r.wrap(r.pos - 1)]);
  size_t len = longest(r, piece);
  for (size_t base = 0; base < len; base += chunk)
    allGatherPass(b, r, [&](int k) { return slice(piece(k), base, chunk); }, buf, o);
}

void allReduce(PlanBuilder& b, const SubRing& r, size_t off, size_t bytes, size_t elt,
               Buf srcBuf, bool srcPartial, size_t chunk, bool share) {
  int n = r.size();
  if (n == 1) {
    if (srcBuf != Buf::kRecv) b.copy(partialIf(srcPartial, {srcBuf, off}), recvBuf(off), bytes);
    return;
  }
  b.setPeers(r.group[r.wrap(r.pos + 1)], r.group[r.wrap(r.pos - 1)]);
  const size_t count = bytes / elt, perLoop = n * std::max<size_t>(1, chunk / elt);
  for (size_t base = 0; base < count; base += perLoop) {
    size_t loop = std::min(perLoop, count - base);
    allReducePass(b, r, [&](int k) {  // chunk k of this round
      size_t i = r.wrap(k), lo = loop * i / n, hi = loop * (i + 1) / n;
      return Part{off + (base + lo) * elt, (hi - lo) * elt, 0};
    }, srcBuf, srcPartial, share);
  }
}

void reduceScatterBody(PlanBuilder& b, const SubRing& r, const BlockFn& blocks, Buf srcBuf,
                       Buf dstBuf) {
  b.setPeers(r.group[r.wrap(r.pos + 1)], r.group[r.wrap(r.pos - 1)]);
  reduceScatterPass(b, r, [&](int k) { return Piece{blocks(k)}; }, srcBuf, dstBuf, false, false);
}

void allGatherBody(PlanBuilder& b, const SubRing& r, const BlockFn& blocks, Buf buf,
                   const GatherOptions& o) {
  b.setPeers(r.group[r.wrap(r.pos + 1)], r.group[r.wrap(r.pos - 1)]);
  allGatherPass(b, r, [&](int k) { return Piece{blocks(k)}; }, buf, o);
}

void allReduceBody(PlanBuilder& b, const SubRing& r, Buf srcBuf, bool share) {
  b.setPeers(r.group[r.wrap(r.pos + 1)], r.group[r.wrap(r.pos - 1)]);
  allReducePass(b, r, [&](int k) { return Part{0, 0, r.wrap(k)}; }, srcBuf, false, share);
}

}  // namespace ringphase
}  // namespace loom
