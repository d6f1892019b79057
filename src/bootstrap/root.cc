#include "bootstrap/root.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "base/hmac.h"
#include "base/log.h"
#include "bootstrap/wire.h"

namespace loom {
namespace {

IntKnob kAuthTimeoutMs("LOOM_BOOTSTRAP_AUTH_TIMEOUT_MS", "", 5000,
                       "How long a new bootstrap connection may take to authenticate before it "
                       "is dropped (ms)");
IntKnob kMaxPending("LOOM_BOOTSTRAP_MAX_PENDING", "", 256,
                    "Most unauthenticated connections the bootstrap root holds at once");

// How long a failed rendezvous keeps answering ranks that arrive late.
constexpr double kLingerSec = 60;

struct Pending {
  Socket sock;
  std::vector<uint8_t> in;
  uint64_t deadlineNs;
};

struct Member {
  Socket sock;
  RootHello hello;
};

class RootServer {
 public:
  RootServer(Socket listener, const JobId& id)
      : listener_(std::move(listener)),
        id_(id),
        wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        pid_(getpid()) {}
  ~RootServer() {
    if (wake_ >= 0) ::close(wake_);
  }
  RootServer(const RootServer&) = delete;
  RootServer& operator=(const RootServer&) = delete;

  const JobId& id() const { return id_; }
  pid_t pid() const { return pid_; }
  // From another thread (under the root list's lock): the rendezvous is called off; the ranks waiting
  // and those arriving within the linger time are told (status 4).
  void cancel() {
    const uint64_t one = 1;
    if (wake_ >= 0 && ::write(wake_, &one, sizeof(one)) < 0) {}
  }

  void run() {
    listener_.setNonBlocking(true);
    // After a failure the root lingers (bounded) to tell ranks that arrive late, so no
    // rank waits for one that died.
    uint64_t lingerUntil = 0;
    // (Cancelled, every rank is told, also one that has not arrived yet.)
    while (failed_ >= 0 ? ((failStatus_ == 4 ? nranks_ < 0 || told_ < nranks_
                                             : told_ < nranks_ - 1) &&
                           nowNs() < lingerUntil)
                        : (nranks_ < 0 || registered_ < nranks_)) {
      std::vector<pollfd>& fds = fds_;
      fds.clear();
      fds.push_back({listener_.fd(), POLLIN, 0});
      fds.push_back({failed_ < 0 ? wake_ : -1, POLLIN, 0});
      for (auto& p : pending_) fds.push_back({p.sock.fd(), POLLIN, 0});
      for (auto& m : members_) fds.push_back({m.sock.isOpen() ? m.sock.fd() : -1, POLLIN, 0});
      int timeout = failed_ >= 0 ? 100 : -1;
      uint64_t now = nowNs();
      for (auto& p : pending_) {
        int ms = p.deadlineNs > now ? static_cast<int>((p.deadlineNs - now) / 1000000 + 1) : 0;
        if (timeout < 0 || ms < timeout) timeout = ms;
      }
      int n = ::poll(fds.data(), fds.size(), timeout);
      if (n < 0 && errno != EINTR) {
        LOOM_WARN("bootstrap root %s: poll failed (%s); giving up", id_.root.str().c_str(),
                  strerror(errno));
        return;
      }
      if (fds[1].revents && failed_ < 0) {
        LOOM_INFO(kLogBootstrap, "bootstrap root %s: rendezvous cancelled by its process",
                  id_.root.str().c_str());
        failed_ = 0;
        failStatus_ = 4;
      }
      // Only the entries polled above: reading a hello may grow members_ and pending_.
      size_t nPending = pending_.size(), nMembers = members_.size();
      for (size_t i = 0; i < nMembers; ++i)
        if (fds[2 + nPending + i].revents && members_[i].sock.isOpen()) checkMember(members_[i]);
      for (size_t i = 0; i < nPending; ++i)
        if (fds[2 + i].revents) readPending(pending_[i]);
      if (fds[0].revents) acceptAll();
      expirePending();
      if (failed_ >= 0 && lingerUntil == 0) {
        failAll();
        lingerUntil = nowNs() + static_cast<uint64_t>(kLingerSec * 1e9);
      }
    }
    if (failed_ < 0) reply();
  }

 private:
  void acceptAll() {
    for (;;) {
      Socket s = listener_.accept(Deadline::in(0));
      if (!s.isOpen()) return;
      if (static_cast<int64_t>(pending_.size()) >= kMaxPending.get()) {
        LOOM_WARN("bootstrap root %s: too many unauthenticated connections; dropping %s",
                  id_.root.str().c_str(), s.peer().str().c_str());
        continue;
      }
      s.setNonBlocking(true);
      pending_.push_back({std::move(s), {}, nowNs() + kAuthTimeoutMs.get() * 1000000ull});
    }
  }

  void drop(Pending& p, const char* why) {
    LOOM_WARN("bootstrap root %s: dropped connection from %s: %s", id_.root.str().c_str(),
              p.sock.peer().str().c_str(), why);
    p.sock.close();
  }

  void readPending(Pending& p) {
    uint8_t buf[sizeof(RootHello)];
    size_t want = sizeof(RootHello) - p.in.size();
    size_t got;
    try {
      got = p.sock.tryRecv(buf, want, "bootstrap root");
    } catch (const Error&) {
      p.sock.close();  // closed or reset before authenticating: nothing to report
      return;
    }
    p.in.insert(p.in.end(), buf, buf + got);
    if (p.in.size() < sizeof(RootHello)) return;
    RootHello h;
    memcpy(&h, p.in.data(), sizeof(h));
    if (h.magic != kUniqueIdMagic || h.version != kWireVersion || h.kind != 1)
      return drop(p, "not a Loom bootstrap hello");
    Digest mac = helloMac(id_, h);
    Digest got2;
    memcpy(got2.data(), h.mac, 32);
    if (!digestEqual(mac, got2)) return drop(p, "authentication failed (wrong job secret)");
    if (h.nranks <= 0 || h.rank < 0 || h.rank >= h.nranks)
      return drop(p, "rank out of range");
    if (nranks_ < 0) {
      nranks_ = h.nranks;
      members_.resize(nranks_);
    }
    if (failed_ >= 0) {
      rejectAndClose(p, h, failStatus_, failed_);
      ++told_;
      return;
    }
    if (h.nranks != nranks_) {
      LOOM_WARN("bootstrap root %s: rank %d says nranks=%d but rank(s) before it said %d",
                id_.root.str().c_str(), h.rank, h.nranks, nranks_);
      rejectAndClose(p, h, 1, nranks_);
      return;
    }
    Member& m = members_[h.rank];
    if (m.sock.isOpen()) {
      LOOM_WARN("bootstrap root %s: rank %d joined twice (from %s and %s)", id_.root.str().c_str(),
                h.rank, m.sock.peer().str().c_str(), p.sock.peer().str().c_str());
      rejectAndClose(p, h, 2, nranks_);
      return;
    }
    m.sock = std::move(p.sock);
    m.hello = h;
    ++registered_;
    LOOM_INFO(kLogBootstrap, "bootstrap root: rank %d/%d joined from %s", h.rank, nranks_,
              m.sock.peer().str().c_str());
  }

  // status 1: nranks mismatch, 2: duplicate rank, 3: rank `value` died during rendezvous,
  // 4: cancelled by the root's process (cancelRoot).
  void rejectAndClose(Pending& p, const RootHello& h, uint16_t status, int value) {
    RootReplyHeader r{};
    r.magic = kUniqueIdMagic;
    r.version = kWireVersion;
    r.status = status;
    r.nranks = value;
    Digest mac = replyMac(id_, h, r, nullptr, 0);
    memcpy(r.mac, mac.data(), 32);
    try {
      p.sock.sendAll(&r, sizeof(r), Deadline::in(1), "bootstrap root reject");
    } catch (const Error&) {
    }
    p.sock.close();
  }

  // A member whose socket becomes readable before the reply has died or misbehaved.
  void checkMember(Member& m) {
    uint8_t b;
    bool closed = false;
    try {
      closed = m.sock.tryRecv(&b, 1, "bootstrap root") > 0;  // unexpected bytes: treat as gone
    } catch (const Error&) {
      closed = true;
    }
    if (closed && failed_ >= 0) {  // already failing: it is told no more
      m.sock.close();
      ++told_;
    } else if (closed) {
      LOOM_WARN("bootstrap root %s: rank %d (%s) left before all ranks arrived; failing the "
                "rendezvous",
                id_.root.str().c_str(), m.hello.rank, m.sock.peer().str().c_str());
      m.sock.close();
      --registered_;
      failed_ = m.hello.rank;
    }
  }

  // A rank died mid-rendezvous: tell everyone who is waiting, so nobody waits for it.
  void failAll() {
    for (auto& m : members_) {
      if (!m.sock.isOpen()) continue;
      RootReplyHeader r{};
      r.magic = kUniqueIdMagic;
      r.version = kWireVersion;
      r.status = failStatus_;
      r.nranks = failed_;
      Digest mac = replyMac(id_, m.hello, r, nullptr, 0);
      memcpy(r.mac, mac.data(), 32);
      try {
        m.sock.sendAll(&r, sizeof(r), Deadline::in(1), "bootstrap root failure notice");
      } catch (const Error&) {
      }
      m.sock.close();
      ++told_;
    }
  }

  void expirePending() {
    uint64_t now = nowNs();
    for (auto& p : pending_)
      if (p.sock.isOpen() && now >= p.deadlineNs) drop(p, "did not authenticate in time");
    std::erase_if(pending_, [](const Pending& p) { return !p.sock.isOpen(); });
  }

  void reply() {
    std::vector<sockaddr_storage> table(nranks_);
    for (int r = 0; r < nranks_; ++r) memcpy(&table[r], members_[r].hello.listen, sizeof(table[r]));
    for (int r = 0; r < nranks_; ++r) {
      RootReplyHeader h{};
      h.magic = kUniqueIdMagic;
      h.version = kWireVersion;
      h.nranks = nranks_;
      Digest mac = replyMac(id_, members_[r].hello, h, table.data(),
                            table.size() * sizeof(sockaddr_storage));
      memcpy(h.mac, mac.data(), 32);
      try {
        Deadline d = Deadline::in(10);
        members_[r].sock.sendAll(&h, sizeof(h), d, "bootstrap root reply");
        members_[r].sock.sendAll(table.data(), table.size() * sizeof(sockaddr_storage), d,
                                 "bootstrap root reply");
      } catch (const Error& e) {
        LOOM_WARN("bootstrap root %s: could not answer rank %d: %s", id_.root.str().c_str(), r,
                  e.what());
      }
    }
    LOOM_INFO(kLogBootstrap, "bootstrap root %s: rendezvous of %d ranks complete",
              id_.root.str().c_str(), nranks_);
  }

  Socket listener_;
  JobId id_;
  std::vector<pollfd> fds_;
  std::vector<Pending> pending_;
  std::vector<Member> members_;
  int nranks_ = -1;
  int registered_ = 0;
  int wake_;  // eventfd: cancel()
  pid_t pid_;  // the process whose thread runs it
  int failed_ = -1;  // a rank that left before the rendezvous completed (0 when cancelled)
  uint16_t failStatus_ = 3;  // what the ranks are told: 3 a rank left, 4 cancelled
  int told_ = 0;     // ranks told about the failure
};

// The roots running in this process, for cancelRoot. A root whose id no rank uses waits for
// ranks until the process exits; listed here, what it holds also stays reachable from a
// global, so LeakSanitizer's check at exit does not depend on finding it on a blocked
// thread's stack (core_test under ASan once reported the poll lists of two such roots as
// leaked). Made when the library loads, never freed (roots may outlive static destructors);
// the lock is held across fork(), so that a child never inherits it held.
std::mutex gRootsMu;
std::vector<RootServer*>* const gRoots = new std::vector<RootServer*>();
[[maybe_unused]] const int gRootsAtFork = pthread_atfork(
    [] { gRootsMu.lock(); }, [] { gRootsMu.unlock(); }, [] { gRootsMu.unlock(); });

}  // namespace

void startRoot(JobId& id) {
  SocketAddr addr = id.root;
  Socket listener = Socket::listen(addr);
  id.root = addr;
  LOOM_INFO(kLogBootstrap, "bootstrap root listening on %s", addr.str().c_str());
  auto* server = new RootServer(std::move(listener), id);
  {
    std::lock_guard<std::mutex> lock(gRootsMu);
    gRoots->push_back(server);
  }
  std::thread([server, id] {
    try {
      server->run();
    } catch (const std::exception& e) {
      LOOM_WARN("bootstrap root %s failed: %s", id.root.str().c_str(), e.what());
    }
    {
      std::lock_guard<std::mutex> lock(gRootsMu);
      gRoots->erase(std::find(gRoots->begin(), gRoots->end(), server));
    }
    delete server;
  }).detach();
}

bool cancelRoot(const JobId& id) {
  std::lock_guard<std::mutex> lock(gRootsMu);
  for (RootServer* server : *gRoots) {
    // A forked child inherits the list (and each root's eventfd) without the roots' threads:
    // only this process's roots are its to cancel.
    if (server->pid() == getpid() && server->id().root.str() == id.root.str() &&
        std::memcmp(server->id().secret, id.secret, sizeof(id.secret)) == 0) {
      server->cancel();
      return true;
    }
  }
  return false;
}

}  // namespace loom
