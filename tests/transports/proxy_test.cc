// The proxy's pass on a caller's thread (Proxy::pumpIfFree, what a host executor does while
// it waits on network connections): it drives the connections there, never beside the proxy
// thread's own pass (a backend sees one caller at a time), never waits for that pass, and
// never runs once the proxy has stopped.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "transports/proxy.h"

namespace {

using loom::Connection;
using loom::PeerInfo;
using loom::Proxy;

PeerInfo noPeer() {
  PeerInfo p{};
  p.pid = 1;
  return p;
}

// Counts its pumps by thread and notes any that overlap; `hold` keeps a pump of the proxy
// thread inside progress() until released.
class CountingConnection : public Connection {
 public:
  explicit CountingConnection(std::thread::id caller)
      : Connection(1, "counting", noPeer(), ""), caller_(caller) {}
  bool needsProgress() const override { return true; }
  bool progressOnProxy() const override { return true; }
  bool progress() override {
    if (inside_.fetch_add(1) != 0) overlapped = true;
    bool onCaller = std::this_thread::get_id() == caller_;
    (onCaller ? byCaller : byThread).fetch_add(1);
    if (!onCaller && hold.load()) {
      held = true;
      while (hold.load()) std::this_thread::yield();
    }
    inside_.fetch_sub(1);
    return true;
  }

  std::atomic<bool> hold{false}, held{false}, overlapped{false};
  std::atomic<int> byCaller{0}, byThread{0};

 private:
  std::thread::id caller_;
  std::atomic<int> inside_{0};
};

TEST(Proxy, ACallerPumpsTheConnectionsNeverBesideTheThread) {
  CountingConnection a(std::this_thread::get_id()), b(std::this_thread::get_id());
  Proxy proxy;
  EXPECT_FALSE(proxy.used());
  proxy.add(&a);
  proxy.add(&b);
  ASSERT_TRUE(proxy.used());
  // Until both the caller and the thread have pumped a thousand times.
  int moved = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((moved < 1000 || a.byThread.load() < 1000) && std::chrono::steady_clock::now() < deadline)
    moved += proxy.pumpIfFree() ? 1 : 0;
  proxy.stop();
  EXPECT_GE(moved, 1000);
  // A pass takes every connection: both were pumped on this thread as often as it said.
  EXPECT_EQ(a.byCaller.load(), moved);
  EXPECT_EQ(b.byCaller.load(), moved);
  EXPECT_GE(a.byThread.load(), 1000);  // the thread went on meanwhile
  EXPECT_FALSE(a.overlapped.load());
  EXPECT_FALSE(b.overlapped.load());
}

TEST(Proxy, ACallerDoesNotWaitForTheThreadsPassNorPumpAfterStop) {
  CountingConnection c(std::this_thread::get_id());
  c.hold = true;
  Proxy proxy;
  struct Release {  // a failed assertion must not leave the thread held (stop() joins it)
    CountingConnection& c;
    ~Release() { c.hold = false; }
  } release{c};
  proxy.add(&c);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!c.held.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_TRUE(c.held.load()) << "the proxy thread never pumped";
  // The thread is inside its pass: the caller's pass returns false at once, pumping nothing.
  for (int i = 0; i < 1000; ++i) ASSERT_FALSE(proxy.pumpIfFree());
  EXPECT_EQ(c.byCaller.load(), 0);
  c.hold = false;
  bool pumped = false;
  while (!pumped && std::chrono::steady_clock::now() < deadline) pumped = proxy.pumpIfFree();
  EXPECT_TRUE(pumped);
  proxy.stop();
  int before = c.byCaller.load() + c.byThread.load();
  EXPECT_FALSE(proxy.pumpIfFree());
  EXPECT_EQ(c.byCaller.load() + c.byThread.load(), before);
  EXPECT_FALSE(c.overlapped.load());
}

TEST(Proxy, WithoutConnectionsThereIsNothingToPump) {
  Proxy proxy;
  EXPECT_FALSE(proxy.used());
  EXPECT_FALSE(proxy.running());
  EXPECT_FALSE(proxy.pumpIfFree());
}

}  // namespace
