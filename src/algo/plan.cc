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

void addUnique(std::vector<int>* v, int p) {
  if (p >= 0 && std::find(v->begin(), v->end(), p) == v->end()) v->push_back(p);
}

}  // namespace

void Plan::peers(std::vector<int>* sendPeers, std::vector<int>* recvPeers) const {
  for (const auto& ch : channels)
    for (const Step& s : ch.steps) {
      addUnique(sendPeers, s.sendPeer);
      addUnique(recvPeers, s.recvPeer);
    }
}

std::string Plan::str() const {
  std::string out = strprintf("%s/%s, %zu channel(s)\n", collectiveName(coll),
                              algorithmName(algo), channels.size());
  for (size_t c = 0; c < channels.size(); ++c)
    for (const Step& s : channels[c].steps)
      out += strprintf("  ch%zu %-18s bytes=%-10zu src=%-14s dst=%-14s to=%d from=%d\n", c,
                       opName(s.op), s.bytes, bufStr(s.src).c_str(), bufStr(s.dst).c_str(),
                       s.sendPeer, s.recvPeer);
  return out;
}

}  // namespace loom
