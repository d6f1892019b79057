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
