#include "transports/registry.h"

#include <algorithm>
#include <mutex>

#include "base/error.h"
#include "base/hash.h"
#include "transports/net/net_transport.h"
#include "transports/shm/shm_transport.h"
#include "transports/socket/socket_transport.h"

namespace loom {
namespace {

// The built-in transports: one line each.
std::vector<TransportSpec> builtins() {
  return {
      {"shm", 100, makeShmTransport},
      {"net", 150, makeNetTransport},  // only when NCCL_NET names a backend
      {"socket", 200, makeSocketTransport},
  };
}

struct Added {
  std::mutex mu;
  std::vector<TransportSpec> specs;
};

Added& added() {
  static Added a;
  return a;
}

}  // namespace

std::vector<TransportSpec> registeredTransports() {
  std::vector<TransportSpec> all = builtins();
  {
    Added& a = added();
    std::lock_guard<std::mutex> lock(a.mu);
    all.insert(all.end(), a.specs.begin(), a.specs.end());
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const TransportSpec& x, const TransportSpec& y) { return x.priority < y.priority; });
  return all;
}

uint64_t transportSetHash(const std::vector<TransportSpec>& specs) {
  // Over "name\0name\0...": only equality matters.
  uint64_t h = kFnvOffset;
  for (const TransportSpec& s : specs) h = fnv1a(s.name, h);
  return h;
}

TransportRegistration::TransportRegistration(TransportSpec spec) : name_(spec.name) {
  LOOM_CHECK_USAGE(!spec.name.empty() && spec.make, "a transport needs a name and a factory");
  Added& a = added();
  std::lock_guard<std::mutex> lock(a.mu);
  std::vector<TransportSpec> now = builtins();
  now.insert(now.end(), a.specs.begin(), a.specs.end());
  for (const TransportSpec& s : now)
    LOOM_CHECK_USAGE(s.name != spec.name, "transport '%s' is already registered",
                     spec.name.c_str());
  LOOM_CHECK_USAGE(now.size() < static_cast<size_t>(kMaxTransports),
                   "cannot register transport '%s': %zu are registered and a peer info has "
                   "sections for %d",
                   spec.name.c_str(), now.size(), kMaxTransports);
  a.specs.push_back(std::move(spec));
}

TransportRegistration::~TransportRegistration() {
  Added& a = added();
  std::lock_guard<std::mutex> lock(a.mu);
  std::erase_if(a.specs, [&](const TransportSpec& s) { return s.name == name_; });
}

}  // namespace loom
