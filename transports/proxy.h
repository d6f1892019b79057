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
  // Joins the thread; progress() is not called afterwards.
  void stop();
  bool running() const { return thread_.joinable(); }

 private:
  void loop();

  std::mutex mu_;
  std::vector<Connection*> conns_;  // guarded by mu_
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace loom
