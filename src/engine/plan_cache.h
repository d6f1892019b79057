// Plans are pure functions of the request (collective, bytes, element size, root) and the
// communicator's fixed context (ranks, hosts, rings, FIFO shape, NCCL_ALGO), so each
// communicator builds a plan once and reuses it for every later call of the same shape:
// a training loop's repeated all-reduces pay for selection and planning once.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "algo/plan.h"
#include "algo/select.h"

namespace loom {

struct CachedPlan {
  Plan plan;
  // Set once the connections the plan uses exist; they live as long as the communicator.
  std::atomic<bool> connected{false};
};

class PlanCache {
 public:
  // Plans kept at most; beyond this the cache starts over (a bounded memory cost even for
  // a job that calls every size once).
  static constexpr size_t kCapacity = 256;

  // The plan for `req` on this context, selected and built on first use.
  std::shared_ptr<CachedPlan> get(const CollRequest& req, const PlanContext& ctx);

  size_t hits() const { return hits_; }
  size_t misses() const { return misses_; }
  size_t size() const;

 private:
  struct Key {
    Collective coll;
    size_t count;
    size_t eltSize;
    int root;
    bool operator==(const Key& o) const {
      return coll == o.coll && count == o.count && eltSize == o.eltSize && root == o.root;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  mutable std::mutex mu_;
  std::unordered_map<Key, std::shared_ptr<CachedPlan>, KeyHash> plans_;
  size_t hits_ = 0;
  size_t misses_ = 0;
};

}  // namespace loom
