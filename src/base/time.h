#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>

namespace loom {

using Clock = std::chrono::steady_clock;

inline uint64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// CLOCK_MONOTONIC (steady_clock's timeline) at the kernel tick's resolution (1-4 ms): a
// quarter of nowNs()'s cost, for time stamps that need no more.
inline uint64_t coarseNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// CLOCK_REALTIME (Unix time) in nanoseconds: for times other hosts and tools read.
inline uint64_t realtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// A point in time after which a wait gives up. Deadline::never() waits forever.
class Deadline {
 public:
  static Deadline in(double seconds) {
    return Deadline(nowNs() + static_cast<uint64_t>(seconds * 1e9));
  }
  static Deadline never() { return Deadline(UINT64_MAX); }
  bool expired() const { return nowNs() >= at_; }
  // Milliseconds left for poll(); -1 for never.
  int pollMs() const {
    if (at_ == UINT64_MAX) return -1;
    uint64_t now = nowNs();
    if (now >= at_) return 0;
    uint64_t ms = (at_ - now + 999999) / 1000000;
    return ms > 1000000 ? 1000000 : static_cast<int>(ms);
  }
  uint64_t ns() const { return at_; }

 private:
  explicit Deadline(uint64_t at) : at_(at) {}
  uint64_t at_;
};

}  // namespace loom
