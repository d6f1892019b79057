// A plan written into one relocatable block (kernels/interp.h's FlatPlan), as the plan
// interpreter reads it: on host threads from this memory, on a GPU from a copy of it.
#pragma once

#include <cstdint>
#include <vector>

#include "algo/plan.h"
#include "kernels/interp.h"

namespace loom {

class FlatPlanBlock {
 public:
  explicit FlatPlanBlock(const Plan& plan);
  const FlatPlan& plan() const { return *reinterpret_cast<const FlatPlan*>(words_.data()); }
  const void* data() const { return words_.data(); }
  size_t bytes() const { return plan().bytes; }

 private:
  std::vector<uint64_t> words_;  // 8-byte aligned, as Step and FlatLoop need
};

}  // namespace loom
