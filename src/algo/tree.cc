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

// Reduce chunk [off, off+bytes) up the tree: the partial sum lands in recv, then goes to
// the parent (or, at the root, becomes final).
void reduceUp(PlanBuilder& b, const Tree& t, size_t off, size_t bytes) {
  if (t.children.empty()) {
    b.setPeers(t.parent, -1);
    b.send(sendBuf(off), bytes);
    return;
  }
  for (size_t i = 0; i < t.children.size(); ++i) {
    bool first = i == 0, lastChild = i + 1 == t.children.size();
    b.setPeers(t.parent, t.children[i]);
    BufRef src = first ? sendBuf(off) : partial(recvBuf(off));
    if (lastChild && t.parent >= 0) {
      b.recvReduceSend(src, bytes);
    } else {
      // At the root the last reduction is final: post() applies there.
      b.recvReduceCopy(src, partialIf(!lastChild, recvBuf(off)), bytes);
    }
  }
}

// Broadcast the final chunk down the tree.
void broadcastDown(PlanBuilder& b, const Tree& t, size_t off, size_t bytes) {
  if (t.parent >= 0) {
    b.setPeers(-1, t.parent);
    // The data is final already: receivers must not apply post() again.
    b.recv(partial(recvBuf(off)), bytes);
  }
  for (int c : t.children) {
    b.setPeers(c, -1);
    b.send(partial(recvBuf(off)), bytes);
  }
}

}  // namespace

Plan treeAllReduce(int n, int rank, size_t count, size_t elt, size_t chunkBytes, int channels) {
  Plan plan;
  plan.coll = Collective::kAllReduce;
  plan.algo = Algorithm::kTree;
  if (n == 1) {
    plan.channels.resize(1);
    PlanBuilder(plan.channels[0], -1, -1).copy(sendBuf(0), recvBuf(0), count * elt);
    return plan;
  }
  channels = std::max(1, channels);
  plan.channels.resize(static_cast<size_t>(channels));
  size_t chunkElems = std::max<size_t>(1, chunkBytes / elt);
  for (int ch = 0; ch < channels; ++ch) {
    Tree t = binaryTree(n, rank, ch % 2 == 1);
    const Share share = channelShare(count, channels, ch);
    PlanBuilder b(plan.channels[ch], -1, -1);
    b.setConn(ch);  // the trees share edges: each channel gets its own connections
    std::vector<std::pair<size_t, size_t>> chunks;
    for (size_t e = share.begin; e < share.end; e += chunkElems)
      chunks.push_back({e * elt, (std::min(share.end, e + chunkElems) - e) * elt});
    if (chunks.empty()) continue;
    // Broadcast trails the reduction by a few chunks so both directions stay busy.
    const size_t lag = 2;
    for (size_t c = 0; c < chunks.size() + lag; ++c) {
      if (c < chunks.size()) reduceUp(b, t, chunks[c].first, chunks[c].second);
      if (c >= lag) broadcastDown(b, t, chunks[c - lag].first, chunks[c - lag].second);
    }
  }
  return plan;
}

}  // namespace loom
