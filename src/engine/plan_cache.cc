#include "engine/plan_cache.h"

#include <algorithm>
#include <unordered_set>

namespace loom {

std::vector<int> peerRanks(const Plan& plan) {
  std::vector<std::pair<int, int>> sends, recvs;
  plan.peers(&sends, &recvs);
  std::vector<int> ranks;
  for (const auto* v : {&sends, &recvs})
    for (const auto& k : *v) ranks.push_back(k.first);
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

size_t PlanCache::KeyHash::operator()(const Key& k) const {
  size_t h = std::hash<size_t>()(k.count);
  h = h * 31 + k.eltSize;
  h = h * 31 + static_cast<size_t>(k.coll);
  return h * 31 + static_cast<size_t>(k.root);
}

size_t PlanCache::ClassKeyHash::operator()(const ClassKey& k) const {
  size_t h = std::hash<size_t>()(k.sel.chunkBytes);
  h = h * 31 + k.eltSize;
  h = h * 31 + static_cast<size_t>(k.coll);
  h = h * 31 + static_cast<size_t>(k.root);
  h = h * 31 + static_cast<size_t>(k.sel.algorithm);
  h = h * 31 + static_cast<size_t>(k.sel.protocol);
  return h * 31 + static_cast<size_t>(k.sel.channels);
}

std::shared_ptr<CachedPlan> PlanCache::get(const CollRequest& req, const PlanContext& ctx) {
  const Key key{req.coll, req.count, req.eltSize, req.root};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (last_ && key == lastKey_) {
      ++hits_;
      return last_;
    }
    auto it = plans_.find(key);
    if (it != plans_.end()) {
      ++hits_;
      lastKey_ = key;
      last_ = it->second;
      return it->second;
    }
  }
  const Selection sel = select(req, ctx);
  const ClassKey ckey{req.coll, req.eltSize, req.root, sel};
  std::shared_ptr<CachedPlan> plan;
  bool built = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = classes_.find(ckey);
    if (it != classes_.end()) {
      ++classHits_;
      plan = it->second;
    }
  }
  if (!plan) {
    // Built outside the lock: selection may log, and building large plans takes a while.
    plan = std::make_shared<CachedPlan>();
    plan->plan = buildPlan(req, ctx, sel);
    plan->peerRanks = peerRanks(plan->plan);
    built = true;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (built) {
    ++misses_;
    if (plan->plan.sizeFree()) {
      if (classes_.size() >= kCapacity) classes_.clear();
      plan = classes_.emplace(ckey, plan).first->second;  // another thread's, if it won
    }
  }
  if (plans_.size() >= kCapacity) plans_.clear();  // entries in use live on in their launches
  return plans_.emplace(key, std::move(plan)).first->second;
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::unordered_set<const CachedPlan*> distinct;
  for (const auto& e : plans_) distinct.insert(e.second.get());
  for (const auto& e : classes_) distinct.insert(e.second.get());
  return distinct.size();
}

}  // namespace loom
