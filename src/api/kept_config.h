// A caller's ncclConfig_t kept beyond its call (a communicator's, or a split's recorded in a
// group): every byte the caller's struct has, up to 256 (a newer NCCL's fields too, for a
// stock NCCL that reads them), at least NCCL 2.28.9's (their defaults where an older header
// has none), with its two strings copied and pointed at.
#pragma once

#include <nccl.h>

#include <string>
#include <vector>

namespace loom::api {

class KeptConfig {
 public:
  KeptConfig() = default;
  // Checks the header as NCCL does (a size that holds `blocking`, NCCL_CONFIG_INITIALIZER's
  // magic) before reading anything else, then keeps the bytes, and checks `blocking` (0, 1
  // or unset) and `minCTAs` / `maxCTAs` (positive where set, the minimum not over the
  // maximum); throws kInvalidArgument naming `fn`. A null config keeps nothing.
  KeptConfig(const ncclConfig_t* config, const char* fn);
  KeptConfig(const KeptConfig& other) { *this = other; }
  KeptConfig& operator=(const KeptConfig& other);

  // The kept config (its size the caller's, capped), or nullptr when none was given.
  const ncclConfig_t* get() const {
    return bytes_.empty() ? nullptr : reinterpret_cast<const ncclConfig_t*>(bytes_.data());
  }
  ncclConfig_t* get() {
    return bytes_.empty() ? nullptr : reinterpret_cast<ncclConfig_t*>(bytes_.data());
  }
  // NCCL 2.28.9's fields as the caller gave them (UNDEF where its header has none);
  // `blocking` UNDEF for a config older than NCCL 2.14, which had no such field.
  ncclConfig_t fields() const;
  // minCTAs / maxCTAs where set (NCCL 2.17+ headers), else 0.
  int minCtas() const;
  int maxCtas() const;

 private:
  void repoint();
  std::vector<unsigned char> bytes_;
  std::string commName_, netName_;
  bool hasCommName_ = false, hasNetName_ = false;
};

}  // namespace loom::api
