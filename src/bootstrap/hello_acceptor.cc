#include "bootstrap/hello_acceptor.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "base/time.h"

namespace loom {
namespace {

IntKnob kHelloTimeout("LOOM_HELLO_TIMEOUT", "", 5,
                      "Seconds a connection to a rank's listener may take to authenticate "
                      "before it is dropped as a stranger");
constexpr size_t kMaxPending = 256;  // beyond this, new strangers are turned away at once
constexpr int kMaxSleepMs = 1000;

}  // namespace

double HelloAcceptor::helloTimeoutSec() {
  return static_cast<double>(std::max<int64_t>(1, kHelloTimeout.get()));
}

HelloAcceptor::HelloAcceptor(const Socket* listener, std::string who, Verify verify, Serve serve)
    : listener_(listener),
      who_(std::move(who)),
      verify_(std::move(verify)),
      serve_(std::move(serve)),
      timeoutNs_(static_cast<uint64_t>(helloTimeoutSec() * 1e9)) {
  listener_->setNonBlocking(true);
  wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wakeFd_ < 0) LOOM_THROW(kSystemError, "%s: eventfd failed", who_.c_str());
  thread_ = std::thread([this, rank = logRank()] {
    setLogRank(rank);  // log lines carry the owner's rank
    run();
  });
}

HelloAcceptor::~HelloAcceptor() {
  uint64_t one = 1;
  if (write(wakeFd_, &one, sizeof(one)) < 0) {
  }
  thread_.join();
  ::close(wakeFd_);
}

std::vector<std::pair<PeerHello, Socket>> HelloAcceptor::take(int waitMs) {
  std::unique_lock<std::mutex> lock(mu_);
  if (ready_.empty() && waitMs > 0)
    cv_.wait_for(lock, std::chrono::milliseconds(waitMs), [&] { return !ready_.empty(); });
  std::vector<std::pair<PeerHello, Socket>> out;
  for (auto& r : ready_) out.push_back(std::move(r));
  ready_.clear();
  return out;
}

bool HelloAcceptor::busy() const {
  pollfd p{listener_->fd(), POLLIN, 0};
  if (::poll(&p, 1, 0) > 0) return true;  // queued, not accepted yet
  if (working_.load()) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return !ready_.empty();
}

void HelloAcceptor::run() {
  std::vector<pollfd> fds;
  for (;;) {
    // Sleep until something arrives, the stop signal, or the next hello deadline.
    uint64_t now = nowNs(), next = now + kMaxSleepMs * 1000000ull;
    for (const auto& p : pending_) next = std::min(next, p.deadlineNs);
    int waitMs = static_cast<int>((next - now + 999999) / 1000000);
    fds.clear();
    fds.push_back({wakeFd_, POLLIN, 0});
    fds.push_back({listener_->fd(), POLLIN, 0});
    for (const auto& p : pending_) fds.push_back({p.sock.fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), waitMs) < 0 && errno != EINTR) break;
    if (fds[0].revents) break;
    working_.store(true);  // before accept() takes a connection off the listener's queue
    readPending(fds);
    expire();
    if (fds[1].revents) {
      try {
        acceptNew();
      } catch (const Error& e) {  // out of descriptors, say: try again after a pause
        LOOM_WARN("%s: %s", who_.c_str(), e.what());
        ::poll(fds.data(), 1, 100);
      }
    }
    std::erase_if(pending_, [](const Pending& p) { return !p.sock.isOpen(); });
    working_.store(!pending_.empty());
  }
  pending_.clear();  // closes the strangers still waiting
}

void HelloAcceptor::readPending(const std::vector<pollfd>& fds) {
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (!fds[2 + i].revents) continue;
    Pending& p = pending_[i];
    try {
      p.got += p.sock.tryRecv(reinterpret_cast<char*>(&p.hello) + p.got,
                              sizeof(p.hello) - p.got, who_.c_str());
    } catch (const Error&) {
      // Closed or reset before a whole hello: a prober or a port scanner.
      LOOM_INFO(kLogBootstrap, "%s: %s hung up before authenticating", who_.c_str(),
                p.sock.peer().str().c_str());
      p.sock.close();
      continue;
    }
    if (p.got < sizeof(p.hello)) continue;
    if (serve_) {
      bool served = false;
      try {
        p.sock.setNonBlocking(false);
        served = serve_(p.hello, p.sock);
      } catch (const std::exception& e) {  // never lets a request end this thread
        LOOM_INFO(kLogBootstrap, "%s: request from %s: %s", who_.c_str(),
                  p.sock.peer().str().c_str(), e.what());
        served = true;
      }
      if (served) {
        p.sock.close();
        continue;
      }
    }
    if (!verify_(p.hello)) {
      LOOM_WARN("%s: dropped unauthenticated connection from %s (wrong job, rank or MAC, or a "
                "replayed hello)",
                who_.c_str(), p.sock.peer().str().c_str());
      p.sock.close();
      continue;
    }
    p.sock.setNonBlocking(false);  // its owner uses blocking, deadline-bounded transfers
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.emplace_back(p.hello, std::move(p.sock));
    }
    cv_.notify_all();
  }
}

void HelloAcceptor::expire() {
  uint64_t now = nowNs();
  for (auto& p : pending_)
    if (p.sock.isOpen() && now >= p.deadlineNs) {
      LOOM_WARN("%s: dropped connection from %s: %zu of %zu hello bytes within %.0f s", who_.c_str(),
                p.sock.peer().str().c_str(), p.got, sizeof(p.hello), timeoutNs_ / 1e9);
      p.sock.close();
    }
}

void HelloAcceptor::acceptNew() {
  for (;;) {
    Socket s = listener_->accept(Deadline::in(0));
    if (!s.isOpen()) return;
    size_t open = std::count_if(pending_.begin(), pending_.end(),
                                [](const Pending& p) { return p.sock.isOpen(); });
    if (open >= kMaxPending) {
      LOOM_WARN("%s: too many connections waiting to authenticate; dropping %s", who_.c_str(),
                s.peer().str().c_str());
      continue;
    }
    s.setNonBlocking(true);
    pending_.push_back({std::move(s), PeerHello{}, 0, nowNs() + timeoutNs_});
  }
}

}  // namespace loom
