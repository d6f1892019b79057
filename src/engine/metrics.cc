// The metrics exporter. Every number comes from the flight recorders (per-collective totals,
// failures, sequence numbers): a scrape copies them under the registry's lock, which the
// collectives never take, and formats them outside it, so a slow scraper never holds up a
// communicator. The HTTP server and the file writer are detached threads that live as long
// as the process; they read their knobs once when they start and touch nothing that static
// destruction tears down, so a process may exit while they run.
//
// Metrics must never break a job: every failure here (a taken port, an unwritable file, a
// malformed request, a malformed knob) is a warning, and the job carries on.
#include "engine/metrics.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "algo/collective.h"
#include "base/config.h"
#include "base/error.h"
#include "base/host.h"
#include "base/log.h"
#include "base/socket.h"
#include "base/time.h"
#include "engine/flight_recorder.h"
#include "engine/recorder_registry.h"

namespace loom {
namespace {

IntKnob kPort("LOOM_METRICS_PORT", "", 0,
              "Serve Prometheus metrics over HTTP (GET /metrics) on this port plus the "
              "process's local rank (its index among the first communicator's ranks on the "
              "host), so several ranks per host do not collide; 0: off");
StringKnob kAddr("LOOM_METRICS_ADDR", "", "127.0.0.1",
                 "Address the metrics endpoint listens on (0.0.0.0 or :: for every interface)");
StringKnob kFile("LOOM_METRICS_FILE", "", "",
                 "Write Prometheus metrics to this file every LOOM_METRICS_INTERVAL seconds "
                 "(replaced atomically; for node_exporter's textfile collector); %r = local "
                 "rank, %h = hostname, %p = pid. Unset: no file");
IntKnob kInterval("LOOM_METRICS_INTERVAL", "", 10,
                  "Seconds between rewrites of LOOM_METRICS_FILE");

constexpr double kRequestTimeoutSec = 2;   // a client must send its request within this
constexpr double kResponseTimeoutSec = 5;  // and take the response within this
constexpr size_t kMaxRequestBytes = 8192;

// One communicator's numbers, copied under the registry's lock.
struct CommSample {
  uint64_t comm = 0;
  int rank = 0, nranks = 0;
  uint64_t failures = 0, lastQueued = 0, lastCompleted = 0;
  std::array<CollTotals, kCollectiveCount> totals{};
};

std::vector<CommSample> snapshot() {
  std::vector<CommSample> out;
  forEachRecorder([&](const FlightRecorder& r) {
    CommSample s;
    s.comm = r.commHash();
    s.rank = r.rank();
    s.nranks = r.nranks();
    s.failures = r.failures();
    s.lastQueued = r.lastQueued();
    s.lastCompleted = r.lastCompleted();
    for (int c = 0; c < kCollectiveCount; ++c) s.totals[c] = r.totals(static_cast<Collective>(c));
    out.push_back(s);
  });
  std::sort(out.begin(), out.end(), [](const CommSample& a, const CommSample& b) {
    return a.comm != b.comm ? a.comm < b.comm : a.rank < b.rank;
  });
  return out;
}

// nccl-tests' accounting (and that of Loom's own *_perf tools): the size of an operation is
// what the whole collective moves (for the gathers, scatters and all-to-all, nranks times the
// per-rank count the NCCL call takes), algbw = size / time and busbw = algbw * factor, the
// factor making busbw comparable with the link's speed whatever the collective.
double algBytesFactor(Collective c, int n) {
  switch (c) {
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAlltoAll:
    case Collective::kGather:
    case Collective::kScatter: return n;
    default: return 1;
  }
}

double busBwFactor(Collective c, int n) {
  switch (c) {
    case Collective::kAllReduce: return 2.0 * (n - 1) / n;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAlltoAll:
    case Collective::kGather:
    case Collective::kScatter: return static_cast<double>(n - 1) / n;
    default: return 1;
  }
}

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += strprintf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

std::string commLabels(const CommSample& s) {
  return strprintf("comm=\"%016llx\",rank=\"%d\",nranks=\"%d\"",
                   static_cast<unsigned long long>(s.comm), s.rank, s.nranks);
}

// One sample per collective that has run, of every communicator.
template <class Value>
void perCollective(std::string& out, const std::vector<CommSample>& comms, const char* name,
                   Value value) {
  for (const CommSample& s : comms)
    for (int c = 0; c < kCollectiveCount; ++c) {
      const CollTotals& t = s.totals[c];
      if (t.ops == 0) continue;
      std::string v = value(s, static_cast<Collective>(c), t);
      if (v.empty()) continue;
      out += strprintf("%s{%s,collective=\"%s\"} %s\n", name, commLabels(s).c_str(),
                       collectiveName(static_cast<Collective>(c)), v.c_str());
    }
}

template <class Value>
void perComm(std::string& out, const std::vector<CommSample>& comms, const char* name,
             Value value) {
  for (const CommSample& s : comms)
    out += strprintf("%s{%s} %llu\n", name, commLabels(s).c_str(),
                     static_cast<unsigned long long>(value(s)));
}

std::string u64(uint64_t v) { return strprintf("%llu", static_cast<unsigned long long>(v)); }

std::string render(const std::vector<CommSample>& comms) {
  std::string out;
  family(out, "loom_communicators", "gauge", "Live communicators of this process");
  out += strprintf("loom_communicators %zu\n", comms.size());

  family(out, "loom_operations_total", "counter",
         "Operations completed, per communicator, rank and collective");
  perCollective(out, comms, "loom_operations_total",
                [](const CommSample&, Collective, const CollTotals& t) { return u64(t.ops); });

  family(out, "loom_bytes_total", "counter",
         "Bytes of the completed operations as the NCCL calls count them (count times the "
         "datatype's size, per rank)");
  perCollective(out, comms, "loom_bytes_total",
                [](const CommSample&, Collective, const CollTotals& t) { return u64(t.bytes); });

  family(out, "loom_collective_seconds_total", "counter",
         "Seconds the completed operations took, from start to end");
  perCollective(out, comms, "loom_collective_seconds_total",
                [](const CommSample&, Collective, const CollTotals& t) {
                  return strprintf("%.9f", static_cast<double>(t.ns) / 1e9);
                });

  family(out, "loom_bus_bandwidth_bytes_per_second", "gauge",
         "Bus bandwidth as nccl-tests computes it (algorithm bandwidth times 2(n-1)/n for "
         "all-reduce, (n-1)/n for the gathers, scatters and all-to-all, 1 otherwise), "
         "averaged over every completed operation");
  perCollective(out, comms, "loom_bus_bandwidth_bytes_per_second",
                [](const CommSample& s, Collective c, const CollTotals& t) -> std::string {
                  if (t.ns == 0) return "";
                  double alg = static_cast<double>(t.bytes) * algBytesFactor(c, s.nranks) /
                               (static_cast<double>(t.ns) / 1e9);
                  return strprintf("%.6e", alg * busBwFactor(c, s.nranks));
                });

  family(out, "loom_errors_total", "counter", "Operations that failed, per communicator and rank");
  perComm(out, comms, "loom_errors_total", [](const CommSample& s) { return s.failures; });

  family(out, "loom_last_queued_seq", "gauge",
         "Sequence number of the communicator's last operation issued");
  perComm(out, comms, "loom_last_queued_seq", [](const CommSample& s) { return s.lastQueued; });

  family(out, "loom_last_completed_seq", "gauge",
         "Sequence number of the communicator's last operation completed");
  perComm(out, comms, "loom_last_completed_seq",
          [](const CommSample& s) { return s.lastCompleted; });
  return out;
}

// ---- HTTP --------------------------------------------------------------------------------

// Writes all of `data` within the deadline; false if the client went away or stalled.
bool sendAll(int fd, const std::string& data, Deadline deadline) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, deadline.pollMs()) <= 0 && deadline.expired()) return false;
  }
  return true;
}

std::string response(int code, const char* reason, const std::string& body, bool withBody,
                     const char* contentType = "text/plain; charset=utf-8") {
  std::string r = strprintf(
      "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n",
      code, reason, contentType, body.size());
  if (code == 405) r += "Allow: GET, HEAD\r\n";
  r += "\r\n";
  if (withBody) r += body;
  return r;
}

// The response to a request head (the request line and headers, whatever they are).
std::string answer(const std::string& head) {
  size_t eol = head.find('\n');
  std::string line = head.substr(0, eol);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  // "METHOD SP target SP HTTP/x.y", nothing else.
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.find(' ', sp2 + 1) != std::string::npos ||
      line.compare(sp2 + 1, 5, "HTTP/") != 0 || sp1 == 0 || sp2 == sp1 + 1)
    return response(400, "Bad Request", "bad request\n", true);
  std::string method = line.substr(0, sp1);
  std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));  // Prometheus may add parameters
  bool headOnly = method == "HEAD";
  if (method != "GET" && !headOnly)
    return response(405, "Method Not Allowed", "only GET\n", true);
  if (target != "/metrics" && target != "/")
    return response(404, "Not Found", "not found: try /metrics\n", !headOnly);
  return response(200, "OK", renderMetrics(), !headOnly,
                  "text/plain; version=0.0.4; charset=utf-8");
}

// One connection: read the request head, answer, close. A client that says nothing for
// kRequestTimeoutSec is dropped, so it holds up the next scrape by that much at most.
void serve(int fd) {
  Socket conn(fd);  // closes it
  std::string head;
  Deadline deadline = Deadline::in(kRequestTimeoutSec);
  bool eof = false;
  while (head.find("\r\n\r\n") == std::string::npos && head.find("\n\n") == std::string::npos) {
    if (head.size() > kMaxRequestBytes) break;
    pollfd p{fd, POLLIN, 0};
    int pr = ::poll(&p, 1, deadline.pollMs());
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return;  // silent client: drop it
    char buf[2048];
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      eof = true;
      break;
    }
    head.append(buf, static_cast<size_t>(n));
  }
  if (head.empty()) return;
  if (eof && head.find('\n') == std::string::npos) return;  // hung up mid-line
  std::string r = head.size() > kMaxRequestBytes
                      ? response(400, "Bad Request", "request too large\n", true)
                      : answer(head);
  if (!sendAll(fd, r, Deadline::in(kResponseTimeoutSec))) return;
  // Half-close and read what the client still sends (until it closes, briefly): closing
  // with unread data would reset the connection and could lose the response.
  ::shutdown(fd, SHUT_WR);
  Deadline drain = Deadline::in(0.5);
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, drain.pollMs()) <= 0) return;
    char buf[2048];
    if (::recv(fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0) return;
  }
}

void httpLoop(int listenFd) {
  for (;;) {
    pollfd p{listenFd, POLLIN, 0};
    int pr = ::poll(&p, 1, 1000);
    if (pr <= 0) continue;
    int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors and the like: wait instead of spinning.
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    try {
      serve(fd);
    } catch (...) {
      // A failed scrape (no memory to render, say) is the scraper's problem, not the job's.
    }
  }
}

void startHttp(int port, int localIndex) {
  int64_t p = static_cast<int64_t>(port) + localIndex;
  std::string host = kAddr.get();
  if (host.empty()) host = "127.0.0.1";
  if (host.find(':') != std::string::npos && host[0] != '[') host = "[" + host + "]";
  if (p > 65535) {
    LOOM_WARN("metrics: LOOM_METRICS_PORT %d + local rank %d is past 65535: no metrics "
              "endpoint in this process",
              port, localIndex);
    return;
  }
  std::string where = strprintf("%s:%lld", host.c_str(), static_cast<long long>(p));
  try {
    SocketAddr addr = SocketAddr::parse(where, "LOOM_METRICS_ADDR");
    Socket s = Socket::listen(addr, 64);
    s.setNonBlocking(true);
    std::thread(httpLoop, s.release()).detach();
    LOOM_INFO(kLogInit, "metrics: Prometheus metrics at http://%s/metrics (local rank %d)",
              addr.str().c_str(), localIndex);
  } catch (const std::exception& e) {
    LOOM_WARN("metrics: no endpoint at %s: %s (is another process using the port? "
              "LOOM_METRICS_PORT picks another base); the job carries on without it",
              where.c_str(), e.what());
  }
}

// ---- File --------------------------------------------------------------------------------

std::string expandPath(const std::string& pattern, int localIndex) {
  std::string path;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      path += pattern[i];
      continue;
    }
    char c = pattern[++i];
    if (c == 'r') path += std::to_string(localIndex);
    else if (c == 'h') path += hostName();
    else if (c == 'p') path += std::to_string(getpid());
    else if (c == '%') path += '%';
    else {
      path += '%';
      path += c;
    }
  }
  return path;
}

// "" on success, else what failed.
std::string writeFile(const std::string& path, const std::string& tmp, const std::string& text) {
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return strprintf("open %s: %s", tmp.c_str(), strerror(errno));
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string e = strprintf("write %s: %s", tmp.c_str(), strerror(errno));
      ::close(fd);
      ::unlink(tmp.c_str());
      return e;
    }
    off += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    std::string e = strprintf("close %s: %s", tmp.c_str(), strerror(errno));
    ::unlink(tmp.c_str());
    return e;
  }
  // A reader sees the old file or the new one, never a part.
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string e = strprintf("rename %s to %s: %s", tmp.c_str(), path.c_str(), strerror(errno));
    ::unlink(tmp.c_str());
    return e;
  }
  return "";
}

void fileLoop(std::string path, int intervalSec) {
  // Beside the file (rename stays within one filesystem), named per process, and not
  // ending in .prom (node_exporter's textfile collector ignores it).
  std::string tmp = strprintf("%s.tmp.%d", path.c_str(), static_cast<int>(getpid()));
  bool failing = false;
  for (;;) {
    std::string err;
    try {
      err = writeFile(path, tmp, renderMetrics());
    } catch (const std::exception& e) {
      err = e.what();
    }
    if (!err.empty() && !failing)
      LOOM_WARN("metrics: cannot write LOOM_METRICS_FILE: %s (will keep trying)", err.c_str());
    else if (err.empty() && failing)
      LOOM_INFO(kLogInit, "metrics: writing %s again", path.c_str());
    failing = !err.empty();
    std::this_thread::sleep_for(std::chrono::seconds(intervalSec));
  }
}

void startFile(const std::string& pattern, int localIndex) {
  int64_t interval = kInterval.get();
  if (interval <= 0) {
    LOOM_WARN("metrics: LOOM_METRICS_INTERVAL=%lld is not a positive number of seconds: "
              "using 10",
              static_cast<long long>(interval));
    interval = 10;
  }
  std::string path = expandPath(pattern, localIndex);
  std::thread(fileLoop, path, static_cast<int>(std::min<int64_t>(interval, 1 << 20))).detach();
  LOOM_INFO(kLogInit, "metrics: writing Prometheus metrics to %s every %lld s", path.c_str(),
            static_cast<long long>(interval));
}

void start(int localIndex) {
  if (localIndex < 0) localIndex = 0;
  int64_t port = kPort.get();
  std::string file = kFile.get();
  if (port == 0 && file.empty()) return;
  if (FlightRecorder::configuredCapacity() == 0)
    LOOM_WARN("metrics: LOOM_FLIGHT_RECORDER=0 turns off the counters the metrics come from: "
              "every operation counter will stay 0");
  if (port < 0 || port > 65535)
    LOOM_WARN("metrics: LOOM_METRICS_PORT=%lld is not a port: no metrics endpoint",
              static_cast<long long>(port));
  else if (port > 0)
    startHttp(static_cast<int>(port), localIndex);
  if (!file.empty()) startFile(file, localIndex);
}

}  // namespace

void startMetricsExporter(int localIndex) {
  // Once per process; a forked child (whose parent's threads did not come along) starts
  // its own.
  static std::atomic<pid_t> startedIn{0};
  pid_t me = getpid();
  pid_t seen = startedIn.load();
  do {
    if (seen == me) return;
  } while (!startedIn.compare_exchange_weak(seen, me));
  try {
    start(localIndex);
  } catch (const std::exception& e) {
    LOOM_WARN("metrics: exporter not started: %s", e.what());
  } catch (...) {
    LOOM_WARN("metrics: exporter not started");
  }
}

std::string renderMetrics() { return render(snapshot()); }

}  // namespace loom
