// Environment for one test: the all-reduce algorithm forced through NCCL_ALGO or LOOM_ALGO
// (read when a communicator is created), and a stall limit that turns a hang into an
// error naming the stuck operation.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "collectives/coll_matrix.h"

namespace colltest {

// Sets (or, with nullptr, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_.c_str(), old_->c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Each algorithm through a different spelling, so the matrix also covers NCCL_ALGO's
// syntax: a plain name, Loom's variable and short name, a per-collective list.
class AlgoEnv {
 public:
  explicit AlgoEnv(Algo a)
      : ncclAlgo_("NCCL_ALGO", a == Algo::kRing       ? "ring"
                               : a == Algo::kTree     ? "Tree"
                               : a == Algo::kDirect   ? "allreduce:direct;broadcast:ring"
                                                      : nullptr),
        loomAlgo_("LOOM_ALGO", a == Algo::kHalvingDoubling ? "hd" : nullptr) {}

 private:
  ScopedEnv ncclAlgo_;
  ScopedEnv loomAlgo_;
  ScopedEnv timeout_{"LOOM_TIMEOUT", "60"};
};

}  // namespace colltest
