// Where a tuner outside the cost model (an NCCL tuner plugin, later) adjusts the choice:
// when a communicator ranks its candidates, it hands the hook the model's cost table for
// each collective and size class, and the hook may rewrite predicted times (to favour,
// demote or rule out an algorithm/protocol) and set the channel count, as NCCL's
// getCollInfo() does with its collCostTable and nChannels.
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

class TunerHook {
 public:
  virtual ~TunerHook() = default;
  virtual void adjust(CostTable& table) = 0;
};

}  // namespace loom::algo
