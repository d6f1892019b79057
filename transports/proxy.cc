#include "transports/proxy.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "base/log.h"

namespace loom {

void Proxy::add(Connection* c) {
  std::lock_guard<std::mutex> g(mu_);
  conns_.push_back(c);
  used_.store(true, std::memory_order_release);
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
}

// A connection keeps its error until a waiter asks (checkPeer()): nothing to do with it here.
bool Proxy::pass() {
  bool any = false;
  for (Connection* c : conns_) any |= c->progress();
  return any;
}

bool Proxy::pumpIfFree() {
  std::unique_lock<std::mutex> g(mu_, std::try_to_lock);
  if (!g.owns_lock() || stop_.load(std::memory_order_acquire)) return false;
  bool any = pass();
  if (any) moved_.store(true, std::memory_order_relaxed);
  return any;
}

void Proxy::stop() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> g(mu_);
  conns_.clear();
}

void Proxy::loop() {
  pthread_setname_np(pthread_self(), "loom-proxy");
  // Back off when nothing moves: poll, then yield (a waiting rank gets its data within a
  // yield), and after some 20000 idle rounds sleep 50 us at a time, so an idle
  // communicator's proxy costs the host's ranks next to no CPU.
  unsigned idle = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    bool any;
    {
      std::lock_guard<std::mutex> g(mu_);
      any = pass();
    }
    // Data a caller's pass moved counts as the thread's own: a communicator at work keeps
    // its thread polling, not sleeping, when its executor turns to reductions.
    if (any || moved_.exchange(false, std::memory_order_relaxed)) {
      idle = 0;
      continue;
    }
    ++idle;
    if (idle < 200) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else if (idle < 20000) {
      sched_yield();
    } else {
      timespec ts{0, 50000};
      nanosleep(&ts, nullptr);
    }
  }
}

}  // namespace loom
