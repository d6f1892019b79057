#include "topo/search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "base/error.h"

namespace loom::topo {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kExactLimit = 10;  // 9! orders at most, pruned hard by the bound

bool lessBw(double a, double b) { return a < b * (1 - 1e-9); }
bool sameBw(double a, double b) { return !lessBw(a, b) && !lessBw(b, a); }

// Directed link capacities and how many ring edges use each. A ring's bandwidth is the
// smallest capacity/uses over the links its edges cross.
class Capacity {
 public:
  explicit Capacity(const System& sys) : sys_(sys), n_(static_cast<int>(sys.nodes().size())) {
    cap_.assign(static_cast<size_t>(n_) * n_, 0);
    use_.assign(cap_.size(), 0);
    for (int a = 0; a < n_; ++a)
      for (const Link& l : sys.node(a).links) cap_[key(a, l.peer)] = std::max(cap_[key(a, l.peer)], l.bw);
  }

  // Adds the edge from GPU index a to b; returns the new bottleneck given the old one.
  double add(int a, int b, double bneck) {
    const Path& p = sys_.gpuToGpu(a, b);
    for (size_t i = 0; i + 1 < p.hops.size(); ++i) {
      size_t k = key(p.hops[i], p.hops[i + 1]);
      ++use_[k];
      bneck = std::min(bneck, cap_[k] / use_[k]);
    }
    return bneck;
  }
  void remove(int a, int b) {
    const Path& p = sys_.gpuToGpu(a, b);
    for (size_t i = 0; i + 1 < p.hops.size(); ++i) --use_[key(p.hops[i], p.hops[i + 1])];
  }
  // Takes a ring's bandwidth off every link it uses (for the next ring's search).
  void consume(const std::vector<int>& order, double bw) {
    for (size_t i = 0; i < order.size(); ++i) add(order[i], order[(i + 1) % order.size()], kInf);
    for (size_t k = 0; k < cap_.size(); ++k) {
      cap_[k] = std::max(0.0, cap_[k] - bw * use_[k]);
      use_[k] = 0;
    }
  }
  double evaluate(const std::vector<int>& order, int* hops) {
    double bneck = kInf;
    *hops = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      int a = order[i], b = order[(i + 1) % order.size()];
      bneck = add(a, b, bneck);
      *hops += static_cast<int>(sys_.gpuToGpu(a, b).hops.size()) - 1;
    }
    for (size_t i = 0; i < order.size(); ++i) remove(order[i], order[(i + 1) % order.size()]);
    return bneck;
  }
  int hopsOf(int a, int b) const { return static_cast<int>(sys_.gpuToGpu(a, b).hops.size()) - 1; }

 private:
  size_t key(int a, int b) const { return static_cast<size_t>(a) * n_ + b; }
  const System& sys_;
  int n_;
  std::vector<double> cap_;
  std::vector<int> use_;
};

struct Best {
  std::vector<int> order;
  double bw = -1;
  int hops = std::numeric_limits<int>::max();
  bool better(double bw2, int hops2) const { return lessBw(bw, bw2) || (sameBw(bw, bw2) && hops2 < hops); }
};

class ExactSearch {
 public:
  ExactSearch(Capacity& cap, const std::vector<int>& gpus) : cap_(cap), gpus_(gpus) {}

  Best run() {
    std::vector<int> order{gpus_[0]};
    std::vector<bool> used(gpus_.size(), false);
    used[0] = true;
    dfs(order, used, kInf, 0);
    return best_;
  }

 private:
  void dfs(std::vector<int>& order, std::vector<bool>& used, double bneck, int hops) {
    // Both the bottleneck and the hop count only get worse as edges are added.
    if (lessBw(bneck, best_.bw)) return;
    if (sameBw(bneck, best_.bw) && hops >= best_.hops) return;
    if (order.size() == gpus_.size()) {
      int last = order.back(), first = order.front();
      double b = gpus_.size() > 1 ? cap_.add(last, first, bneck) : bneck;
      int h = hops + (gpus_.size() > 1 ? cap_.hopsOf(last, first) : 0);
      if (best_.better(b, h)) best_ = {order, b, h};
      if (gpus_.size() > 1) cap_.remove(last, first);
      return;
    }
    for (size_t i = 1; i < gpus_.size(); ++i) {
      if (used[i]) continue;
      int a = order.back(), b = gpus_[i];
      double nb = cap_.add(a, b, bneck);
      used[i] = true;
      order.push_back(b);
      dfs(order, used, nb, hops + cap_.hopsOf(a, b));
      order.pop_back();
      used[i] = false;
      cap_.remove(a, b);
    }
  }

  Capacity& cap_;
  const std::vector<int>& gpus_;
  Best best_;
};

Best heuristicSearch(const System& sys, Capacity& cap, const std::vector<int>& gpus) {
  auto score = [&](const std::vector<int>& o) {
    Best b;
    b.order = o;
    b.bw = cap.evaluate(o, &b.hops);
    return b;
  };
  // Greedy: always continue to the widest, then nearest, unvisited GPU.
  std::vector<int> greedy{gpus[0]};
  std::vector<bool> used(gpus.size(), false);
  used[0] = true;
  while (greedy.size() < gpus.size()) {
    int bestI = -1;
    for (size_t i = 0; i < gpus.size(); ++i) {
      if (used[i]) continue;
      if (bestI < 0) {
        bestI = static_cast<int>(i);
        continue;
      }
      const Path& p = sys.gpuToGpu(greedy.back(), gpus[i]);
      const Path& q = sys.gpuToGpu(greedy.back(), gpus[static_cast<size_t>(bestI)]);
      if (lessBw(q.bw, p.bw) || (sameBw(p.bw, q.bw) && p.hops.size() < q.hops.size())) bestI = static_cast<int>(i);
    }
    used[static_cast<size_t>(bestI)] = true;
    greedy.push_back(gpus[static_cast<size_t>(bestI)]);
  }
  Best best = score(gpus);
  Best g = score(greedy);
  if (best.better(g.bw, g.hops)) best = g;
  // 2-opt: reverse segments while that helps; bounded passes keep this predictable.
  for (int pass = 0; pass < 64; ++pass) {
    bool improved = false;
    for (size_t i = 1; i + 1 < best.order.size(); ++i) {
      for (size_t j = i + 1; j < best.order.size(); ++j) {
        std::vector<int> o = best.order;
        std::reverse(o.begin() + static_cast<long>(i), o.begin() + static_cast<long>(j) + 1);
        Best c = score(o);
        if (best.better(c.bw, c.hops)) {
          best = c;
          improved = true;
        }
      }
    }
    if (!improved) break;
  }
  return best;
}

PathType worstPath(const System& sys, const std::vector<int>& order) {
  PathType w = PathType::kLoc;
  for (size_t i = 0; order.size() > 1 && i < order.size(); ++i)
    w = std::max(w, sys.gpuToGpu(order[i], order[(i + 1) % order.size()]).type);
  return w;
}

}  // namespace

double RingSet::totalBw() const {
  double t = 0;
  for (const Ring& r : rings) t += r.bw;
  return t;
}

double ringBandwidth(const System& sys, const std::vector<int>& order) {
  if (order.size() < 2) return kLocalBw;
  Capacity cap(sys);
  int hops = 0;
  return cap.evaluate(order, &hops);
}

RingSet searchRings(const System& sys, std::vector<int> gpus, int maxRings) {
  RingSet out;
  if (gpus.empty()) {
    gpus.resize(static_cast<size_t>(sys.gpuCount()));
    std::iota(gpus.begin(), gpus.end(), 0);
  }
  if (gpus.empty()) return out;
  for (int g : gpus)
    LOOM_CHECK_ARG(g >= 0 && g < sys.gpuCount(), "ring search: GPU index %d out of range (%d GPUs)", g,
                   sys.gpuCount());
  if (gpus.size() == 1) {
    out.rings.push_back({gpus, kLocalBw, PathType::kLoc});
    return out;
  }
  for (size_t i = 0; i < gpus.size(); ++i)
    for (size_t j = 0; j < gpus.size(); ++j)
      if (i != j && sys.gpuToGpu(gpus[i], gpus[j]).type == PathType::kDis)
        LOOM_THROW(kInvalidArgument, "ring search: GPU %d cannot reach GPU %d in this topology", gpus[i],
                   gpus[j]);
  Capacity cap(sys);
  double first = 0;
  for (int r = 0; r < maxRings; ++r) {
    Best b = gpus.size() <= static_cast<size_t>(kExactLimit) ? ExactSearch(cap, gpus).run()
                                                             : heuristicSearch(sys, cap, gpus);
    // Later rings only count while they add a meaningful share of the first.
    if (b.bw <= 0 || (r > 0 && b.bw < 0.1 * first)) break;
    if (r == 0) first = b.bw;
    out.rings.push_back({b.order, b.bw, worstPath(sys, b.order)});
    cap.consume(b.order, b.bw);
  }
  return out;
}

DoubleTree doubleBinaryTree(int n) {
  LOOM_CHECK_ARG(n >= 1, "double binary tree needs at least one rank, got %d", n);
  // In-order binary tree over 1..n: node v with lowest set bit L sits under
  // (v & ~L) | (L << 1); ancestors beyond n are skipped (only their left branch exists).
  auto parentOf = [n](int v) {
    int root = 1;
    while (root * 2 <= n) root *= 2;
    if (v == root) return 0;
    int p = v;
    do {
      int low = p & -p;
      p = (p & ~low) | (low << 1);
    } while (p > n);
    return p;
  };
  DoubleTree dt;
  for (int t = 0; t < 2; ++t) {
    Tree& tree = dt.tree[t];
    tree.parent.assign(static_cast<size_t>(n), -1);
    tree.children.assign(static_cast<size_t>(n), {});
    // Tree 1 relabels tree 0: mirrored when n is even, shifted by one when n is odd. Inner
    // nodes of tree 0 are the odd ranks; both relabelings map them onto even ranks.
    auto toRank = [&](int pos) { return t == 0 ? pos : (n % 2 == 0 ? n - 1 - pos : (pos + 1) % n); };
    for (int pos = 0; pos < n; ++pos) {
      int p = parentOf(pos + 1);
      int r = toRank(pos);
      if (p == 0) {
        tree.root = r;
      } else {
        int pr = toRank(p - 1);
        tree.parent[static_cast<size_t>(r)] = pr;
        tree.children[static_cast<size_t>(pr)].push_back(r);
      }
    }
  }
  return dt;
}

std::vector<RailRing> railRings(const System& sys, const Ring& ring) {
  std::vector<RailRing> out;
  std::vector<bool> seen(static_cast<size_t>(sys.netCount()), false);
  for (size_t i = 0; i < ring.gpus.size(); ++i) {
    int net = sys.railOf(ring.gpus[i]);
    if (net < 0 || seen[static_cast<size_t>(net)]) continue;
    seen[static_cast<size_t>(net)] = true;
    RailRing rr;
    rr.net = net;
    for (size_t k = 0; k < ring.gpus.size(); ++k) rr.gpus.push_back(ring.gpus[(i + k) % ring.gpus.size()]);
    out.push_back(std::move(rr));
  }
  std::sort(out.begin(), out.end(), [](const RailRing& a, const RailRing& b) { return a.net < b.net; });
  return out;
}

}  // namespace loom::topo
