// Ring phases over any group of ranks: reduce-scatter, all-gather and all-reduce of
// "pieces" (byte ranges per ring position) along a ring of the group. They are the one
// implementation of the ring: the flat ring collectives (ring.cc) run them with the whole
// communicator as the group, the hierarchical ones (hierarchical.cc) with a host's ranks
// or a rail of ranks across hosts.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "algo/plan.h"

namespace loom {
namespace ringphase {

// A piece is what one ring position contributes or ends up with: byte ranges, each read
// at `src` (in the source buffer) and written at `dst` (in the destination buffer).
// Pieces are the same on every rank, which is what keeps both ends of a step in step.
struct Seg {
  size_t src, dst, len;
};
using Piece = std::vector<Seg>;
using PieceFn = std::function<Piece(int position)>;

// A ring over `group` (ranks, in ring order) in which this rank sits at `pos`.
struct SubRing {
  const std::vector<int>& group;
  int pos;
  int size() const { return static_cast<int>(group.size()); }
  int wrap(int i) const { return ((i % size()) + size()) % size(); }
};

size_t total(const Piece& p);
// Bytes [begin, begin + len) of the piece's concatenated ranges.
Piece slice(const Piece& p, size_t begin, size_t len);

// Position k ends with piece(k) reduced over the group, written to dstBuf. srcPartial: the
// source already holds partial results; dstPartial: another phase completes the reduction
// (no post() here). Steps carry at most `chunk` bytes.
void reduceScatter(PlanBuilder& b, const SubRing& r, const PieceFn& piece, Buf srcBuf,
                   Buf dstBuf, bool srcPartial, bool dstPartial, size_t chunk);

struct GatherOptions {
  bool share = false;         // peers may read what we send from our memory (kShare)
  bool asIs = true;           // data moves as it is: no pre() on send, no post() on receipt
  Buf ownFrom = Buf::kNone;   // set: our own piece is read there (at src) and copied into
                              // buf (at dst) in the same pass that sends it
};
// In place in buf: position k's piece(k) (at its dst offsets) reaches every position.
void allGather(PlanBuilder& b, const SubRing& r, const PieceFn& piece, Buf buf, size_t chunk,
               const GatherOptions& o);

// buf[off, off + bytes) of the receive buffer reduced over the group, in place, reading
// this rank's contribution from srcBuf at the same offsets (srcPartial: it holds partial
// sums already). The step that completes a chunk also starts it round again; `share`:
// from then on peers may read it from our receive buffer.
void allReduce(PlanBuilder& b, const SubRing& r, size_t off, size_t bytes, size_t elt,
               Buf srcBuf, bool srcPartial, size_t chunk, bool share);

// Loop bodies of size-free plans (see Loop in plan.h): one round of the phase over the
// whole group, after b.beginLoop(). The all-reduce's round has one piece per position
// (beginLoop with r.size() pieces); the others move the round's elements of per-rank
// blocks: blocks(k) gives position k's blocks, Seg{src block, dst block, 0}.
using BlockFn = std::function<Seg(int position)>;
void reduceScatterBody(PlanBuilder& b, const SubRing& r, const BlockFn& blocks, Buf srcBuf, Buf dstBuf);
void allGatherBody(PlanBuilder& b, const SubRing& r, const BlockFn& blocks, Buf buf,
                   const GatherOptions& o);
void allReduceBody(PlanBuilder& b, const SubRing& r, Buf srcBuf, bool share);

}  // namespace ringphase
}  // namespace loom
