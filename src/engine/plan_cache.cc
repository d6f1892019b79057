#include "engine/plan_cache.h"

namespace loom {

size_t PlanCache::KeyHash::operator()(const Key& k) const {
  size_t h = std::hash<size_t>()(k.count);
  h = h * 31 + k.eltSize;
  h = h * 31 + static_cast<size_t>(k.coll);
  return h * 31 + static_cast<size_t>(k.root);
}

std::shared_ptr<CachedPlan> PlanCache::get(const CollRequest& req, const PlanContext& ctx) {
  Key key{req.coll, req.count, req.eltSize, req.root};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) {
      ++hits_;
      return it->second;
    }
  }
  // Built outside the lock: selection may log, and building large plans takes a while.
  auto made = std::make_shared<CachedPlan>();
  made->plan = buildPlan(req, ctx, select(req, ctx));
  std::lock_guard<std::mutex> lock(mu_);
  ++misses_;
  if (plans_.size() >= kCapacity) plans_.clear();  // entries in use live on in their launches
  return plans_.emplace(key, std::move(made)).first->second;
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

}  // namespace loom
