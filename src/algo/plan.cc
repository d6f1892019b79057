#include "algo/plan.h"

#include <algorithm>

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
  for (const auto& ch : channels)
    for (const Step& s : ch.steps) {
      addUnique(sends, s.sendPeer, s.conn);
      addUnique(recvs, s.recvPeer, s.conn);
    }
}

Plan splitByChannel(int channels, size_t count, size_t elt, const std::function<Plan(size_t count)>& build) {
  if (channels <= 1) return build(count);
  Plan plan;
  int nextConn = 0;
  for (int c = 0; c < channels; ++c) {
    const Share share = channelShare(count, channels, c);
    if (share.size() == 0 && c > 0) continue;
    const Plan part = build(share.size());
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
  std::string out = strprintf("%s/%s, %zu channel(s)\n", collectiveName(coll),
                              algorithmName(algo), channels.size());
  for (size_t c = 0; c < channels.size(); ++c)
    for (const Step& s : channels[c].steps)
      out += strprintf("  ch%zu %-18s bytes=%-10zu src=%-14s dst=%-14s to=%d from=%d conn=%d%s%s\n",
                       c, opName(s.op), s.bytes, bufStr(s.src).c_str(), bufStr(s.dst).c_str(),
                       s.sendPeer, s.recvPeer, s.conn, s.flags & kSrcPartial ? " srcPartial" : "",
                       s.flags & kDstPartial ? " dstPartial" : "");
  return out;
}

}  // namespace loom
