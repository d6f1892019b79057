// Path computation and rails. A path is the widest route (highest bottleneck bandwidth),
// and among equally wide routes the one with the fewest hops. Routing follows what the
// hardware can forward: PCI switches, CPUs and NVSwitches forward anything; a GPU forwards
// only NVLink to NVLink (the NVB case); a NIC only between its PCI side and its own ports;
// a network port never forwards.
#include <tuple>
#include <algorithm>
#include <limits>

#include "base/error.h"
#include "topo/system.h"

namespace loom::topo {
namespace {

// Dynamic-programming state: a node, and whether we arrived over NVLink (which decides
// whether a GPU may forward).
struct State {
  double bw = -1;  // bottleneck so far; -1 = unreachable
  int prev = -1;   // previous state index (node * 2 + viaNvl) at hop count h-1
};

bool canForward(const Node& n, bool arrivedNvl, LinkType out) {
  switch (n.type) {
    case NodeType::kCpu:
    case NodeType::kPci:
    case NodeType::kNvSwitch:
    case NodeType::kNic:
      return true;
    case NodeType::kGpu:
      return arrivedNvl && out == LinkType::kNvl;
    case NodeType::kNet:
      return false;
  }
  return false;
}

PathType hopType(const System& sys, int from, int to, const Link& link, bool transit) {
  const Node& a = sys.node(from);
  const Node& b = sys.node(to);
  switch (link.type) {
    case LinkType::kLoc:
    case LinkType::kNet:
      return PathType::kLoc;
    case LinkType::kNvl:
      return (transit && a.type == NodeType::kGpu) ? PathType::kNvb : PathType::kNvl;
    case LinkType::kSys:
      return PathType::kSys;
    case LinkType::kPci:
      if (a.type == NodeType::kCpu || b.type == NodeType::kCpu) return PathType::kPhb;
      if (a.type == NodeType::kPci && b.type == NodeType::kPci) return PathType::kPxb;
      return PathType::kPix;
  }
  return PathType::kDis;
}

const Link* findLink(const Node& n, int peer) {
  const Link* best = nullptr;
  for (const Link& l : n.links)
    if (l.peer == peer && (!best || l.bw > best->bw)) best = &l;
  return best;
}

}  // namespace

void System::computePathsFrom(int src) {
  const int n = static_cast<int>(nodes_.size());
  pathIndex_[static_cast<size_t>(src)] = static_cast<int>(paths_.size());
  paths_.emplace_back(static_cast<size_t>(n));
  std::vector<Path>& row = paths_.back();

  // layers[h][s]: best bottleneck reaching state s in exactly h hops. Widest-path with a
  // hop-count tie-break is not isotone, so Dijkstra could pick a wider-but-longer prefix
  // and lose; exact hop layers are cheap at host scale (tens of nodes). Once a layer
  // improves no state's best bottleneck, no later layer can (each extends the previous).
  std::vector<std::vector<State>> layers(1, std::vector<State>(static_cast<size_t>(2 * n)));
  layers[0][static_cast<size_t>(2 * src)].bw = std::numeric_limits<double>::infinity();
  std::vector<double> bestEver(static_cast<size_t>(2 * n), -1);
  bestEver[static_cast<size_t>(2 * src)] = std::numeric_limits<double>::infinity();
  for (int h = 1; h < n; ++h) {
    std::vector<State> next(static_cast<size_t>(2 * n));
    bool improved = false;
    const std::vector<State>& cur = layers.back();
    for (int s = 0; s < 2 * n; ++s) {
      if (cur[static_cast<size_t>(s)].bw < 0) continue;
      int u = s / 2;
      bool viaNvl = s % 2;
      const Node& un = nodes_[static_cast<size_t>(u)];
      for (const Link& l : un.links) {
        if (u != src && !canForward(un, viaNvl, l.type)) continue;
        if (l.peer == src) continue;
        double bw = std::min(cur[static_cast<size_t>(s)].bw, l.bw);
        size_t t = static_cast<size_t>(2 * l.peer + (l.type == LinkType::kNvl ? 1 : 0));
        if (bw > next[t].bw) next[t] = {bw, s};
      }
    }
    for (size_t t = 0; t < next.size(); ++t) {
      if (next[t].bw >= 0 && next[t].bw > bestEver[t] * (1 + 1e-9) + 1e-12) {
        bestEver[t] = next[t].bw;
        improved = true;
      }
    }
    if (!improved) break;
    layers.push_back(std::move(next));
  }

  for (int dst = 0; dst < n; ++dst) {
    Path& p = row[static_cast<size_t>(dst)];
    if (dst == src) {
      p = {PathType::kLoc, kLocalBw, {src}, 0};
      continue;
    }
    // Widest first, then fewest hops.
    int bestH = -1, bestS = -1;
    double bestBw = -1;
    for (int h = 1; h < static_cast<int>(layers.size()); ++h) {
      for (int v = 0; v < 2; ++v) {
        double bw = layers[static_cast<size_t>(h)][static_cast<size_t>(2 * dst + v)].bw;
        if (bw >= 0 && bw > bestBw * (1 + 1e-9) + 1e-12) {
          bestBw = bw;
          bestH = h;
          bestS = 2 * dst + v;
        }
      }
    }
    if (bestH < 0) continue;  // stays kDis
    std::vector<int> hops(static_cast<size_t>(bestH + 1));
    for (int h = bestH, s = bestS; h >= 0; --h) {
      hops[static_cast<size_t>(h)] = s / 2;
      s = layers[static_cast<size_t>(h)][static_cast<size_t>(s)].prev;
    }
    PathType type = PathType::kLoc;
    int nvl = std::numeric_limits<int>::max();
    for (size_t i = 0; i + 1 < hops.size(); ++i) {
      const Link* l = findLink(nodes_[static_cast<size_t>(hops[i])], hops[i + 1]);
      LOOM_ASSERT(l != nullptr);
      type = std::max(type, hopType(*this, hops[i], hops[i + 1], *l, i > 0));
      if (l->type == LinkType::kNvl) nvl = std::min(nvl, l->nvlinks);
    }
    p.type = type;
    p.bw = bestBw;
    p.hops = std::move(hops);
    p.nvlinks = (type == PathType::kNvl || type == PathType::kNvb) && nvl != std::numeric_limits<int>::max()
                    ? nvl
                    : 0;
  }
}

void System::computeRails() {
  rails_.assign(gpus_.size(), -1);
  if (nets_.empty()) return;
  std::vector<int> load(nets_.size(), 0);
  for (size_t g = 0; g < gpus_.size(); ++g) {
    int best = -1;
    for (size_t n = 0; n < nets_.size(); ++n) {
      const Path& p = path(gpus_[g], nets_[n]);
      if (p.type == PathType::kDis) continue;
      if (best < 0) {
        best = static_cast<int>(n);
        continue;
      }
      const Path& b = path(gpus_[g], nets_[static_cast<size_t>(best)]);
      // Widest, then closest, then the least used so far (spreads GPUs that see two
      // equally close NICs over both), then the lowest index.
      auto key = [&](const Path& x, size_t idx) {
        return std::make_tuple(-x.bw, static_cast<int>(x.type), load[idx], x.hops.size(), idx);
      };
      if (key(p, n) < key(b, static_cast<size_t>(best))) best = static_cast<int>(n);
    }
    rails_[g] = best;
    if (best >= 0) ++load[static_cast<size_t>(best)];
  }
}

}  // namespace loom::topo
