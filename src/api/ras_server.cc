#include "api/ras_server.h"

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

#include "api/ras_gather.h"
#include "api/ras_report.h"
#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "base/socket.h"
#include "engine/job_status.h"

namespace loom::ras {
namespace {

// Read as NCCL reads its integer parameters (strtoll, nothing refused), once per process,
// so that no value can fail an init or a client's query.
StringKnob kEnable("LOOM_RAS_ENABLE", "NCCL_RAS_ENABLE", "1",
                   "1: answer NCCL's RAS queries (ncclras, `echo status | nc localhost 28028`) "
                   "at the RAS address; anything else (as NCCL): no RAS socket (peers' queries "
                   "through a communicator are still answered)");
StringKnob kAddr("LOOM_RAS_ADDR", "NCCL_RAS_ADDR", "localhost:28028",
                 "Address (host:port or [ipv6]:port) where each process listens for RAS "
                 "clients; the processes of one user on a host share it");
StringKnob kTimeoutFactor("LOOM_RAS_TIMEOUT_FACTOR", "NCCL_RAS_TIMEOUT_FACTOR", "1",
                          "Multiplies the RAS query's default time-out (5 s) for the other "
                          "processes' answers (a client's TIMEOUT command sets its own)");

constexpr size_t kMaxLine = 1024;        // as NCCL: a longer line ends the connection
constexpr int kMaxClients = 64;          // at once; more are closed at once (NCCL: no limit)
constexpr int kIdleMs = 10 * 60 * 1000;  // a connection that says nothing for this long
constexpr long kMaxWaitSec = 600;        // TIMEOUT 0 (NCCL: no limit) and longer ones

std::atomic<double> gDefaultWaitSec{5.0};  // 5 s times NCCL_RAS_TIMEOUT_FACTOR

std::atomic<pid_t> gServingPid{0};  // the process whose listener runs (not a forked child's)
std::atomic<bool> gStarting{false};
std::atomic<int> gListenFd{-1};
std::atomic<int> gClients{0};
std::mutex gAddrMu;
std::string gAddr;

bool sendAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

struct Client {
  bool verbose = false;
  bool json = false;
  double timeoutSec;
};

void report(int fd, const Client& c) {
  JobView view;
  if (!c.json && !sendAll(fd, renderTextHead(view.head(), c.verbose))) return;
  const Report& r = view.gather(c.timeoutSec);
  sendAll(fd, c.json ? renderJson(r) : renderTextBody(r, c.verbose));
}

// One command line; false once the connection is done (after a report).
bool command(int fd, std::string line, Client& c) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  const char* s = line.c_str();
  if (strncasecmp(s, "client protocol ", 16) == 0) return sendAll(fd, "SERVER PROTOCOL 2\n");
  if (strncasecmp(s, "timeout ", 8) == 0) {
    char* end = nullptr;
    errno = 0;
    long n = strtol(s + 8, &end, 10);
    if (n < 0 || *end != '\0' || errno == ERANGE)
      return sendAll(fd, std::string("ERROR: Invalid timeout value ") + (s + 8) + "\n");
    // 0 is NCCL's "no limit": a bound all the same, so that clients gone with a stopped peer
    // unanswered do not hold their threads for ever.
    c.timeoutSec = static_cast<double>(n == 0 || n > kMaxWaitSec ? kMaxWaitSec : n);
    return sendAll(fd, "OK\n");
  }
  if (strncasecmp(s, "set format ", 11) == 0) {
    if (strcasecmp(s + 11, "text") == 0 || strcasecmp(s + 11, "json") == 0) {
      c.json = strcasecmp(s + 11, "json") == 0;
      return sendAll(fd, "OK\n");
    }
    return sendAll(fd, std::string("ERROR: Invalid format ") + (s + 11) + "\n");
  }
  if (strcasecmp(s, "status") == 0 || strcasecmp(s, "verbose status") == 0) {
    c.verbose |= strcasecmp(s, "verbose status") == 0;
    report(fd, c);
    return false;
  }
  return sendAll(fd, "ERROR: Unknown command " + line + "\n");
}

void serveClient(int fd) {
  Client c;
  c.timeoutSec = gDefaultWaitSec.load();
  timeval tv{10, 0};  // a client that stops reading does not hold the thread for ever
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::string buf;
  for (bool open = true; open;) {
    pollfd p{fd, POLLIN, 0};
    int k = poll(&p, 1, kIdleMs);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    char tmp[kMaxLine];
    ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(tmp, static_cast<size_t>(n));
    size_t nl;
    while (open && (nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      open = command(fd, line, c);
    }
    if (buf.size() >= kMaxLine) break;  // a line too long for NCCL's buffer
  }
}

void serveAndClose(int fd) {
  try {
    serveClient(fd);
  } catch (...) {  // out of memory or threads: this client goes, the process stays
  }
  // The end of the report is the client's end of file, even where a child forked meanwhile
  // holds a copy of this descriptor.
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

void acceptLoop(int listenFd) {
  pthread_setname_np(pthread_self(), "loom RAS");
  for (;;) {
    int fd = accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EBADF || errno == EINVAL) return;  // the socket is gone: nothing to serve
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // out of descriptors
      continue;
    }
    if (gClients.fetch_add(1) >= kMaxClients) {
      gClients.fetch_sub(1);
      ::close(fd);
      continue;
    }
    try {
      std::thread([fd] {
        serveAndClose(fd);
        gClients.fetch_sub(1);
      }).detach();
    } catch (...) {
      gClients.fetch_sub(1);
      ::close(fd);
    }
  }
}

// A forked child has its parent's listening socket but not the thread that accepts on it:
// it closes its copy and starts its own at its first init.
void inChild() {
  int fd = gListenFd.exchange(-1);
  if (fd >= 0) ::close(fd);
  gServingPid.store(0);
  gStarting.store(false);
  gClients.store(0);
}

int listenAt(const std::string& text, std::string* bound) {
  SocketAddr a = SocketAddr::parse(text, "NCCL_RAS_ADDR");
  int fd = ::socket(a.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) LOOM_THROW(kSystemError, "socket: %s", strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));  // the job's processes share it
  if (::bind(fd, a.sa(), a.len) != 0 || ::listen(fd, 128) != 0) {
    int e = errno;
    ::close(fd);
    LOOM_THROW(kSystemError, "bind/listen at %s: %s", a.str().c_str(), strerror(e));
  }
  *bound = a.str();
  return fd;
}

}  // namespace

void startServer() {
  setProcessReportSource(&localProcessPayload);
  const pid_t me = getpid();
  if (gServingPid.load() == me || gStarting.exchange(true)) return;
  static std::once_flag atfork;
  std::call_once(atfork, [] { pthread_atfork(nullptr, nullptr, inChild); });
  gServingPid.store(me);  // tried once per process, whatever comes of it
  std::string addr;
  try {
    if (strtoll(kEnable.get().c_str(), nullptr, 0) != 1) return;  // as NCCL: exactly 1
    long long factor = strtoll(kTimeoutFactor.get().c_str(), nullptr, 0);
    gDefaultWaitSec.store(5.0 * static_cast<double>(factor >= 1 && factor <= 100 ? factor : 1));
    addr = kAddr.get();
    std::string bound;
    int fd = listenAt(addr, &bound);
    try {
      std::thread(acceptLoop, fd).detach();
    } catch (...) {
      ::close(fd);
      throw;
    }
    gListenFd.store(fd);
    std::lock_guard<std::mutex> lock(gAddrMu);
    gAddr = bound;
    LOOM_INFO(kLogInit | kLogRas, "RAS client listening socket at %s", bound.c_str());
  } catch (const std::exception& e) {  // as NCCL: the init goes on without a RAS socket
    // Said louder where the address was asked for than for the default.
    if (kAddr.isSet())
      LOOM_WARN("RAS: no client socket at %s (NCCL_RAS_ADDR): %s", addr.c_str(), e.what());
    else
      LOOM_INFO(kLogInit | kLogRas, "RAS failed to establish a client listening socket at %s: %s",
                addr.c_str(), e.what());
  }
}

std::string serverAddress() {
  if (gServingPid.load() != getpid() || gListenFd.load() < 0) return "";
  std::lock_guard<std::mutex> lock(gAddrMu);
  return gAddr;
}

}  // namespace loom::ras
