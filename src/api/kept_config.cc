#include "api/kept_config.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "base/error.h"

namespace loom::api {
namespace {

constexpr unsigned kConfigMagic = 0xcafebeef;
// NCCL 2.30's config is 96 bytes; room for a few more versions, and no further read of a
// caller's struct whose size is wild.
constexpr size_t kMaxConfigBytes = 256;

}  // namespace

KeptConfig::KeptConfig(const ncclConfig_t* config, const char* fn) {
  if (!config) return;
  if (config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
    LOOM_THROW(kInvalidArgument, "%s: config->size=%zu is not a valid ncclConfig_t size", fn,
               config->size);
  if (config->magic != kConfigMagic)
    LOOM_THROW(kInvalidArgument,
               "%s: config was not initialized with NCCL_CONFIG_INITIALIZER (magic %#x)", fn,
               config->magic);
  const size_t n = std::min(config->size, kMaxConfigBytes);
  const ncclConfig_t defaults = NCCL_CONFIG_INITIALIZER;
  bytes_.assign(std::max(n, sizeof(ncclConfig_t)), 0);
  memcpy(bytes_.data(), &defaults, sizeof(defaults));
  memcpy(bytes_.data(), config, n);
  ncclConfig_t* c = get();
  c->size = n;
  const auto seen = [&](size_t offset) { return n >= offset + sizeof(char*); };
  if (seen(offsetof(ncclConfig_t, commName)) && c->commName) {
    commName_ = c->commName;
    hasCommName_ = true;
  }
  if (seen(offsetof(ncclConfig_t, netName)) && c->netName) {
    netName_ = c->netName;
    hasNetName_ = true;
  }
  repoint();
  const ncclConfig_t f = fields();
  if (f.blocking != NCCL_CONFIG_UNDEF_INT && f.blocking != 0 && f.blocking != 1)
    LOOM_THROW(kInvalidArgument, "%s: config->blocking=%d (expected 0 or 1)", fn, f.blocking);
  // minCTAs / maxCTAs (NCCL 2.17+ headers), checked as NCCL checks them.
  if (f.version >= NCCL_VERSION(2, 17, 0)) {
    const bool minSet = f.minCTAs != NCCL_CONFIG_UNDEF_INT, maxSet = f.maxCTAs != NCCL_CONFIG_UNDEF_INT;
    LOOM_CHECK_ARG(!minSet || f.minCTAs > 0, "%s: config->minCTAs=%d must be positive", fn, f.minCTAs);
    LOOM_CHECK_ARG(!maxSet || f.maxCTAs > 0, "%s: config->maxCTAs=%d must be positive", fn, f.maxCTAs);
    LOOM_CHECK_ARG(!minSet || !maxSet || f.minCTAs <= f.maxCTAs,
                   "%s: config->minCTAs=%d is larger than config->maxCTAs=%d", fn, f.minCTAs, f.maxCTAs);
  }
}

int KeptConfig::minCtas() const {
  const ncclConfig_t f = fields();
  return f.version >= NCCL_VERSION(2, 17, 0) && f.minCTAs != NCCL_CONFIG_UNDEF_INT ? f.minCTAs : 0;
}

int KeptConfig::maxCtas() const {
  const ncclConfig_t f = fields();
  return f.version >= NCCL_VERSION(2, 17, 0) && f.maxCTAs != NCCL_CONFIG_UNDEF_INT ? f.maxCTAs : 0;
}

KeptConfig& KeptConfig::operator=(const KeptConfig& other) {
  bytes_ = other.bytes_;
  commName_ = other.commName_;
  netName_ = other.netName_;
  hasCommName_ = other.hasCommName_;
  hasNetName_ = other.hasNetName_;
  repoint();
  return *this;
}

void KeptConfig::repoint() {
  ncclConfig_t* c = get();
  if (!c) return;
  c->commName = hasCommName_ ? commName_.c_str() : nullptr;
  c->netName = hasNetName_ ? netName_.c_str() : nullptr;
}

ncclConfig_t KeptConfig::fields() const {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  if (const ncclConfig_t* k = get()) {
    memcpy(&c, k, std::min(k->size, sizeof(ncclConfig_t)));
    if (c.version < NCCL_VERSION(2, 14, 0)) c.blocking = NCCL_CONFIG_UNDEF_INT;  // as NCCL
  }
  return c;
}

}  // namespace loom::api
