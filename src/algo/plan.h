// A plan is what an algorithm compiles a collective into, per rank: for each channel, a
// sequence of steps over connection FIFOs and chunks of the user buffers. The engine's
// executors (CPU now, CUDA later) run plans; they know nothing about algorithms.
//
// Step semantics (R = the reduction; pre/post are R's local scaling and final division):
//   send               peer <- pre(src); with dst set also dst <- post(pre(src)) (skipped
//                      when dst == src): all-gather's own block, read once for both
//   recv               dst  <- post(in)
//   recvReduceSend     peer <- in R pre(src)
//   recvReduceCopy     dst  <- post(in R pre(src))
//   recvReduceCopySend dst  <- post(in R pre(src)),  peer <- in R pre(src)
//   recvCopySend       dst  <- post(in),             peer <- in
//   copy               dst  <- post(pre(src))        (local, no connection)
//   localReduce        dst  <- post(dst R pre(src))  (local, no connection)
// Flags refine this for partial results: kSrcPartial (src already went through pre(), so
// it is not scaled again) and kDstPartial (dst is not final: post() is not applied).
// `conn` picks which of the connections to a peer the step uses: channels that run
// concurrently must not share a connection.
// A step of B bytes moves in ceil(B / slotBytes) FIFO steps (one if B == 0), so both ends
// of a connection must agree on B: a mismatch is detected and reported.
//
// Size-free plans. The ring and tree algorithms, which carry the large messages, write no
// step per chunk: a channel holds loops whose bodies say what one iteration over the channel's
// share of the buffer does, and the executor computes each concrete step from the call's
// count as it goes (StepSeq). Such a plan depends on the request's size only through the
// selection (algorithm, channels, chunk), so one plan serves every size that selects the
// same: the plan cache keeps them per size class. Plans of the other algorithms (direct and
// halving-doubling for small messages, the hierarchical compositions) list their steps
// (explicit plans).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "algo/collective.h"
#include "kernels/plan_steps.h"

namespace loom {

// One loop of a size-free plan. Iteration i covers elements [b + i * perIter, + perIter)
// of the channel's share [b, e) (the last one what remains), split into `pieces` nearly
// equal pieces: piece p of an iteration of L elements is [L * p / pieces, L * (p + 1) /
// pieces). A body step moves its piece; its buffer references count in per-rank blocks of
// count * elt bytes (offset k: the piece's elements within block k, as all-gather's output
// or reduce-scatter's input lay them out; 0 for elementwise collectives).
//
// Pipelines whose stages trail one another (the tree's broadcast follows its reduction two
// chunks behind) give a body step a lag: over the N iterations of the share, the loop runs
// N + lag rounds, and in round r a step of lag s moves iteration r - s when that is one of
// the N (so the first and last `lag` rounds run only some of the body). Every step still
// runs once per iteration.
struct Loop {
  size_t perIter = 0;        // elements per iteration; 0: the whole share in one
  uint16_t pieces = 1;
  bool atLeastOnce = false;  // an empty share still runs the body once, with empty steps
                             // (so that a zero-byte call meets its peers)
  uint8_t lag = 0;           // the largest lag of a body step
  std::vector<Step> body;
};

struct ChannelPlan {
  std::vector<Step> steps;  // explicit plans
  std::vector<Loop> loops;  // size-free plans (at most kMaxLoops)
  static constexpr size_t kMaxLoops = 4;
};

struct Plan {
  Collective coll = Collective::kAllReduce;
  Algorithm algo = Algorithm::kRing;
  std::vector<ChannelPlan> channels;
  size_t scratchBytes = 0;
  // > 0: a size-free plan; channel c runs its loops over channelShare(count, shares, c).
  int shares = 0;

  bool sizeFree() const { return shares > 0; }

  // Connections (peer, index) this rank sends on / receives from, for connection setup.
  void peers(std::vector<std::pair<int, int>>* sends, std::vector<std::pair<int, int>>* recvs) const;
  std::string str() const;  // one line per step, for loom-info / debugging
};

// A buffer of partial results. As a source: it has been through pre() already (not scaled
// again). As a destination: not final (post() is not applied; a later step finishes it).
inline BufRef partial(BufRef r) {
  r.partial = true;
  return r;
}
inline BufRef partialIf(bool p, BufRef r) {
  r.partial = p;
  return r;
}

// Appends steps to a channel; algorithms are written against this so they read like the
// textbook: b.send(chunk); b.recvReduceSend(chunk); ...
class PlanBuilder {
 public:
  PlanBuilder(ChannelPlan& ch, int sendPeer, int recvPeer)
      : ch_(ch), sendPeer_(sendPeer), recvPeer_(recvPeer) {}
  void setPeers(int sendPeer, int recvPeer) { sendPeer_ = sendPeer; recvPeer_ = recvPeer; }
  void setConn(int conn) { conn_ = static_cast<uint8_t>(conn); }
  // Steps from here on form the body of a new loop of a size-free plan (see Loop).
  void beginLoop(size_t perIter, int pieces, bool atLeastOnce);
  // Loop bodies: the piece of the iteration the following steps move.
  void setPiece(int piece) { piece_ = static_cast<uint16_t>(piece); }
  // Loop bodies: the following steps trail the iteration by `lag` rounds (see Loop).
  void setLag(int lag);

  void send(BufRef src, size_t bytes) { add(StepOp::kSend, src, {}, bytes); }
  // peer <- src and dst <- src, reading src once (all-gather's own block).
  void sendCopy(BufRef src, BufRef dst, size_t bytes) { add(StepOp::kSend, src, dst, bytes); }
  void recv(BufRef dst, size_t bytes) { add(StepOp::kRecv, {}, dst, bytes); }
  void recvReduceSend(BufRef src, size_t bytes) { add(StepOp::kRecvReduceSend, src, {}, bytes); }
  void recvReduceCopy(BufRef src, BufRef dst, size_t bytes) {
    add(StepOp::kRecvReduceCopy, src, dst, bytes);
  }
  void recvReduceCopySend(BufRef src, BufRef dst, size_t bytes) {
    add(StepOp::kRecvReduceCopySend, src, dst, bytes);
  }
  void recvCopySend(BufRef dst, size_t bytes) { add(StepOp::kRecvCopySend, {}, dst, bytes); }
  void copy(BufRef src, BufRef dst, size_t bytes) { add(StepOp::kCopy, src, dst, bytes); }
  void localReduce(BufRef src, BufRef dst, size_t bytes) {
    add(StepOp::kLocalReduce, src, dst, bytes);
  }
  // Bytes as they are, no pre() and no post() (a raw input kept aside, say).
  void copyAsIs(BufRef src, BufRef dst, size_t bytes) {
    copy(partial(src), partial(dst), bytes);
  }
  // buf holds complete results not yet through post(): apply it in place (a no-op step
  // for reductions without one).
  void finish(BufRef buf, size_t bytes) { copy(partial(buf), buf, bytes); }
  // The data the step just added sends stays unchanged in this rank's memory until the
  // operation completes: a transport that reads peer memory may take it from there.
  void shareLast() {
    if (stepSends(out_->back().op)) out_->back().flags |= kShare;
  }

  // The partial marks of src and dst become kSrcPartial / kDstPartial.
  // Only flags that mean something for the step: plans compare equal when they behave so.
  void add(StepOp op, BufRef src, BufRef dst, size_t bytes) {
    uint8_t flags = 0;
    if (src.partial && src.buf != Buf::kNone) flags |= kSrcPartial;
    if (dst.partial && dst.buf != Buf::kNone) flags |= kDstPartial;
    src.partial = dst.partial = false;
    Step s;
    s.op = op;
    s.sendPeer = stepSends(op) ? sendPeer_ : -1;
    s.recvPeer = stepRecvs(op) ? recvPeer_ : -1;
    s.src = src;
    s.dst = dst;
    s.bytes = bytes;
    s.flags = flags;
    s.conn = conn_;
    s.piece = piece_;
    s.lag = lag_;
    out_->push_back(s);
  }

 private:
  ChannelPlan& ch_;
  std::vector<Step>* out_ = &ch_.steps;
  int sendPeer_;
  int recvPeer_;
  uint8_t conn_ = 0;
  uint16_t piece_ = 0;
  uint8_t lag_ = 0;
};

// The concrete steps of one channel of a plan for a call of `count` elements of `elt`
// bytes (count as the plan's builder took it), one at a time: executors run size-free
// plans through it without writing their steps out. For explicit plans, the steps.
// (kernels/plan_steps.h's StepSeqT over a channel of a std::vector-held plan.)
struct ChannelSteps {
  const ChannelPlan* ch = nullptr;
  size_t explicitCount() const { return ch->steps.size(); }
  const Step& explicitStep(size_t i) const { return ch->steps[i]; }
  size_t loopCount() const { return ch->loops.size(); }
  LoopView loop(size_t i) const {
    const Loop& l = ch->loops[i];
    return {l.perIter, l.pieces, l.atLeastOnce, l.lag, l.body.data(), l.body.size()};
  }
};

class StepSeq : public StepSeqT<ChannelSteps> {
 public:
  StepSeq(const Plan& plan, size_t channel, size_t count, size_t elt)
      : StepSeqT<ChannelSteps>(ChannelSteps{&plan.channels[channel]},
                               plan.sizeFree() ? channelShare(count, plan.shares, static_cast<int>(channel))
                                               : Share{0, 0},
                               count, elt) {}
};

// A size-free plan written out for one count as an explicit plan (simulation, printing,
// tests); an explicit plan as it is.
Plan expandPlan(const Plan& plan, size_t count, size_t elt);

// An elementwise collective (all-reduce) on `channels` channels, from a builder that knows
// one: channel c runs build(its share's count) on its share, at the same offsets of the
// send and receive buffers, with scratch of its own and connections of its own.
Plan splitByChannel(int channels, size_t count, size_t eltSize, const std::function<Plan(size_t count)>& build);

inline BufRef sendBuf(size_t off) { return {Buf::kSend, off}; }
inline BufRef recvBuf(size_t off) { return {Buf::kRecv, off}; }
inline BufRef absBuf(const void* p) { return {Buf::kAbsolute, reinterpret_cast<size_t>(p)}; }

}  // namespace loom
