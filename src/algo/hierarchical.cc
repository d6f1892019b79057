#include "algo/hierarchical.h"

#include <algorithm>
#include <functional>
#include <tuple>
#include <utility>

#include "base/error.h"

namespace loom {

int HostLayout::minLocal() const {
  size_t m = hosts.empty() ? 0 : hosts[0].size();
  for (const auto& h : hosts) m = std::min(m, h.size());
  return static_cast<int>(m);
}

bool HostLayout::even() const {
  for (const auto& h : hosts)
    if (h.size() != hosts[0].size()) return false;
  return true;
}

HostLayout HostLayout::single(int nranks, int rank) {
  HostLayout l;
  l.hosts.resize(1);
  for (int r = 0; r < nranks; ++r) l.hosts[0].push_back(r);
  l.local = rank;
  return l;
}

namespace {

// A piece is what one ring position contributes or ends up with: byte ranges, each read
// at `src` (in the source buffer) and written at `dst` (in the destination buffer).
// Pieces are the same on every rank, which is what keeps both ends of a step in step.
struct Seg {
  size_t src, dst, len;
};
using Piece = std::vector<Seg>;
using PieceFn = std::function<Piece(int position)>;

size_t total(const Piece& p) {
  size_t t = 0;
  for (const Seg& s : p) t += s.len;
  return t;
}

// Bytes [begin, begin + len) of the piece's concatenated ranges.
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

// A ring over `group` (ranks, in ring order) in which this rank sits at `pos`.
struct SubRing {
  const std::vector<int>& group;
  int pos;
  int size() const { return static_cast<int>(group.size()); }
  int wrap(int i) const { return ((i % size()) + size()) % size(); }
};

size_t longest(const SubRing& r, const PieceFn& piece) {
  size_t m = 0;
  for (int k = 0; k < r.size(); ++k) m = std::max(m, total(piece(k)));
  return m;
}

// Ring reduce-scatter: position k ends with piece(k) reduced over the group, written to
// dstBuf. srcFlags marks a source that already holds partial results; `last` is added to
// the final step (kDstPartial when another phase completes the reduction).
void ringReduceScatter(PlanBuilder& b, const SubRing& r, const PieceFn& piece, Buf srcBuf,
                       Buf dstBuf, uint8_t srcFlags, uint8_t last, size_t chunk) {
  int n = r.size();
  if (n == 1) {
    for (const Seg& s : piece(0)) b.copy({srcBuf, s.src}, {dstBuf, s.dst}, s.len, srcFlags | last);
    return;
  }
  b.setPeers(r.group[r.wrap(r.pos + 1)], r.group[r.wrap(r.pos - 1)]);
  size_t len = longest(r, piece);
  for (size_t base = 0; base < len; base += chunk) {
    for (const Seg& s : slice(piece(r.wrap(r.pos - 1)), base, chunk))
      b.add(StepOp::kSend, {srcBuf, s.src}, {}, s.len, srcFlags);
    for (int j = 2; j < n; ++j)
      for (const Seg& s : slice(piece(r.wrap(r.pos - j)), base, chunk))
        b.add(StepOp::kRecvReduceSend, {srcBuf, s.src}, {}, s.len, srcFlags);
    for (const Seg& s : slice(piece(r.pos), base, chunk))
      b.add(StepOp::kRecvReduceCopy, {srcBuf, s.src}, {dstBuf, s.dst}, s.len, srcFlags | last);
  }
}

// Ring all-gather in place: position k's piece(k) (at its dst offsets in buf) reaches
// everyone. Data moves as it is (no pre/post); `share` lets same-host peers read it from
// this rank's memory.
void ringAllGather(PlanBuilder& b, const SubRing& r, const PieceFn& piece, Buf buf, bool share,
                   size_t chunk) {
  int n = r.size();
  if (n == 1) return;
  b.setPeers(r.group[r.wrap(r.pos + 1)], r.group[r.wrap(r.pos - 1)]);
  uint8_t flags = kSrcPartial | kDstPartial | (share ? kShare : 0);
  size_t len = longest(r, piece);
  for (size_t base = 0; base < len; base += chunk) {
    for (const Seg& s : slice(piece(r.pos), base, chunk))
      b.add(StepOp::kSend, {buf, s.dst}, {}, s.len, flags);
    for (int j = 1; j < n - 1; ++j)
      for (const Seg& s : slice(piece(r.wrap(r.pos - j)), base, chunk))
        b.add(StepOp::kRecvCopySend, {}, {buf, s.dst}, s.len, flags);
    for (const Seg& s : slice(piece(r.wrap(r.pos - (n - 1))), base, chunk))
      b.add(StepOp::kRecv, {}, {buf, s.dst}, s.len, flags);
  }
}

// Ring all-reduce of buf[off, off + bytes) in place, reading this rank's contribution from
// srcBuf at the same offsets (srcFlags: kSrcPartial when it already holds partial sums).
// As the flat ring does, the step that completes a chunk also starts it on its way round.
void ringAllReduce(PlanBuilder& b, const SubRing& r, size_t off, size_t bytes, size_t elt,
                   Buf srcBuf, uint8_t srcFlags, size_t chunk) {
  int n = r.size();
  if (n == 1) {
    if (srcBuf != Buf::kRecv) b.copy({srcBuf, off}, recvBuf(off), bytes, srcFlags);
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
    b.add(StepOp::kSend, {srcBuf, o}, {}, len, srcFlags);
    for (int j = 2; j < n; ++j) {
      std::tie(o, len) = at(r.pos - j);
      b.add(StepOp::kRecvReduceSend, {srcBuf, o}, {}, len, srcFlags);
    }
    std::tie(o, len) = at(r.pos);
    b.add(StepOp::kRecvReduceCopySend, {srcBuf, o}, recvBuf(o), len, srcFlags);
    for (int j = 1; j < n - 1; ++j) {
      std::tie(o, len) = at(r.pos - j);
      b.add(StepOp::kRecvCopySend, {}, recvBuf(o), len);
    }
    std::tie(o, len) = at(r.pos + 1);
    b.add(StepOp::kRecv, {}, recvBuf(o), len);
  }
}

// Part i of `bytes` split into n nearly equal parts on element boundaries.
Seg part(size_t base, size_t bytes, size_t elt, int n, int i) {
  size_t count = bytes / elt;
  size_t b = count * i / n, e = count * (i + 1) / n;
  return {base + b * elt, base + b * elt, (e - b) * elt};
}

Plan start(Collective c) {
  Plan p;
  p.coll = c;
  p.algo = Algorithm::kHierarchical;
  p.channels.resize(1);
  return p;
}

std::vector<int> rail(const HostLayout& l, int j) {
  std::vector<int> g;
  for (const auto& h : l.hosts) g.push_back(h[j]);
  return g;
}

// The blocks (B bytes each, in rank order in the buffer) of every host's local rank k, in
// host order; written at the same place, or packed at h * B when `packed`.
Piece railBlocks(const HostLayout& l, int k, size_t B, bool packed) {
  Piece p;
  for (int h = 0; h < l.nhosts(); ++h) {
    size_t at = l.hosts[h][k] * B;
    p.push_back({at, packed ? h * B : at, B});
  }
  return p;
}

void checkLayout(const HostLayout& l, bool needEven) {
  if (l.nhosts() < 1 || l.host >= l.nhosts() || l.local >= static_cast<int>(l.hosts[l.host].size()))
    LOOM_THROW(kInternalError, "hierarchical: bad host layout");
  if (needEven && !l.even())
    LOOM_THROW(kInternalError, "hierarchical: this collective needs the same ranks on every host");
}

}  // namespace

// Large buffers are split over two channels (each on its own connections): while one
// half crosses the network the other is in its intra-host phases, so the three phases of
// one half overlap those of the other instead of running one after another.
constexpr size_t kTwoChannelBytes = 1 << 20;

Plan hierarchicalAllReduce(const HostLayout& l, size_t count, size_t elt, size_t chunk) {
  checkLayout(l, false);
  Plan plan = start(Collective::kAllReduce);
  const int channels = count * elt >= kTwoChannelBytes ? 2 : 1;
  plan.channels.resize(channels);
  const int R = l.minLocal();
  SubRing host{l.hosts[l.host], l.local};
  // A rank alone on its host has nothing to combine locally: its rail reads the input.
  const bool alone = host.size() == 1;
  for (int c = 0; c < channels; ++c) {
    PlanBuilder b(plan.channels[c], -1, -1);
    b.setConn(c);
    const size_t lo = count * c / channels, hi = count * (c + 1) / channels;
    const size_t base = lo * elt, bytes = (hi - lo) * elt;
    // Part k < R of this channel's range belongs to local rank k; local ranks >= R own nothing.
    PieceFn owned = [&](int k) { return k < R ? Piece{part(base, bytes, elt, R, k)} : Piece{}; };
    if (!alone) ringReduceScatter(b, host, owned, Buf::kSend, Buf::kRecv, 0, kDstPartial, chunk);
    if (l.local < R) {
      std::vector<int> group = rail(l, l.local);
      SubRing net{group, l.host};
      Seg mine = part(base, bytes, elt, R, l.local);
      ringAllReduce(b, net, mine.dst, mine.len, elt, alone ? Buf::kSend : Buf::kRecv,
                    alone ? 0 : kSrcPartial, chunk);
    }
    ringAllGather(b, host, owned, Buf::kRecv, true, chunk);
  }
  return plan;
}

Plan hierarchicalReduceScatter(const HostLayout& l, size_t count, size_t elt, size_t chunk) {
  checkLayout(l, true);
  Plan plan = start(Collective::kReduceScatter);
  PlanBuilder b(plan.channels[0], -1, -1);
  const size_t B = count * elt;
  const int N = l.nhosts();
  SubRing host{l.hosts[l.host], l.local};
  // Local rank k first sums, over its host, the blocks of every host's local rank k into
  // scratch (block of host h at h * B); then the rail finishes each block on its owner.
  plan.scratchBytes = N * B;
  PieceFn blocks = [&](int k) { return railBlocks(l, k, B, true); };
  ringReduceScatter(b, host, blocks, Buf::kSend, Buf::kScratch, 0, kDstPartial, chunk);
  std::vector<int> group = rail(l, l.local);
  SubRing net{group, l.host};
  PieceFn own = [&](int m) { return Piece{{m * B, 0, B}}; };
  ringReduceScatter(b, net, own, Buf::kScratch, Buf::kRecv, kSrcPartial, 0, chunk);
  return plan;
}

Plan hierarchicalAllGather(const HostLayout& l, size_t count, size_t elt, size_t chunk) {
  checkLayout(l, true);
  Plan plan = start(Collective::kAllGather);
  PlanBuilder b(plan.channels[0], -1, -1);
  const size_t B = count * elt;
  const int me = l.hosts[l.host][l.local];
  b.copy(sendBuf(0), recvBuf(me * B), B);
  std::vector<int> group = rail(l, l.local);
  SubRing net{group, l.host};
  PieceFn railBlock = [&](int m) {
    size_t off = l.hosts[m][l.local] * B;
    return Piece{{off, off, B}};
  };
  ringAllGather(b, net, railBlock, Buf::kRecv, false, chunk);
  SubRing host{l.hosts[l.host], l.local};
  PieceFn blocks = [&](int k) { return railBlocks(l, k, B, false); };
  ringAllGather(b, host, blocks, Buf::kRecv, true, chunk);
  return plan;
}

}  // namespace loom
