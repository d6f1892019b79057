// The device executor's plan interpreter, written once for CUDA blocks and host threads:
// one interpreter per channel walks the channel's steps (StepSeqT over a FlatPlan), cuts
// each into FIFO-slot pieces, waits for both FIFOs and runs the step primitive. A CUDA
// kernel runs it with one block per channel (kernels/cuda/interp_kernel.cu); CI runs the
// very same code with one host thread per channel (engine/interp_executor.h).
//
// A FlatPlan is a plan (algo/plan.h) in one relocatable block of memory, offsets instead
// of pointers, so it can be copied to a GPU as it is:
//
//   FlatPlan | FlatChannel[nChannels] | FlatLoop[...] | Step[...]
//
// What the interpreter needs from where it runs is an Env policy:
//   FifoEndT<Atomics>* recvFifo(int peer, int conn)   the connection FIFOs of the channel
//   FifoEndT<Atomics>* sendFifo(int peer, int conn)
//   const char* ptr(BufRef r, size_t off) const        a step's buffer, resolved
//   bool llRecv(int peer, int conn), llSend(...)       LL on: whether the FIFO's slots are
//                                                      shared by both ends (LL lines) or
//                                                      shipped (plain slots)
//   void* llStage(int which, size_t bytes)             LL on: a staging buffer of the
//                                                      channel (0: received, 1: to send)
// and the step primitive's Ops policy (kernels/step_primitive.h), plus lane() / lanes():
// which of how many threads runs it (0 / 1 on a host thread).
//
// Protocols: Simple moves a piece of up to a slot through the FIFO and publishes it with
// the tail counter; LL (kernels/ll.h) moves up to half a slot in flagged lines that the
// receiver polls directly. LL is on or off for a whole job (every rank cuts pieces to LL's
// size when it is on), and it applies to FIFOs whose slots both ends share; a transport
// that ships slots (TCP) carries plain LL-sized slots.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kernels/fifo_sync.h"
#include "kernels/hd.h"
#include "kernels/ll.h"
#include "kernels/plan_steps.h"
#include "kernels/step_primitive.h"

namespace loom {

constexpr uint32_t kFlatPlanMagic = 0x6c6f6f70;  // "loop"

struct FlatChannel {
  uint32_t steps, nSteps;  // explicit steps: index of the first, and how many
  uint32_t loops, nLoops;  // loops: index of the first, and how many
};

struct FlatLoop {
  uint64_t perIter;
  uint32_t body;  // index of the first body step
  uint16_t bodySize;
  uint16_t pieces;
  uint8_t atLeastOnce;
  uint8_t lag;
};

struct FlatPlan {
  uint32_t magic;
  uint32_t bytes;  // the whole block
  uint32_t nChannels;
  int32_t shares;  // > 0: size-free (see Plan::shares)
  uint64_t scratchBytes;
  uint32_t channelsAt, loopsAt, stepsAt;  // byte offsets from the start of the block
  uint32_t nLoops, nSteps;

  LOOM_HD const char* base() const { return reinterpret_cast<const char*>(this); }
  LOOM_HD const FlatChannel& channel(size_t c) const {
    return reinterpret_cast<const FlatChannel*>(base() + channelsAt)[c];
  }
  LOOM_HD const FlatLoop& loop(size_t i) const {
    return reinterpret_cast<const FlatLoop*>(base() + loopsAt)[i];
  }
  LOOM_HD const Step& step(size_t i) const {
    return reinterpret_cast<const Step*>(base() + stepsAt)[i];
  }
};

// A channel of a flat plan, as StepSeqT reads it.
struct FlatChannelSteps {
  const FlatPlan* plan = nullptr;
  const FlatChannel* ch = nullptr;

  LOOM_HD size_t explicitCount() const { return ch->nSteps; }
  LOOM_HD const Step& explicitStep(size_t i) const { return plan->step(ch->steps + i); }
  LOOM_HD size_t loopCount() const { return ch->nLoops; }
  LOOM_HD LoopView loop(size_t i) const {
    const FlatLoop& l = plan->loop(ch->loops + i);
    LoopView v;
    v.perIter = l.perIter;
    v.pieces = l.pieces;
    v.atLeastOnce = l.atLeastOnce != 0;
    v.lag = l.lag;
    v.body = &plan->step(l.body);
    v.bodySize = l.bodySize;
    return v;
  }
};

// The concrete steps channel c of a flat plan runs for `count` elements of `elt` bytes.
LOOM_HD inline StepSeqT<FlatChannelSteps> flatSteps(const FlatPlan& plan, size_t c, size_t count,
                                                    size_t elt) {
  FlatChannelSteps ch;
  ch.plan = &plan;
  ch.ch = &plan.channel(c);
  const Share share = plan.shares > 0 ? channelShare(count, plan.shares, static_cast<int>(c))
                                      : Share{0, 0};
  return StepSeqT<FlatChannelSteps>(ch, share, count, elt);
}

// One channel's interpreter. ready() is its only wait; run() does one piece once ready()
// held. A CUDA block asks ready() on one thread and runs the piece on all of them: every
// thread keeps its own interpreter, and they advance alike.
template <class Atomics, class Env>
class ChannelInterp {
 public:
  using Fifo = FifoEndT<Atomics>;

  LOOM_HD ChannelInterp(const FlatPlan& plan, size_t channel, size_t count, size_t elt, bool ll = false)
      : seq_(flatSteps(plan, channel, count, elt)), ll_(ll) {
    if (!done()) step_ = seq_[0];
  }

  LOOM_HD bool done() const { return cur_ >= seq_.size(); }
  // The step the channel is on (what it waits for, in messages).
  LOOM_HD const Step& current() const { return step_; }
  LOOM_HD size_t stepIndex() const { return cur_; }
  LOOM_HD size_t steps() const { return seq_.size(); }
  // The size of the current piece (what a peer must have posted).
  LOOM_HD size_t pieceBytes(size_t slotBytes) const {
    const size_t slot = ll_ ? llCapacity(slotBytes) : slotBytes;
    return step_.bytes - off_ < slot ? step_.bytes - off_ : slot;
  }

  LOOM_HD bool ready(Env& env) const {
    const Fifo* rf = recvFifo(env);
    const Fifo* sf = sendFifo(env);
    if (!ll_ || !rf || !env.llRecv(step_.recvPeer, step_.conn)) return stepReady(rf, sf);
    size_t bytes;
    return llArrived<Atomics>(rf->recvSlot(), rf->step, &bytes) && (!sf || sf->canSend());
  }

  // One FIFO piece of the current step (ready() held), then on to the next piece or step.
  // Returns false when the piece the peer posted has another size (a mismatched call):
  // nothing was consumed, and the channel cannot go on.
  template <class Ops>
  LOOM_HD bool run(Env& env, Ops& ops, bool hasPost) {
    Fifo* rf = recvFifo(env);
    Fifo* sf = sendFifo(env);
    const Step& s = step_;
    size_t slot = rf ? rf->slotBytes : sf ? sf->slotBytes : s.bytes;
    if (ll_ && (rf || sf)) slot = llCapacity(slot);
    size_t n = s.bytes - off_;
    if (n > slot) n = slot;
    StepPiece p = pieceOf(s, off_, n, hasPost, [&env](BufRef r, size_t o) { return env.ptr(r, o); });
    if (!ll_) {
      runReadyPiece(rf, sf, p, ops);
    } else if (!runLL(rf, sf, p, env, ops)) {
      return false;
    }
    off_ += n;
    if (off_ >= s.bytes) {
      off_ = 0;
      if (++cur_ < seq_.size()) step_ = seq_[cur_];
    }
    return true;
  }

 private:
  // One piece with LL on: the pieces are LL-sized on every connection, so that both ends of
  // each agree whichever protocol its neighbours use. A side whose FIFO both ends share
  // (env.llRecv / env.llSend) moves flagged lines through staging; any other side (a
  // transport that ships slots) moves plain slots as Simple does.
  template <class Ops>
  LOOM_HD bool runLL(Fifo* rf, Fifo* sf, StepPiece& p, Env& env, Ops& ops) {
    const bool llIn = rf && env.llRecv(step_.recvPeer, step_.conn);
    const bool llOut = sf && env.llSend(step_.sendPeer, step_.conn);
    if (llIn) {
      size_t posted = 0;
      llArrived<Atomics>(rf->recvSlot(), rf->step, &posted);
      // Decided alike by every lane of a block (anyLane is a barrier on a GPU).
      if (ops.anyLane(posted != p.bytes)) return false;
      void* in = env.llStage(0, p.bytes);
      const bool whole = llRead<Atomics>(rf->recvSlot(), in, p.bytes, rf->step, ops.lane(), ops.lanes(),
                                         [&ops] { return ops.stopRequested(); });
      if (ops.anyLane(!whole)) return false;
      ops.fence();  // every lane's part of the payload is in staging
      p.a = in;
    } else if (rf) {
      p.a = ops.received(*rf, p);
    }
    if (llOut) p.out = env.llStage(1, p.bytes);
    else if (sf) p.out = sf->sendSlot();
    computePiece(p, ops);
    ops.fence();  // the value is complete (in staging, or in the slot) before it goes out
    if (llOut) llWrite<Atomics>(sf->sendSlot(), p.out, p.bytes, sf->step, ops.lane(), ops.lanes());
    if (rf) rf->release();
    if (sf) sf->post(p.bytes);
    return true;
  }

  LOOM_HD Fifo* recvFifo(Env& env) const {
    return step_.recvPeer >= 0 ? env.recvFifo(step_.recvPeer, step_.conn) : nullptr;
  }
  LOOM_HD Fifo* sendFifo(Env& env) const {
    return step_.sendPeer >= 0 ? env.sendFifo(step_.sendPeer, step_.conn) : nullptr;
  }

  StepSeqT<FlatChannelSteps> seq_;
  Step step_{};
  size_t cur_ = 0;
  size_t off_ = 0;
  bool ll_ = false;
};

}  // namespace loom
