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

void reduceScatter(PlanBuilder& b, const SubRing& r, const PieceFn& piece, Buf srcBuf,
                   Buf dstBuf, bool srcPartial, bool dstPartial, size_t chunk) {
  auto src = [&](size_t o) { return partialIf(srcPartial, {srcBuf, o}); };
  auto dst = [&](size_t o) { return partialIf(dstPartial, {dstBuf, o}); };
  int n = r.size();
  if (n == 1) {
    for (const Seg& s : piece(0)) b.copy(src(s.src), dst(s.dst), s.len);
    return;
  }
  b.setPeers(r.group[r.wrap(r.pos + 1)], r.group[r.wrap(r.pos - 1)]);
  size_t len = longest(r, piece);
  for (size_t base = 0; base < len; base += chunk) {
    for (const Seg& s : slice(piece(r.wrap(r.pos - 1)), base, chunk)) b.send(src(s.src), s.len);
    for (int j = 2; j < n; ++j)
      for (const Seg& s : slice(piece(r.wrap(r.pos - j)), base, chunk))
        b.recvReduceSend(src(s.src), s.len);
    for (const Seg& s : slice(piece(r.pos), base, chunk))
      b.recvReduceCopy(src(s.src), dst(s.dst), s.len);
  }
}

void allGather(PlanBuilder& b, const SubRing& r, const PieceFn& piece, Buf buf, size_t chunk,
               const GatherOptions& o) {
  int n = r.size();
  if (n == 1) return;
  b.setPeers(r.group[r.wrap(r.pos + 1)], r.group[r.wrap(r.pos - 1)]);
  auto at = [&](Buf where, size_t off) { return partialIf(o.asIs, {where, off}); };
  auto shared = [&] {
    if (o.share) b.shareLast();
  };
  size_t len = longest(r, piece);
  for (size_t base = 0; base < len; base += chunk) {
    for (const Seg& s : slice(piece(r.pos), base, chunk)) {
      if (o.ownFrom != Buf::kNone) b.sendCopy(at(o.ownFrom, s.src), at(buf, s.dst), s.len);
      else b.send(at(buf, s.dst), s.len);
      shared();
    }
    for (int j = 1; j < n - 1; ++j)
      for (const Seg& s : slice(piece(r.wrap(r.pos - j)), base, chunk)) {
        b.recvCopySend(at(buf, s.dst), s.len);
        shared();
      }
    for (const Seg& s : slice(piece(r.wrap(r.pos - (n - 1))), base, chunk))
      b.recv(at(buf, s.dst), s.len);
  }
}

void allReduce(PlanBuilder& b, const SubRing& r, size_t off, size_t bytes, size_t elt,
               Buf srcBuf, bool srcPartial, size_t chunk, bool share) {
  auto src = [&](size_t o) { return partialIf(srcPartial, {srcBuf, o}); };
  auto shared = [&] {
    if (share) b.shareLast();
  };
  int n = r.size();
  if (n == 1) {
    if (srcBuf != Buf::kRecv) b.copy(src(off), recvBuf(off), bytes);
    return;
  }
  b.setPeers(r.group[r.wrap(r.pos + 1)], r.group[r.wrap(r.pos - 1)]);
  const size_t count = bytes / elt, perLoop = n * std::max<size_t>(1, chunk / elt);
  for (size_t base = 0; base < count; base += perLoop) {
    size_t loop = std::min(perLoop, count - base);
    auto at = [&](int k) {  // chunk k of this loop: byte offset and length
      size_t i = r.wrap(k), lo = loop * i / n, hi = loop * (i + 1) / n;
      return std::make_pair(off + (base + lo) * elt, (hi - lo) * elt);
    };
    auto [o, len] = at(r.pos - 1);
    b.send(src(o), len);
    for (int j = 2; j < n; ++j) {
      std::tie(o, len) = at(r.pos - j);
      b.recvReduceSend(src(o), len);
    }
    // From here on what a rank sends is final data in its receive buffer, which no later
    // step of this phase changes.
    std::tie(o, len) = at(r.pos);
    b.recvReduceCopySend(src(o), recvBuf(o), len);
    shared();
    for (int j = 1; j < n - 1; ++j) {
      std::tie(o, len) = at(r.pos - j);
      b.recvCopySend(recvBuf(o), len);
      shared();
    }
    std::tie(o, len) = at(r.pos + 1);
    b.recv(recvBuf(o), len);
  }
}

}  // namespace ringphase
}  // namespace loom
