#include "bootstrap/hello_acceptor.h"

#include <poll.h>

#include <algorithm>

#include "base/error.h"
#include "base/log.h"
#include "base/time.h"

namespace loom {
namespace {
constexpr size_t kMaxPending = 256;  // beyond this, new strangers are turned away at once
}

std::vector<std::pair<PeerHello, Socket>> HelloAcceptor::poll(int waitMs, const char* who) {
  std::vector<pollfd> fds;
  fds.push_back({listener_->fd(), POLLIN, 0});
  for (auto& p : pending_) fds.push_back({p.sock.fd(), POLLIN, 0});
  ::poll(fds.data(), fds.size(), waitMs);
  std::vector<std::pair<PeerHello, Socket>> done;
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (!fds[1 + i].revents) continue;
    Pending& p = pending_[i];
    try {
      p.got += p.sock.tryRecv(reinterpret_cast<char*>(&p.hello) + p.got, sizeof(p.hello) - p.got,
                              who);
    } catch (const Error&) {
      p.sock.close();  // closed or reset before saying hello: a prober, nothing to report
      continue;
    }
    if (p.got == sizeof(p.hello)) done.emplace_back(p.hello, std::move(p.sock));
  }
  if (fds[0].revents) {
    for (;;) {
      Socket s = listener_->accept(Deadline::in(0));
      if (!s.isOpen()) break;
      if (pending_.size() >= kMaxPending) {
        LOOM_WARN("%s: too many connections waiting to authenticate; dropping %s", who,
                  s.peer().str().c_str());
        continue;
      }
      s.setNonBlocking(true);
      pending_.push_back({std::move(s), PeerHello{}, 0, nowNs() + timeoutNs_});
    }
  }
  uint64_t now = nowNs();
  for (auto& p : pending_)
    if (p.sock.isOpen() && now >= p.deadlineNs) {
      LOOM_WARN("%s: dropped connection from %s: no hello within %.0f s", who,
                p.sock.peer().str().c_str(), timeoutNs_ / 1e9);
      p.sock.close();
    }
  std::erase_if(pending_, [](const Pending& p) { return !p.sock.isOpen(); });
  // Authenticated sockets go back to blocking mode for their owners.
  for (auto& d : done) d.second.setNonBlocking(false);
  return done;
}

}  // namespace loom
