// Guards a listener: a thread of its own accepts every connection, reads its PeerHello
// without ever blocking on one connection, checks it, and hands authenticated sockets to
// the owner. Strangers (garbage, wrong or replayed MACs, hellos for another rank, silent
// or half-sent hellos) are logged and closed by that thread within LOOM_HELLO_TIMEOUT,
// whether or not the owner is looking at the listener at the time: they never hold up the
// peers that are really arriving and never linger on a rank that is busy computing.
#pragma once

#include <poll.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/socket.h"
#include "bootstrap/wire.h"

namespace loom {

class HelloAcceptor {
 public:
  // Says whether a complete hello belongs to the job and may be handed over. Runs on the
  // acceptor's thread only (so it may keep state, e.g. nonces seen, without a lock).
  using Verify = std::function<bool(const PeerHello&)>;
  // Answers a request on the acceptor's thread instead of handing the connection over:
  // returns true if it recognised (and authenticated) the hello and has answered on the
  // socket, which is then closed. Must not block for long (a status reply).
  using Serve = std::function<bool(const PeerHello&, const Socket&)>;

  // `listener` must outlive the acceptor; `who` names the rank and listener in logs.
  HelloAcceptor(const Socket* listener, std::string who, Verify verify, Serve serve = nullptr);
  ~HelloAcceptor();  // stops the thread and closes what has not been handed over
  HelloAcceptor(const HelloAcceptor&) = delete;
  HelloAcceptor& operator=(const HelloAcceptor&) = delete;

  // Waits up to waitMs for authenticated connections and returns those that arrived
  // (blocking sockets, with their verified hellos).
  std::vector<std::pair<PeerHello, Socket>> take(int waitMs);

  // Whether a connection may still be on its way to take(): queued on the listener, its
  // hello being read, or handed over but not taken. Lets an owner that has just learnt that
  // a peer died tell "it never connected" from "its connection is not through yet".
  bool busy() const;

  // Seconds a connection may take to send its whole hello (LOOM_HELLO_TIMEOUT).
  static double helloTimeoutSec();

 private:
  struct Pending {
    Socket sock;
    PeerHello hello;
    size_t got;
    uint64_t deadlineNs;
  };
  void run();
  void acceptNew();
  void readPending(const std::vector<pollfd>& fds);
  void expire();

  const Socket* listener_;
  std::string who_;
  Verify verify_;
  Serve serve_;
  uint64_t timeoutNs_;
  int wakeFd_ = -1;  // eventfd: tells the thread to stop
  std::vector<Pending> pending_;  // the thread's alone

  std::atomic<bool> working_{false};  // the thread holds connections not yet handed over

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<PeerHello, Socket>> ready_;
  std::thread thread_;
};

}  // namespace loom
