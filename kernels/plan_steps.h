// The steps of a plan as every executor sees them, written once for host threads and CUDA
// kernels (nvcc compiles this header): what a step is, which concrete step a size-free
// loop yields at a given position (StepSeqT), and how one FIFO piece of a step maps onto
// the step primitive (pieceOf). algo/plan.h builds plans out of these; the CPU executor
// walks them over std::vector-held plans, the interpreter (kernels/interp.h) over the flat
// copy a kernel reads. The meaning of each step is in algo/plan.h.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kernels/hd.h"
#include "kernels/step_primitive.h"

namespace loom {

enum class StepOp : uint8_t {
  kSend,
  kRecv,
  kRecvReduceSend,
  kRecvReduceCopy,
  kRecvReduceCopySend,
  kRecvCopySend,
  kCopy,
  kLocalReduce,
};

// kShare: the data the step sends stays unchanged in this rank's memory until the whole
// operation completes, so a transport that can read peer memory may take it from there
// (one copy instead of two); the executor then waits for the peer before completing.
enum StepFlags : uint8_t { kSrcPartial = 1, kDstPartial = 2, kShare = 4 };

// kAbsolute: offset is an address (per-call plans such as a group's send/recv batch).
enum class Buf : uint8_t { kNone, kSend, kRecv, kScratch, kAbsolute };

struct BufRef {
  Buf buf = Buf::kNone;
  size_t offset = 0;  // bytes
  // Builder input only (see partial() in algo/plan.h); PlanBuilder turns it into step flags.
  bool partial = false;
};

struct Step {
  StepOp op;
  int sendPeer = -1;
  int recvPeer = -1;
  BufRef src;
  BufRef dst;
  size_t bytes = 0;
  uint8_t flags = 0;
  uint8_t conn = 0;
  uint16_t piece = 0;  // loop bodies: which of the iteration's pieces the step moves
  uint8_t lag = 0;     // loop bodies: the step trails the iteration by this many (see Loop)
};

LOOM_HD inline bool stepRecvs(StepOp op) {
  return op != StepOp::kSend && op != StepOp::kCopy && op != StepOp::kLocalReduce;
}
LOOM_HD inline bool stepSends(StepOp op) {
  return op == StepOp::kSend || op == StepOp::kRecvReduceSend ||
         op == StepOp::kRecvReduceCopySend || op == StepOp::kRecvCopySend;
}

// Channel c's share [begin, end) of `count` elements split over `channels`: channels work
// on contiguous, nearly equal parts of the buffer.
struct Share {
  size_t begin, end;
  LOOM_HD size_t size() const { return end - begin; }
};
LOOM_HD inline Share channelShare(size_t count, int channels, int c) {
  return {count * static_cast<size_t>(c) / static_cast<size_t>(channels),
          count * static_cast<size_t>(c + 1) / static_cast<size_t>(channels)};
}

// One loop of a size-free plan, wherever its body is kept (see Loop in algo/plan.h).
struct LoopView {
  size_t perIter = 0;
  uint16_t pieces = 1;
  bool atLeastOnce = false;
  uint8_t lag = 0;
  const Step* body = nullptr;
  size_t bodySize = 0;
};

LOOM_HD inline size_t loopIterations(const LoopView& l, size_t len) {
  if (len == 0) return l.atLeastOnce ? 1 : 0;
  return l.perIter == 0 ? 1 : (len + l.perIter - 1) / l.perIter;
}

// The j-th step a lagging loop of n iterations runs: its iteration and body index. Only the
// first and the last `lag` rounds skip steps; the rounds between run the whole body.
// False when j is past the loop's end.
LOOM_HD inline bool laggedStep(const LoopView& loop, size_t n, size_t j, size_t* iter, size_t* k) {
  const size_t b = loop.bodySize, lag = loop.lag;
  // Finds j among the steps of `round` (setting *k), or counts them off j.
  auto within = [&](size_t round) {
    for (*k = 0; *k < b; ++*k) {
      const size_t s = loop.body[*k].lag;
      if (round < s || round - s >= n) continue;
      if (j == 0) return true;
      --j;
    }
    return false;
  };
  size_t round = 0;
  for (; round < lag; ++round)
    if (within(round)) {
      *iter = round - loop.body[*k].lag;
      return true;
    }
  if (n > lag) {
    const size_t steady = (n - lag) * b;
    if (j < steady) {
      *k = j % b;
      *iter = lag + j / b - loop.body[*k].lag;
      return true;
    }
    j -= steady;
    round = n;
  }
  for (; round < n + lag; ++round)
    if (within(round)) {
      *iter = round - loop.body[*k].lag;
      return true;
    }
  return false;
}

// The concrete steps of one channel for a call of `count` elements of `elt` bytes (count
// as the plan's builder took it), one at a time: its explicit steps, then each loop's
// iterations over the channel's share. Ch says where the channel is kept:
//   size_t explicitCount() const;  const Step& explicitStep(size_t) const;
//   size_t loopCount() const;      LoopView loop(size_t) const;
// A step past the end (a broken plan) comes back with bytes 0 and op kCopy of nothing.
template <class Ch>
class StepSeqT {
 public:
  static constexpr size_t kMaxLoops = 4;

  StepSeqT() = default;
  // share: the channel's share of the count (size-free plans); ignored without loops.
  LOOM_HD StepSeqT(const Ch& ch, Share share, size_t count, size_t elt)
      : ch_(ch), count_(count), elt_(elt), share_(share) {
    size_ = ch_.explicitCount();
    const size_t loops = ch_.loopCount() < kMaxLoops ? ch_.loopCount() : kMaxLoops;
    for (size_t i = 0; i < loops; ++i) {
      const LoopView l = ch_.loop(i);
      size_ += loopIterations(l, share_.size()) * l.bodySize;
      loopEnd_[i] = size_;
    }
  }

  LOOM_HD size_t size() const { return size_; }

  LOOM_HD Step operator[](size_t i) const {
    if (i < ch_.explicitCount()) return ch_.explicitStep(i);
    size_t l = 0, first = ch_.explicitCount();
    while (l < kMaxLoops && i >= loopEnd_[l]) first = loopEnd_[l++];
    Step s;
    s.op = StepOp::kCopy;
    if (l == kMaxLoops) return s;
    const LoopView loop = ch_.loop(l);
    const size_t j = i - first;
    size_t iter = j / loop.bodySize, k = j % loop.bodySize;
    if (loop.lag > 0 && !laggedStep(loop, loopIterations(loop, share_.size()), j, &iter, &k))
      return s;
    s = loop.body[k];
    // This iteration's elements [at, at + len) of the channel's share, and the step's piece.
    const size_t at = share_.begin + iter * loop.perIter;
    const size_t left = share_.end - at;
    const size_t len = loop.perIter == 0 ? share_.size() : (loop.perIter < left ? loop.perIter : left);
    const size_t lo = len * s.piece / loop.pieces, hi = len * (s.piece + 1u) / loop.pieces;
    if (s.src.buf != Buf::kNone) s.src.offset = (s.src.offset * count_ + at + lo) * elt_;
    if (s.dst.buf != Buf::kNone) s.dst.offset = (s.dst.offset * count_ + at + lo) * elt_;
    s.bytes = (hi - lo) * elt_;
    s.piece = 0;
    s.lag = 0;
    return s;
  }

  // The sum of the steps' bytes, without visiting them.
  LOOM_HD size_t bytes() const {
    size_t total = 0;
    for (size_t i = 0; i < ch_.explicitCount(); ++i) total += ch_.explicitStep(i).bytes;
    const size_t len = share_.size();
    if (len == 0) return total;  // iterations of empty steps, if any
    const size_t loops = ch_.loopCount() < kMaxLoops ? ch_.loopCount() : kMaxLoops;
    for (size_t i = 0; i < loops; ++i) {
      const LoopView l = ch_.loop(i);
      // Full iterations of perIter elements, then what remains.
      const size_t full = l.perIter == 0 ? 0 : len / l.perIter;
      const size_t rest = l.perIter == 0 ? len : len - full * l.perIter;
      for (size_t k = 0; k < l.bodySize; ++k) {
        const unsigned p = l.body[k].piece;
        const size_t perFull = l.perIter * (p + 1) / l.pieces - l.perIter * p / l.pieces;
        const size_t perRest = rest * (p + 1) / l.pieces - rest * p / l.pieces;
        total += (full * perFull + perRest) * elt_;
      }
    }
    return total;
  }

 private:
  Ch ch_{};
  size_t count_ = 0, elt_ = 0;
  Share share_{0, 0};
  size_t size_ = 0;
  size_t loopEnd_[kMaxLoops] = {};  // steps up to the end of each loop
};

// Where bytes `off` on of a step's buffer reference lie, given the call's buffers.
LOOM_HD inline const char* bufAt(BufRef r, size_t off, const void* send, const void* recv,
                                 const void* scratch) {
  switch (r.buf) {
    case Buf::kSend: return static_cast<const char*>(send) + r.offset + off;
    case Buf::kRecv: return static_cast<const char*>(recv) + r.offset + off;
    case Buf::kScratch: return static_cast<const char*>(scratch) + r.offset + off;
    case Buf::kAbsolute: return reinterpret_cast<const char*>(r.offset) + off;
    case Buf::kNone: break;
  }
  return nullptr;
}

// The buffers and flags of bytes [off, off + n) of step s for the step primitive: b is the
// step's source, dst its destination (ptr(BufRef, off) resolves them), a local reduce reads
// its dst as the first source, and a send's copy into its own dst is skipped in place.
// Where the payload arrives from (a) and where the send goes (out) are the primitive's.
template <class Resolve>
LOOM_HD StepPiece pieceOf(const Step& s, size_t off, size_t n, bool hasPost, const Resolve& ptr) {
  StepPiece p;
  p.bytes = n;
  p.bPartial = s.flags & kSrcPartial;
  p.postDst = !(s.flags & kDstPartial) && hasPost;
  if (s.src.buf != Buf::kNone) p.b = ptr(s.src, off);
  if (s.dst.buf != Buf::kNone) p.dst = const_cast<void*>(static_cast<const void*>(ptr(s.dst, off)));
  if (s.op == StepOp::kLocalReduce) p.a = p.dst;
  if (s.op == StepOp::kSend && p.dst == p.b) p.dst = nullptr;
  return p;
}

}  // namespace loom
