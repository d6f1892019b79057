#include "algo/tree.h"

#include <algorithm>

namespace loom {

Tree binaryTree(int n, int rank, bool mirror) {
  auto pos = [&](int r) { return mirror ? n - 1 - r : r; };
  auto rankAt = [&](int p) { return mirror ? n - 1 - p : p; };
  Tree t;
  int p = pos(rank);
  if (p > 0) t.parent = rankAt((p - 1) / 2);
  for (int c = 2 * p + 1; c <= 2 * p + 2 && c < n; ++c) t.children.push_back(rankAt(c));
  return t;
}

namespace {

// Loop bodies: offsets count per-rank blocks, and an all-reduce has one (block 0).
// Reduce the iteration's chunk up the tree: the partial sum lands in recv, then goes to
// the parent (or, at the root, becomes final).
void reduceUp(PlanBuilder& b, const Tree& t) {
  if (t.children.empty()) {
    b.setPeers(t.parent, -1);
    b.send(sendBuf(0), 0);
    return;
  }
  for (size_t i = 0; i < t.children.size(); ++i) {
    bool first = i == 0, lastChild = i + 1 == t.children.size();
    b.setPeers(t.parent, t.children[i]);
    BufRef src = first ? sendBuf(0) : partial(recvBuf(0));
    if (lastChild && t.parent >= 0) {
      b.recvReduceSend(src, 0);
    } else {
      // At the root the last reduction is final: post() applies there.
      b.recvReduceCopy(src, partialIf(!lastChild, recvBuf(0)), 0);
    }
  }
}

// Broadcast the final chunk down the tree.
void broadcastDown(PlanBuilder& b, const Tree& t) {
  if (t.parent >= 0) {
    b.setPeers(-1, t.parent);
    // The data is final already: receivers must not apply post() again.
    b.recv(partial(recvBuf(0)), 0);
  }
  for (int c : t.children) {
    b.setPeers(c, -1);
    b.send(partial(recvBuf(0)), 0);
  }
}

}  // namespace

Plan treeAllReduce(int n, int rank, size_t elt, size_t chunkBytes, int channels) {
  Plan plan;
  plan.coll = Collective::kAllReduce;
  plan.algo = Algorithm::kTree;
  channels = n == 1 ? 1 : std::max(1, channels);
  plan.channels.resize(static_cast<size_t>(channels));
  plan.shares = channels;
  const size_t perIter = chunkBytes == 0 ? 0 : std::max<size_t>(1, chunkBytes / elt);
  for (int ch = 0; ch < channels; ++ch) {
    PlanBuilder b(plan.channels[ch], -1, -1);
    b.beginLoop(n == 1 ? 0 : perIter, 1, false);
    if (n == 1) {
      b.copy(sendBuf(0), recvBuf(0), 0);
      continue;
    }
    Tree t = binaryTree(n, rank, ch % 2 == 1);
    b.setConn(ch);  // the trees share edges: each channel gets its own connections
    reduceUp(b, t);
    // Broadcast trails the reduction by two chunks so both directions stay busy.
    b.setLag(2);
    broadcastDown(b, t);
  }
  return plan;
}

}  // namespace loom
