#include "algo/plan.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "base/error.h"

namespace loom {
namespace {

const char* opName(StepOp op) {
  switch (op) {
    case StepOp::kSend: return "send";
    case StepOp::kRecv: return "recv";
    case StepOp::kRecvReduceSend: return "recvReduceSend";
    case StepOp::kRecvReduceCopy: return "recvReduceCopy";
    case StepOp::kRecvReduceCopySend: return "recvReduceCopySend";
    case StepOp::kRecvCopySend: return "recvCopySend";
    case StepOp::kCopy: return "copy";
    case StepOp::kLocalReduce: return "localReduce";
  }
  return "?";
}

std::string bufStr(BufRef b) {
  const char* n = b.buf == Buf::kSend      ? "send"
                  : b.buf == Buf::kRecv    ? "recv"
                  : b.buf == Buf::kScratch ? "scratch"
                                           : "addr";
  return b.buf == Buf::kNone ? "-" : strprintf("%s+%zu", n, b.offset);
}

void addUnique(std::vector<std::pair<int, int>>* v, int p, int conn) {
  if (p < 0) return;
  std::pair<int, int> k{p, conn};
  if (std::find(v->begin(), v->end(), k) == v->end()) v->push_back(k);
}

}  // namespace

void Plan::peers(std::vector<std::pair<int, int>>* sends,
                 std::vector<std::pair<int, int>>* recvs) const {
  auto add = [&](const std::vector<Step>& steps) {
    for (const Step& s : steps) {
      addUnique(sends, s.sendPeer, s.conn);
      addUnique(recvs, s.recvPeer, s.conn);
    }
  };
  for (const auto& ch : channels) {
    add(ch.steps);
    for (const Loop& l : ch.loops) add(l.body);
  }
}

void PlanBuilder::beginLoop(size_t perIter, int pieces, bool atLeastOnce) {
  if (ch_.loops.size() >= ChannelPlan::kMaxLoops)
    LOOM_THROW(kInternalError, "a channel of a plan has more than %zu loops", ChannelPlan::kMaxLoops);
  Loop& l = ch_.loops.emplace_back();
  l.perIter = perIter;
  l.pieces = static_cast<uint16_t>(std::max(1, pieces));
  l.atLeastOnce = atLeastOnce;
  out_ = &l.body;
  piece_ = 0;
  lag_ = 0;
}

void PlanBuilder::setLag(int lag) {
  if (out_ == &ch_.steps || lag < 0 || lag > 255)
    LOOM_THROW(kInternalError, "a step lag of %d outside a loop body or out of range", lag);
  lag_ = static_cast<uint8_t>(lag);
  ch_.loops.back().lag = std::max(ch_.loops.back().lag, lag_);
}

Plan expandPlan(const Plan& plan, size_t count, size_t elt) {
  if (!plan.sizeFree()) return plan;
  Plan out;
  out.coll = plan.coll;
  out.algo = plan.algo;
  out.scratchBytes = plan.scratchBytes;
  out.channels.resize(plan.channels.size());
  for (size_t c = 0; c < plan.channels.size(); ++c) {
    StepSeq seq(plan, c, count, elt);
    for (size_t i = 0; i < seq.size(); ++i) out.channels[c].steps.push_back(seq[i]);
  }
  return out;
}

Plan splitByChannel(int channels, size_t count, size_t elt, const std::function<Plan(size_t count)>& build) {
  if (channels <= 1) return build(count);
  Plan plan;
  int nextConn = 0;
  for (int c = 0; c < channels; ++c) {
    const Share share = channelShare(count, channels, c);
    if (share.size() == 0 && c > 0) continue;
    const Plan part = build(share.size());
    if (part.sizeFree()) LOOM_THROW(kInternalError, "splitByChannel takes explicit plans only");
    plan.coll = part.coll;
    plan.algo = part.algo;
    int conns = 1;  // the part's own connection indices, kept apart per channel
    for (const ChannelPlan& ch : part.channels)
      for (const Step& s : ch.steps) conns = std::max(conns, s.conn + 1);
    const size_t base = share.begin * elt, scratchBase = plan.scratchBytes;
    auto shift = [&](BufRef r) {
      if (r.buf == Buf::kSend || r.buf == Buf::kRecv) r.offset += base;
      else if (r.buf == Buf::kScratch) r.offset += scratchBase;
      return r;
    };
    const int connBase = nextConn;
    nextConn += conns;
    for (const ChannelPlan& ch : part.channels) {
      ChannelPlan& out = plan.channels.emplace_back();
      out.steps = ch.steps;
      for (Step& s : out.steps) {
        s.src = shift(s.src);
        s.dst = shift(s.dst);
        s.conn = static_cast<uint8_t>(connBase + s.conn);
      }
    }
    plan.scratchBytes += part.scratchBytes;
  }
  return plan;
}

std::string Plan::str() const {
  std::string out = strprintf("%s/%s, %zu channel(s)%s\n", collectiveName(coll),
                              algorithmName(algo), channels.size(),
                              sizeFree() ? strprintf(", size-free over %d share(s)", shares).c_str() : "");
  auto line = [&](size_t c, const Step& s, const char* piece) {
    out += strprintf("  ch%zu %-18s %s src=%-14s dst=%-14s to=%d from=%d conn=%d%s%s\n", c,
                     opName(s.op), piece, bufStr(s.src).c_str(), bufStr(s.dst).c_str(),
                     s.sendPeer, s.recvPeer, s.conn, s.flags & kSrcPartial ? " srcPartial" : "",
                     s.flags & kDstPartial ? " dstPartial" : "");
  };
  for (size_t c = 0; c < channels.size(); ++c) {
    for (const Step& s : channels[c].steps) line(c, s, strprintf("bytes=%-10zu", s.bytes).c_str());
    for (const Loop& l : channels[c].loops) {
      out += strprintf("  ch%zu loop over the share, %s per iteration in %d piece(s)%s:\n", c,
                       l.perIter ? strprintf("%zu elements", l.perIter).c_str() : "all of it",
                       l.pieces, l.atLeastOnce ? ", once even if empty" : "");
      // Offsets in loop bodies count per-rank blocks.
      for (const Step& s : l.body)
        line(c, s, (l.lag ? strprintf("  piece=%d lag=%d", s.piece, s.lag)
                          : strprintf("  piece=%-5d", s.piece)).c_str());
    }
  }
  return out;
}

}  // namespace loom
