// Graph search: the orders in which ranks pass data. Rings follow the fastest links and
// account for shared links (two ring edges crossing one PCIe uplink halve it), so on NVLink
// they ride NVLink, and on PCIe they keep GPUs behind one switch adjacent and cross the
// socket boundary only twice. Across hosts, rings are rail-aligned (a channel enters and
// leaves every host through the same NIC index) and trees are double binary trees.
#pragma once

#include <vector>

#include "topo/system.h"

namespace loom::topo {

struct Ring {
  std::vector<int> gpus;   // GPU indices in ring order (cyclic)
  double bw = 0;           // GB/s this ring sustains with the links it shares
  PathType worst = PathType::kLoc;  // worst path between consecutive GPUs
};

struct RingSet {
  std::vector<Ring> rings;  // rings found, each on the capacity the previous ones left
  double totalBw() const;
};

// Rings over the given GPU indices (all GPUs when empty). Exact search up to 10 GPUs,
// greedy + 2-opt beyond. `maxRings` bounds how many distinct rings are returned.
RingSet searchRings(const System& sys, std::vector<int> gpus = {}, int maxRings = 4);

// How much a ring order would sustain, given the links its edges share (for tests and
// for comparing orders).
double ringBandwidth(const System& sys, const std::vector<int>& order);

// A binary tree over ranks 0..n-1: parent (-1 at the root) and up to two children.
struct Tree {
  int root = -1;
  std::vector<int> parent;
  std::vector<std::vector<int>> children;
};

// Double binary tree (as in NCCL and Sanders et al.): tree 0 is an in-order binary tree;
// tree 1 is its mirror (even n) or its shift by one (odd n), so that every rank is an
// inner node in at most one of the two trees and the two halves of the data each use
// a different set of uplinks.
struct DoubleTree {
  Tree tree[2];
};
DoubleTree doubleBinaryTree(int n);

// One intra-host order per rail: the ring rotated to start at a GPU whose rail is `net`,
// so a channel on that rail enters the host at that GPU and leaves through the same NIC
// index (rail-aligned across hosts).
struct RailRing {
  int net = -1;           // network port index
  std::vector<int> gpus;  // intra-host order for channels on this rail
};
std::vector<RailRing> railRings(const System& sys, const Ring& ring);

}  // namespace loom::topo
