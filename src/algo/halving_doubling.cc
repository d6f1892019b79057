#include "algo/halving_doubling.h"

#include <algorithm>

namespace loom {
namespace {

struct Range {
  size_t begin, end;  // elements
  size_t size() const { return end - begin; }
};

// Sends `give` and receives `take` in interleaved chunks (both sides use the same chunk
// count, so chunk i of one side's `give` is chunk i of the other's `take`).
template <typename SendFn, typename RecvFn>
void exchange(Range give, Range take, size_t elt, size_t chunkBytes, SendFn send, RecvFn recv) {
  size_t chunkElems = std::max<size_t>(1, chunkBytes / elt);
  size_t most = std::max(give.size(), take.size());
  size_t k = std::max<size_t>(1, (most + chunkElems - 1) / chunkElems);
  for (size_t i = 0; i < k; ++i) {
    size_t gb = give.begin + give.size() * i / k, ge = give.begin + give.size() * (i + 1) / k;
    size_t tb = take.begin + take.size() * i / k, te = take.begin + take.size() * (i + 1) / k;
    send(gb * elt, (ge - gb) * elt);
    recv(tb * elt, (te - tb) * elt);
  }
}

}  // namespace

Plan halvingDoublingAllReduce(int n, int rank, size_t count, size_t elt, size_t chunkBytes) {
  Plan plan;
  plan.coll = Collective::kAllReduce;
  plan.algo = Algorithm::kHalvingDoubling;
  plan.channels.resize(1);
  PlanBuilder b(plan.channels[0], -1, -1);
  const size_t bytes = count * elt;
  if (n == 1) {
    b.copy(sendBuf(0), recvBuf(0), bytes);
    return plan;
  }
  int p = 1;
  while (p * 2 <= n) p *= 2;
  int rem = n - p;
  // Fix-up: of ranks 2i and 2i+1 (i < rem), the even one hands its data to the odd one.
  int v;  // rank in the power-of-two core, -1 if sitting out
  bool reduced = false;  // whether recv already holds this rank's (scaled) contribution
  if (rank < 2 * rem) {
    if (rank % 2 == 0) {
      b.setPeers(rank + 1, -1);
      b.send(sendBuf(0), bytes);
      b.setPeers(-1, rank + 1);
      b.recv(recvBuf(0), bytes);  // the final result: post() applies here
      return plan;
    }
    b.setPeers(-1, rank - 1);
    b.recvReduceCopy(sendBuf(0), partial(recvBuf(0)), bytes);
    reduced = true;
    v = rank / 2;
  } else {
    v = rank - rem;
  }
  auto realRank = [&](int vr) { return vr < rem ? 2 * vr + 1 : vr + rem; };

  // Reduce-scatter by recursive halving: keep one half, send the other.
  Range mine{0, count};
  std::vector<std::pair<int, Range>> history;
  for (int mask = p / 2; mask >= 1; mask /= 2) {
    int partner = realRank(v ^ mask);
    size_t mid = mine.begin + mine.size() / 2;
    Range lower{mine.begin, mid}, upper{mid, mine.end};
    bool keepLower = (v & mask) == 0;
    Range keep = keepLower ? lower : upper, give = keepLower ? upper : lower;
    b.setPeers(partner, partner);
    exchange(give, keep, elt, chunkBytes,
             [&](size_t off, size_t len) {
               b.send(reduced ? partial(recvBuf(off)) : sendBuf(off), len);
             },
             [&](size_t off, size_t len) {
               b.recvReduceCopy(reduced ? partial(recvBuf(off)) : sendBuf(off),
                                partial(recvBuf(off)), len);
             });
    // What we did not keep we never touch again, so recv holds partial sums only for `keep`.
    history.push_back({partner, mine});
    mine = keep;
    reduced = true;
  }
  // All-gather by recursive doubling, undoing the halvings in reverse order.
  for (auto it = history.rbegin(); it != history.rend(); ++it) {
    int partner = it->first;
    Range whole = it->second;
    Range other = mine.begin == whole.begin ? Range{mine.end, whole.end} : Range{whole.begin, mine.begin};
    b.setPeers(partner, partner);
    exchange(mine, other, elt, chunkBytes,
             [&](size_t off, size_t len) { b.send(partial(recvBuf(off)), len); },
             [&](size_t off, size_t len) { b.recv(partial(recvBuf(off)), len); });
    mine = whole;
  }
  // Everything in recv is the complete, not yet post()-ed result.
  if (rank < 2 * rem) {
    b.setPeers(rank - 1, -1);
    b.send(partial(recvBuf(0)), bytes);
  }
  b.finish(recvBuf(0), bytes);
  return plan;
}

}  // namespace loom
