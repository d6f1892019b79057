// Plans are pure functions of the request (collective, count, element size, root) and the
// communicator's fixed context (ranks, hosts, rings, FIFO shape, NCCL_ALGO), so each
// communicator builds a plan once and reuses it for every later call of the same shape:
// a training loop's repeated all-reduces pay for selection and planning once.
//
// Size-free plans (the ring's, see Loop in plan.h) depend on the count only through the
// selection, so they are also kept per size class: (collective, element size, root, and
// the selection: algorithm, protocol, channels, chunk). A new count that selects the same
// reuses the class's plan; only explicit plans are built per count.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "algo/plan.h"
#include "algo/select.h"

namespace loom {

struct CachedPlan {
  Plan plan;
  // The ranks the plan exchanges data with, ascending (for the flight recorder).
  std::vector<int> peerRanks;
  // Set once the connections the plan uses exist; they live as long as the communicator.
  std::atomic<bool> connected{false};
};

// The ranks `plan` sends to or receives from, ascending.
std::vector<int> peerRanks(const Plan& plan);

class PlanCache {
 public:
  // Entries kept at most per map; beyond this the map starts over (a bounded memory cost
  // even for a job that calls every size once).
  static constexpr size_t kCapacity = 256;

  // The plan for `req` on this context, selected and built on first use.
  std::shared_ptr<CachedPlan> get(const CollRequest& req, const PlanContext& ctx);

  size_t hits() const { return hits_; }            // calls that found their exact request
  size_t classHits() const { return classHits_; }  // new counts served by a size class's plan
  size_t misses() const { return misses_; }        // plans built
  size_t size() const;                             // plans held

 private:
  struct Key {
    Collective coll;
    size_t count;
    size_t eltSize;
    int root;
    bool operator==(const Key& o) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct ClassKey {
    Collective coll;
    size_t eltSize;
    int root;
    Selection sel;
    bool operator==(const ClassKey& o) const = default;
  };
  struct ClassKeyHash {
    size_t operator()(const ClassKey& k) const;
  };
  mutable std::mutex mu_;
  std::unordered_map<Key, std::shared_ptr<CachedPlan>, KeyHash> plans_;
  std::unordered_map<ClassKey, std::shared_ptr<CachedPlan>, ClassKeyHash> classes_;
  // The last request found: a loop calling one shape again skips the hash lookup.
  Key lastKey_{};
  std::shared_ptr<CachedPlan> last_;
  size_t hits_ = 0;
  size_t classHits_ = 0;
  size_t misses_ = 0;
};

}  // namespace loom
