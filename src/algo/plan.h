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
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "algo/collective.h"

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
  // Builder input only (see partial()); PlanBuilder turns it into step flags.
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
};

inline bool stepRecvs(StepOp op) {
  return op != StepOp::kSend && op != StepOp::kCopy && op != StepOp::kLocalReduce;
}
inline bool stepSends(StepOp op) {
  return op == StepOp::kSend || op == StepOp::kRecvReduceSend ||
         op == StepOp::kRecvReduceCopySend || op == StepOp::kRecvCopySend;
}

struct ChannelPlan {
  std::vector<Step> steps;
};

struct Plan {
  Collective coll = Collective::kAllReduce;
  Algorithm algo = Algorithm::kRing;
  std::vector<ChannelPlan> channels;
  size_t scratchBytes = 0;

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
  void shareLast() { ch_.steps.back().flags |= kShare; }

  // The partial marks of src and dst become kSrcPartial / kDstPartial.
  void add(StepOp op, BufRef src, BufRef dst, size_t bytes, uint8_t flags = 0) {
    if (src.partial) flags |= kSrcPartial;
    if (dst.partial) flags |= kDstPartial;
    // Only flags that mean something for the step: plans compare equal when they behave so.
    if (src.buf == Buf::kNone) flags &= ~kSrcPartial;
    if (dst.buf == Buf::kNone) flags &= ~kDstPartial;
    if (!stepSends(op)) flags &= ~kShare;
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
    ch_.steps.push_back(s);
  }

 private:
  ChannelPlan& ch_;
  int sendPeer_;
  int recvPeer_;
  uint8_t conn_ = 0;
};

// Channel c's share [begin, end) of `count` elements split over `channels`: channels work
// on contiguous, nearly equal parts of the buffer.
struct Share {
  size_t begin, end;
  size_t size() const { return end - begin; }
};
inline Share channelShare(size_t count, int channels, int c) {
  return {count * static_cast<size_t>(c) / static_cast<size_t>(channels),
          count * static_cast<size_t>(c + 1) / static_cast<size_t>(channels)};
}

// An elementwise collective (all-reduce) on `channels` channels, from a builder that knows
// one: channel c runs build(its share's count) on its share, at the same offsets of the
// send and receive buffers, with scratch of its own and connections of its own.
Plan splitByChannel(int channels, size_t count, size_t eltSize, const std::function<Plan(size_t count)>& build);

inline BufRef sendBuf(size_t off) { return {Buf::kSend, off}; }
inline BufRef recvBuf(size_t off) { return {Buf::kRecv, off}; }
inline BufRef absBuf(const void* p) { return {Buf::kAbsolute, reinterpret_cast<size_t>(p)}; }

}  // namespace loom
