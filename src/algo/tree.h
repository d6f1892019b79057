// Trees: binary trees over the ranks, and the double binary tree all-reduce (each of two
// complementary trees reduces and broadcasts half of the data, so every rank is an inner
// node of at most one tree and links carry traffic in both trees).
#pragma once

#include <vector>

#include "algo/plan.h"

namespace loom {

struct Tree {
  int parent = -1;
  std::vector<int> children;
};

// Heap-shaped binary tree over ranks 0..n-1 (`mirror`: over n-1..0), seen from `rank`.
Tree binaryTree(int nranks, int rank, bool mirror);

// A size-free plan (see Loop in plan.h). chunkBytes: pipelining granularity (a multiple
// of eltSize; 0: the whole share in one). Channel c reduces and broadcasts its share of
// the buffer along the tree (c even) or its mirror (c odd), on connections of its own: two
// channels make the double binary tree.
Plan treeAllReduce(int nranks, int rank, size_t eltSize, size_t chunkBytes, int channels = 2);

}  // namespace loom
