// Where a tuner outside the cost model (an NCCL tuner plugin, later) adjusts the choice:
// when a communicator ranks its candidates, it hands the hook the model's cost table for
// each collective and size class, and the hook may rewrite predicted times (to favour,
// demote or rule out an algorithm/protocol) and set the channel count, as NCCL's
// getCollInfo() does with its collCostTable and nChannels. Then, for each candidate the
// table leaves feasible, it may set the chunk a step of a channel carries, as NCCL's
// getChunkSize() (tuner v6) does for the algorithm and protocol NCCL chose.
//
// The hook runs once per collective and size class at communicator creation, never per
// call. Every rank must get the same answers from it: ranks that rank differently run
// different plans and hang.
#pragma once

#include <array>
#include <cstddef>

#include "algo/collective.h"

namespace loom::algo {

struct CostTable {
  Collective coll = Collective::kAllReduce;
  size_t bytes = 0;  // nccl-tests' "size" of the size class (see cost_model.h)
  int nranks = 1;
  int nnodes = 1;
  // Predicted microseconds per algorithm and protocol; < 0: cannot run (the model rules it
  // out, or the executor has no such protocol). Setting a feasible entry < 0 rules it out.
  std::array<std::array<double, kProtoCount>, kAlgoCount> us;
  // > 0: run this many channels instead of the model's (clamped to what a plan can use).
  int channels = 0;

  double& at(Algorithm a, Protocol p) { return us[static_cast<size_t>(a)][static_cast<size_t>(p)]; }
  double at(Algorithm a, Protocol p) const { return us[static_cast<size_t>(a)][static_cast<size_t>(p)]; }
};

// One candidate of a size class, as a plan of that size would be cut for it.
struct ChunkQuery {
  Collective coll = Collective::kAllReduce;
  size_t bytes = 0;  // as CostTable::bytes
  Algorithm algo = Algorithm::kRing;
  Protocol proto = Protocol::kSimple;
  int channels = 1;       // what the plan runs (the hook's count where adjust() set one)
  size_t chunkBytes = 0;  // the model's chunk for it at `bytes`
};

class TunerHook {
 public:
  virtual ~TunerHook() = default;
  virtual void adjust(CostTable& table) = 0;
  // After adjust(): the chunk the hook wants for this candidate, in bytes; 0 or
  // q.chunkBytes leave the model's (select.h says how the answer is clamped and applied).
  virtual size_t chunkBytes(const ChunkQuery& /*q*/) { return 0; }
};

}  // namespace loom::algo
