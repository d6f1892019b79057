// A communicator's proxy: one thread that drives the connections whose bytes move through
// a network backend (Connection::progressOnProxy()), so whoever runs the plan — the CPU
// executor now, a GPU kernel next — only waits on FIFOs and never calls into a network
// library. It starts with the first such connection and stops before they are destroyed;
// a communicator without one has no proxy thread.
#pragma once

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "transports/connection.h"

namespace loom {

class Proxy {
 public:
  Proxy() = default;
  ~Proxy() { stop(); }
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // Drives c->progress() from now on, until stop(). Thread-safe.
  void add(Connection* c);
  // One pass over the connections on the calling thread (a host executor waiting on them
  // drives them itself instead of waiting for the thread's next pass: the hop to the proxy
  // thread is most of a small message's time where ranks have no spare cores). Never
  // beside the thread's pass: when that is under way this returns false at once, so a
  // backend sees one caller at a time, as before. True if anything moved.
  bool pumpIfFree();
  // Joins the thread; progress() is not called afterwards.
  void stop();
  bool running() const { return thread_.joinable(); }
  // Whether any connection was added (read without the lock, by executors).
  bool used() const { return used_.load(std::memory_order_acquire); }

 private:
  void loop();
  bool pass();  // progress() of every connection, under mu_; true if anything moved

  std::mutex mu_;
  std::vector<Connection*> conns_;  // guarded by mu_
  std::atomic<bool> stop_{false};
  std::atomic<bool> used_{false};
  std::atomic<bool> moved_{false};  // a caller's pass moved something since the thread looked
  std::thread thread_;
};

}  // namespace loom
