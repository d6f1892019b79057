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

// Appends steps to a channel; algorithms are written against this so they read like the
// textbook: b.send(chunk); b.recvReduceSend(chunk); ...
class PlanBuilder {
 public:
  PlanBuilder(ChannelPlan& ch, int sendPeer, int recvPeer)
      : ch_(ch), sendPeer_(sendPeer), recvPeer_(recvPeer) {}
  void setPeers(int sendPeer, int recvPeer) { sendPeer_ = sendPeer; recvPeer_ = recvPeer; }
  void setConn(int conn) { conn_ = static_cast<uint8_t>(conn); }

  void send(BufRef src, size_t bytes) { add(StepOp::kSend, src, {}, bytes); }
  void recv(BufRef dst, size_t bytes) { add(StepOp::kRecv, {}, dst, bytes); }
  void recvReduceSend(BufRef src, size_t bytes) { add(StepOp::kRecvReduceSend, src, {}, bytes); }
  void recvReduceCopy(BufRef src, BufRef dst, size_t bytes) {
    add(StepOp::kRecvReduceCopy, src, dst, bytes);
  }
  void recvReduceCopySend(BufRef src, BufRef dst, size_t bytes) {
    add(StepOp::kRecvReduceCopySend, src, dst, bytes);
  }
  void recvCopySend(BufRef dst, size_t bytes) { add(StepOp::kRecvCopySend, {}, dst, bytes); }
  void copy(BufRef src, BufRef dst, size_t bytes, uint8_t flags = 0) {
    add(StepOp::kCopy, src, dst, bytes, flags);
  }
  void localReduce(BufRef src, BufRef dst, size_t bytes, uint8_t flags = 0) {
    add(StepOp::kLocalReduce, src, dst, bytes, flags);
  }
  // The flags of the step just added (e.g. b.last().flags |= kDstPartial).
  Step& last() { return ch_.steps.back(); }

  void add(StepOp op, BufRef src, BufRef dst, size_t bytes, uint8_t flags = 0) {
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
