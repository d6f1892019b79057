// The metrics exporter (issue 14, item 4): Prometheus text rendered from the flight
// recorders' totals, served over HTTP while collectives run, and written to a file.
//
// The exporter starts once per process, with the knobs in force when the process's first
// communicator finishes its init, on LOOM_METRICS_PORT + that communicator's local rank.
// So every test sets the knobs (exporterEnv) and makes a one-rank communicator (whose local
// rank is 0) before anything else; CTest runs each test in a process of its own, and run
// together in one process the tests share the exporter the first one started.
#include "engine/metrics.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <poll.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/core_util.h"

namespace loomtest {
namespace {

using Clock = std::chrono::steady_clock;

// ---- Knobs and the exporter's start -------------------------------------------------------

// Two consecutive ports that were free a moment ago (a process's rank r serves on base + r).
int freePortPair() {
  for (int i = 0; i < 50; ++i) {
    int p = freePort();
    if (p <= 0 || p >= 65535) continue;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(p + 1));
    bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(fd);
    if (ok) return p;
  }
  return 0;
}

struct ExporterEnv {
  int port = 0;
  std::string dir;   // where the metrics file goes
  std::string file;  // LOOM_METRICS_FILE's pattern
};

// Sets the exporter's knobs, once per process, before its first communicator exists.
const ExporterEnv& exporterEnv() {
  static const ExporterEnv* env = [] {
    auto* e = new ExporterEnv;
    e->port = freePortPair();
    char dir[] = "/tmp/loom-metrics-test-XXXXXX";
    if (mkdtemp(dir)) e->dir = dir;
    e->file = e->dir + "/metrics-r%r.prom";
    setenv("LOOM_METRICS_PORT", std::to_string(e->port).c_str(), 1);
    setenv("LOOM_METRICS_FILE", e->file.c_str(), 1);
    setenv("LOOM_METRICS_INTERVAL", "1", 1);
    setenv("LOOM_TIMEOUT", "60", 1);  // a deadlock fails naming the operation
    // Best effort: the writer may put its file back in between (it runs until the end).
    atexit([] {
      const ExporterEnv& env = exporterEnv();
      if (env.dir.empty()) return;
      if (DIR* d = opendir(env.dir.c_str())) {
        while (dirent* f = readdir(d))
          if (f->d_name[0] != '.') unlink((env.dir + "/" + f->d_name).c_str());
        closedir(d);
      }
      rmdir(env.dir.c_str());
    });
    return e;
  }();
  return *env;
}
bool gExporterInThisProcess = false;

// A one-rank communicator: the first of the process, it starts the exporter on exactly
// LOOM_METRICS_PORT (local rank 0).
class Starter {
 public:
  Starter() {
    exporterEnv();
    gExporterInThisProcess = true;
    ok_ = ncclCommInitAll(&comm_, 1, nullptr) == ncclSuccess;
  }
  ~Starter() {
    if (ok_) ncclCommDestroy(comm_);
  }
  bool ok() const { return ok_; }

 private:
  ncclComm_t comm_ = nullptr;
  bool ok_ = false;
};

// ---- HTTP client -------------------------------------------------------------------------

struct HttpReply {
  int status = 0;  // 0: no reply
  std::string headers, body, error;
};

// Sends `request` as it is to 127.0.0.1:port and reads the reply until the server closes.
HttpReply httpRaw(int port, const std::string& request, double timeoutSec = 10) {
  HttpReply r;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    r.error = std::string("connect: ") + strerror(errno);
    close(fd);
    return r;
  }
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    r.error = "send failed";
    close(fd);
    return r;
  }
  std::string all;
  auto end = Clock::now() + std::chrono::duration<double>(timeoutSec);
  for (;;) {
    int ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count());
    pollfd p{fd, POLLIN, 0};
    if (ms <= 0 || poll(&p, 1, ms) <= 0) {
      r.error = "timed out reading the reply";
      break;
    }
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    all.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  size_t split = all.find("\r\n\r\n");
  if (split == std::string::npos) {
    if (r.error.empty()) r.error = "no complete reply: '" + all + "'";
    return r;
  }
  r.headers = all.substr(0, split);
  r.body = all.substr(split + 4);
  if (sscanf(r.headers.c_str(), "HTTP/1.%*d %d", &r.status) != 1) r.error = "bad status line";
  return r;
}

HttpReply httpGet(int port, const std::string& path = "/metrics") {
  return httpRaw(port, "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n");
}

// ---- Prometheus text parsing -------------------------------------------------------------

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Scrape {
  std::vector<Sample> samples;
  std::map<std::string, std::string> types;  // family -> counter / gauge
  std::string error;                         // "" when the text is well formed

  // Samples of `name` whose labels include every one of `want`.
  std::vector<const Sample*> find(const std::string& name,
                                  const std::map<std::string, std::string>& want = {}) const {
    std::vector<const Sample*> out;
    for (const Sample& s : samples) {
      if (s.name != name) continue;
      bool match = true;
      for (const auto& [k, v] : want) {
        auto it = s.labels.find(k);
        match &= it != s.labels.end() && it->second == v;
      }
      if (match) out.push_back(&s);
    }
    return out;
  }
  // The one sample of `name` with these labels; NaN when there is not exactly one.
  double value(const std::string& name, const std::map<std::string, std::string>& want) const {
    auto v = find(name, want);
    return v.size() == 1 ? v[0]->value : NAN;
  }
};

// Parses the text exposition format, checking what Prometheus would reject: a sample
// before its family's # TYPE, a family typed twice or interleaved with another, a counter
// not ending in _total, a malformed label set or value.
Scrape parse(const std::string& text) {
  Scrape sc;
  std::istringstream in(text);
  std::string line, current;
  std::set<std::string> closed;
  auto fail = [&](const std::string& why) {
    if (sc.error.empty()) sc.error = why + " in line '" + line + "'";
  };
  if (!text.empty() && text.back() != '\n') sc.error = "text does not end with a newline";
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      if (sc.types.count(name)) fail("family typed twice");
      if (type != "counter" && type != "gauge") fail("unknown type");
      if (type == "counter" && (name.size() < 6 || name.substr(name.size() - 6) != "_total"))
        fail("counter not ending in _total");
      sc.types[name] = type;
      if (!current.empty()) closed.insert(current);
      current = name;
      continue;
    }
    if (line[0] == '#') continue;
    Sample s;
    size_t brace = line.find('{');
    size_t sp;
    if (brace != std::string::npos) {
      s.name = line.substr(0, brace);
      size_t close = line.find('}', brace);
      if (close == std::string::npos) {
        fail("unclosed label set");
        continue;
      }
      std::string labels = line.substr(brace + 1, close - brace - 1);
      size_t pos = 0;
      while (pos < labels.size()) {
        size_t eq = labels.find("=\"", pos);
        size_t endq = eq == std::string::npos ? eq : labels.find('"', eq + 2);
        if (endq == std::string::npos) {
          fail("malformed label");
          break;
        }
        s.labels[labels.substr(pos, eq - pos)] = labels.substr(eq + 2, endq - eq - 2);
        pos = endq + 1;
        if (pos < labels.size() && labels[pos] == ',') ++pos;
      }
      sp = close + 1;
    } else {
      sp = line.find(' ');
      s.name = line.substr(0, sp);
    }
    if (sp >= line.size() || line[sp] != ' ') {
      fail("no value");
      continue;
    }
    char* end = nullptr;
    std::string v = line.substr(sp + 1);
    s.value = strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0') fail("malformed value");
    if (s.name != current)
      fail(closed.count(s.name) ? "family interleaved" : "sample before its # TYPE");
    sc.samples.push_back(s);
  }
  return sc;
}

// The communicators (by comm label) of `nranks` ranks in a scrape.
std::set<std::string> commsOf(const Scrape& sc, int nranks) {
  std::set<std::string> out;
  for (const Sample* s : sc.find("loom_last_queued_seq", {{"nranks", std::to_string(nranks)}}))
    out.insert(s->labels.at("comm"));
  return out;
}

// ---- Driving ranks -----------------------------------------------------------------------

constexpr size_t kCount = 1024;  // floats per all-reduce: 4096 bytes as NCCL counts them

class Ranks {
 public:
  explicit Ranks(int n) : comms_(n, nullptr), bufs_(n, std::vector<float>(kCount * n, 1.0f)) {
    ok_ = ncclCommInitAll(comms_.data(), n, nullptr) == ncclSuccess;
  }
  ~Ranks() {
    if (ok_)
      for (ncclComm_t c : comms_) ncclCommDestroy(c);
  }
  bool ok() const { return ok_; }
  int n() const { return static_cast<int>(comms_.size()); }

  // One grouped call per rank of `coll` ("allreduce", "allgather", "reducescatter",
  // "broadcast"), `count` elements as the NCCL call takes them.
  std::string run(const std::string& coll, size_t count) {
    RANK_NCCL(ncclGroupStart());
    for (int r = 0; r < n(); ++r) {
      float* b = bufs_[r].data();
      if (coll == "allreduce")
        RANK_NCCL(ncclAllReduce(b, b, count, ncclFloat, ncclMax, comms_[r], nullptr));
      else if (coll == "allgather")
        RANK_NCCL(ncclAllGather(b + r * count, b, count, ncclFloat, comms_[r], nullptr));
      else if (coll == "reducescatter")
        RANK_NCCL(
            ncclReduceScatter(b, b + r * count, count, ncclFloat, ncclMax, comms_[r], nullptr));
      else if (coll == "broadcast")
        RANK_NCCL(ncclBroadcast(b, b, count, ncclFloat, 0, comms_[r], nullptr));
    }
    RANK_NCCL(ncclGroupEnd());
    return "";
  }

 private:
  std::vector<ncclComm_t> comms_;
  std::vector<std::vector<float>> bufs_;
  bool ok_ = false;
};

// The bus bandwidth of rank r's `coll` must follow nccl-tests from the bytes and seconds
// reported beside it: size = bytes * algFactor, busbw = size / seconds * busFactor. The
// flight recorder times operations with a coarse clock (the kernel tick, 1-4 ms), so a few
// short operations may have summed to 0 s: then there must be no bandwidth sample at all,
// unless `needTime`.
std::string checkBusBw(const Scrape& sc, const std::map<std::string, std::string>& l,
                       double algFactor, double busFactor, bool needTime) {
  double bytes = sc.value("loom_bytes_total", l);
  double sec = sc.value("loom_collective_seconds_total", l);
  const std::string& who = l.at("collective") + " rank " + l.at("rank");
  RANK_CHECK(sec >= 0 && sec < 60, "%s: %g s", who.c_str(), sec);
  auto bw = sc.find("loom_bus_bandwidth_bytes_per_second", l);
  if (sec == 0) {
    RANK_CHECK(!needTime, "%s: 0 s", who.c_str());
    RANK_CHECK(bw.empty(), "%s: a bandwidth of %g for 0 s", who.c_str(), bw[0]->value);
    return "";
  }
  RANK_CHECK(bw.size() == 1, "%s: %zu bandwidth samples", who.c_str(), bw.size());
  double want = bytes * algFactor / sec * busFactor;
  RANK_CHECK(bw[0]->value > 0 && std::fabs(bw[0]->value - want) <= 1e-3 * want,
             "%s: busbw %g, want %g (%g bytes in %g s)", who.c_str(), bw[0]->value, want, bytes,
             sec);
  return "";
}

// Checks rank r's series of one communicator against `ops` all-reduces of kCount floats;
// "" when they match.
std::string checkRankAllReduces(const Scrape& sc, const std::string& comm, int r, int nranks,
                                uint64_t ops, bool needTime = false) {
  {
    std::map<std::string, std::string> l = {
        {"comm", comm}, {"rank", std::to_string(r)}, {"nranks", std::to_string(nranks)}};
    auto ar = l;
    ar["collective"] = "AllReduce";
    double got = sc.value("loom_operations_total", ar);
    RANK_CHECK(got == static_cast<double>(ops), "rank %d: %g all-reduces, want %llu", r, got,
               static_cast<unsigned long long>(ops));
    double bytes = sc.value("loom_bytes_total", ar);
    RANK_CHECK(bytes == static_cast<double>(ops * kCount * sizeof(float)),
               "rank %d: %g bytes, want %llu", r, bytes,
               static_cast<unsigned long long>(ops * kCount * sizeof(float)));
    // nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n.
    RANK_TRY(checkBusBw(sc, ar, 1, 2.0 * (nranks - 1) / nranks, needTime));
    RANK_CHECK(sc.value("loom_errors_total", l) == 0, "rank %d: errors %g", r,
               sc.value("loom_errors_total", l));
    // Only all-reduces ran: the sequence numbers count them, and no other collective shows.
    RANK_CHECK(sc.value("loom_last_completed_seq", l) == static_cast<double>(ops),
               "rank %d: last completed #%g, want #%llu", r, sc.value("loom_last_completed_seq", l),
               static_cast<unsigned long long>(ops));
    RANK_CHECK(sc.value("loom_last_queued_seq", l) == static_cast<double>(ops),
               "rank %d: last queued #%g", r, sc.value("loom_last_queued_seq", l));
    RANK_CHECK(sc.find("loom_operations_total", l).size() == 1,
               "rank %d: %zu collectives listed, want only AllReduce", r,
               sc.find("loom_operations_total", l).size());
  }
  return "";
}

std::string checkAllReduces(const Scrape& sc, const std::string& comm, int nranks, uint64_t ops,
                            bool needTime = false) {
  for (int r = 0; r < nranks; ++r)
    RANK_TRY(checkRankAllReduces(sc, comm, r, nranks, ops, needTime));
  return "";
}

// Whether every rank of `comm` has a nonzero time for `coll` (the coarse clock has ticked
// inside at least one of its operations).
bool timedOnAllRanks(const Scrape& sc, const std::string& comm, int nranks, const char* coll) {
  for (int r = 0; r < nranks; ++r) {
    double sec = sc.value("loom_collective_seconds_total",
                          {{"comm", comm}, {"rank", std::to_string(r)}, {"collective", coll}});
    if (!(sec > 0)) return false;
  }
  return true;
}

// Stops and joins a helper thread on every way out of a test (a failed ASSERT returns).
class StopAndJoin {
 public:
  StopAndJoin(std::atomic<bool>& stop, std::thread& t) : stop_(stop), t_(t) {}
  ~StopAndJoin() {
    stop_ = true;
    if (t_.joinable()) t_.join();
  }

 private:
  std::atomic<bool>& stop_;
  std::thread& t_;
};

// ---- Tests -------------------------------------------------------------------------------

// Ranks as threads run all-reduces while a scraper polls the endpoint; after each batch the
// counters equal exactly what was done, and every scrape in between sees no fewer than the
// calls that had returned before it and no more than those that had begun after it.
TEST(Metrics, HttpScrapeDuringRun) {
  Starter starter;
  ASSERT_TRUE(starter.ok()) << ncclGetLastError(nullptr);
  int port = exporterEnv().port;
  ASSERT_GT(port, 0);
  constexpr int kRanks = 3;
  Ranks ranks(kRanks);
  ASSERT_TRUE(ranks.ok()) << ncclGetLastError(nullptr);

  HttpReply first = httpGet(port);
  ASSERT_EQ(first.status, 200) << first.error;
  Scrape sc0 = parse(first.body);
  ASSERT_EQ(sc0.error, "") << first.body;
  EXPECT_EQ(sc0.types["loom_communicators"], "gauge");
  EXPECT_EQ(sc0.types["loom_operations_total"], "counter");
  EXPECT_EQ(sc0.types["loom_bus_bandwidth_bytes_per_second"], "gauge");
  EXPECT_EQ(sc0.value("loom_communicators", {}), 1 + kRanks);
  auto ids = commsOf(sc0, kRanks);
  ASSERT_EQ(ids.size(), 1u) << first.body;
  const std::string comm = *ids.begin();
  EXPECT_EQ(comm.size(), 16u);
  EXPECT_EQ(comm.find_first_not_of("0123456789abcdef"), std::string::npos) << comm;
  EXPECT_TRUE(sc0.find("loom_operations_total", {{"comm", comm}}).empty())
      << "no operation yet, so no per-collective series:\n"
      << first.body;

  // Calls begun and calls returned: an operation counts once it completes, which is
  // after it began and before its call returns.
  std::atomic<uint64_t> begun{0}, done{0};
  std::atomic<bool> stop{false};
  std::atomic<int> scrapes{0};
  std::mutex mu;
  std::vector<std::string> problems;
  std::thread scraper([&] {
    double last = 0;
    while (!stop.load()) {
      uint64_t before = done.load();
      HttpReply r = httpGet(port);
      uint64_t after = begun.load();
      std::string why;
      Scrape sc = parse(r.body);
      if (r.status != 200)
        why = "status " + std::to_string(r.status) + ": " + r.error;
      else if (!sc.error.empty())
        why = sc.error;
      for (int k = 0; why.empty() && k < kRanks; ++k) {
        double ops =
            sc.value("loom_operations_total",
                     {{"comm", comm}, {"rank", std::to_string(k)}, {"collective", "AllReduce"}});
        if (std::isnan(ops)) ops = 0;  // none completed yet
        if (ops < before || ops > after || (k == 0 && ops < last))
          why = "rank " + std::to_string(k) + " reported " + std::to_string(ops) +
                " all-reduces while " + std::to_string(before) + " had returned and " +
                std::to_string(after) + " begun (last scrape " + std::to_string(last) + ")";
        if (k == 0) last = ops;
      }
      if (!why.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        problems.push_back(why);
      }
      scrapes.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  StopAndJoin joinScraper(stop, scraper);

  // Batches go on until the scraper has seen several and every rank's all-reduce time has
  // left 0 (the recorder's coarse clock has ticked inside one of them), within a bound.
  constexpr int kPerBatch = 5;
  auto giveUp = Clock::now() + std::chrono::seconds(20);
  bool timed = false;
  for (int batch = 1; batch <= 4 || scrapes.load() < 10 || !timed; ++batch) {
    ASSERT_LT(Clock::now(), giveUp) << "after " << done.load() << " all-reduces and "
                                    << scrapes.load() << " scrapes, timed on every rank: "
                                    << timed;
    for (int i = 0; i < kPerBatch; ++i) {
      begun.fetch_add(1);
      std::string e = ranks.run("allreduce", kCount);
      ASSERT_EQ(e, "");
      done.fetch_add(1);
    }
    HttpReply r = httpGet(port);
    ASSERT_EQ(r.status, 200) << r.error;
    Scrape sc = parse(r.body);
    ASSERT_EQ(sc.error, "") << r.body;
    ASSERT_EQ(checkAllReduces(sc, comm, kRanks, done.load()), "") << r.body;
    timed = timedOnAllRanks(sc, comm, kRanks, "AllReduce");
  }
  stop = true;
  scraper.join();
  Scrape timedScrape = parse(httpGet(port).body);
  EXPECT_EQ(checkAllReduces(timedScrape, comm, kRanks, done.load(), true), "");
  EXPECT_GE(scrapes.load(), 10);
  EXPECT_TRUE(problems.empty()) << problems.size() << " bad scrapes, the first: " << problems[0];

  // A second collective gets its own series; collectives that never ran still have none.
  ASSERT_EQ(ranks.run("broadcast", 100), "");
  Scrape sc = parse(httpGet(port).body);
  for (int k = 0; k < kRanks; ++k) {
    std::map<std::string, std::string> bc = {
        {"comm", comm}, {"rank", std::to_string(k)}, {"collective", "Broadcast"}};
    EXPECT_EQ(sc.value("loom_operations_total", bc), 1);
    EXPECT_EQ(sc.value("loom_bytes_total", bc), 100 * sizeof(float));
    EXPECT_TRUE(
        sc.find("loom_operations_total", {{"comm", comm}, {"collective", "AllGather"}}).empty());
  }
}

// What the endpoint answers besides a scrape, and that a client that never speaks does
// not hold up the next one for long.
TEST(Metrics, HttpRequests) {
  Starter starter;
  ASSERT_TRUE(starter.ok()) << ncclGetLastError(nullptr);
  int port = exporterEnv().port;

  HttpReply root = httpGet(port, "/");
  EXPECT_EQ(root.status, 200) << root.error;
  EXPECT_NE(root.headers.find("text/plain; version=0.0.4"), std::string::npos) << root.headers;
  EXPECT_NE(root.body.find("# TYPE loom_communicators gauge"), std::string::npos);
  HttpReply query = httpGet(port, "/metrics?name[]=loom_communicators");
  EXPECT_EQ(query.status, 200) << query.error;
  HttpReply head = httpRaw(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(head.status, 200) << head.error;
  EXPECT_EQ(head.body, "");
  EXPECT_EQ(httpGet(port, "/nothing").status, 404);
  EXPECT_EQ(httpRaw(port, "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc").status, 405);
  EXPECT_EQ(httpRaw(port, "garbage\r\n\r\n").status, 400);
  EXPECT_EQ(httpRaw(port, "GET /metrics\r\n\r\n").status, 400);  // HTTP/0.9: no version
  EXPECT_EQ(httpRaw(port, "GET  /metrics HTTP/1.0\r\n\r\n").status, 400);
  EXPECT_EQ(httpRaw(port, std::string(20000, 'A')).status, 400);
  // A bare request line and a close, as `printf 'GET /metrics HTTP/1.0\n' | nc` sends.
  EXPECT_EQ(httpRaw(port, "GET /metrics HTTP/1.0\n\n").status, 200);

  // A client that connects and says nothing: the server drops it after its request
  // time-out (2 s) and serves the next meanwhile-waiting scrape.
  int silent = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(connect(silent, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // accepted first
  auto t0 = Clock::now();
  HttpReply after = httpGet(port);
  double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(after.status, 200) << after.error;
  EXPECT_LT(waited, 4.0);
  pollfd p{silent, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1) << "the silent connection was never closed";
  char c;
  EXPECT_EQ(recv(silent, &c, 1, 0), 0);
  close(silent);
}

// The bus bandwidth of each collective follows nccl-tests: all-gather and reduce-scatter
// move nranks times the NCCL call's count, with a (n-1)/n factor; broadcast a factor of 1.
TEST(Metrics, RenderPerCollective) {
  Starter starter;
  ASSERT_TRUE(starter.ok()) << ncclGetLastError(nullptr);
  constexpr int kRanks = 3;
  Ranks ranks(kRanks);
  ASSERT_TRUE(ranks.ok()) << ncclGetLastError(nullptr);
  auto ids = commsOf(parse(loom::renderMetrics()), kRanks);
  ASSERT_EQ(ids.size(), 1u);
  const std::string comm = *ids.begin();

  struct Want {
    const char* op;    // for Ranks::run
    const char* coll;  // as exported
    size_t count;      // the NCCL call's
    double algFactor, busFactor;
    double ops = 0;
  };
  const double n = kRanks;
  std::vector<Want> wants = {{"allgather", "AllGather", 500, n, (n - 1) / n},
                             {"reducescatter", "ReduceScatter", 700, n, (n - 1) / n},
                             {"broadcast", "Broadcast", 900, 1, 1}};
  // Each collective runs until every rank has timed some of it (the coarse clock ticked).
  uint64_t seq = 0;
  for (Want& w : wants) {
    auto giveUp = Clock::now() + std::chrono::seconds(20);
    do {
      ASSERT_LT(Clock::now(), giveUp) << w.coll << " never timed after " << w.ops;
      for (int i = 0; i < 10; ++i, ++w.ops, ++seq) ASSERT_EQ(ranks.run(w.op, w.count), "");
    } while (!timedOnAllRanks(parse(loom::renderMetrics()), comm, kRanks, w.coll));
  }

  std::string text = loom::renderMetrics();
  Scrape sc = parse(text);
  ASSERT_EQ(sc.error, "") << text;
  for (const Want& w : wants) {
    for (int r = 0; r < kRanks; ++r) {
      std::map<std::string, std::string> l = {
          {"comm", comm}, {"rank", std::to_string(r)}, {"collective", w.coll}};
      SCOPED_TRACE(std::string(w.coll) + " rank " + std::to_string(r));
      EXPECT_EQ(sc.value("loom_operations_total", l), w.ops);
      EXPECT_EQ(sc.value("loom_bytes_total", l), w.ops * w.count * sizeof(float));
      EXPECT_EQ(checkBusBw(sc, l, w.algFactor, w.busFactor, true), "") << text;
    }
  }
  EXPECT_TRUE(
      sc.find("loom_operations_total", {{"comm", comm}, {"collective", "AllReduce"}}).empty());
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(sc.value("loom_last_completed_seq", {{"comm", comm}, {"rank", std::to_string(r)}}),
              static_cast<double>(seq));
}

// Reads the metrics file until `ok` accepts it or `sec` pass; every read must be a whole,
// well-formed file (it is replaced by a rename, never rewritten in place).
std::string waitForFile(const std::string& path, double sec,
                        const std::function<std::string(const Scrape&)>& ok) {
  auto end = Clock::now() + std::chrono::duration<double>(sec);
  std::string last = "no file " + path;
  int reads = 0;
  while (Clock::now() < end) {
    std::ifstream f(path);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      std::string text = ss.str();
      Scrape sc = parse(text);
      ++reads;
      if (!sc.error.empty())
        return "read " + std::to_string(reads) + " of " + path + ": " + sc.error;
      if (text.find("# TYPE loom_last_completed_seq") == std::string::npos)  // the last family
        return "a partial file: " + text;
      last = ok(sc);
      if (last.empty()) return "";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return "after " + std::to_string(sec) + " s: " + last;
}

TEST(Metrics, FileExport) {
  Starter starter;
  ASSERT_TRUE(starter.ok()) << ncclGetLastError(nullptr);
  // %r is the local rank of the process's first communicator: 0 here.
  std::string path = exporterEnv().dir + "/metrics-r0.prom";
  constexpr int kRanks = 2;
  Ranks ranks(kRanks);
  ASSERT_TRUE(ranks.ok()) << ncclGetLastError(nullptr);
  for (int i = 0; i < 7; ++i) ASSERT_EQ(ranks.run("allreduce", kCount), "");

  std::string comm;
  auto countsAre = [&](uint64_t ops) {
    return [&, ops](const Scrape& sc) -> std::string {
      auto ids = commsOf(sc, kRanks);
      if (ids.size() != 1) return "no single 2-rank communicator yet";
      comm = *ids.begin();
      return checkAllReduces(sc, comm, kRanks, ops);
    };
  };
  // LOOM_METRICS_INTERVAL=1: the file catches up within a couple of seconds.
  EXPECT_EQ(waitForFile(path, 5, countsAre(7)), "");
  for (int i = 0; i < 3; ++i) ASSERT_EQ(ranks.run("allreduce", kCount), "");
  EXPECT_EQ(waitForFile(path, 5, countsAre(10)), "");

  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

// Ranks as processes on one host: each serves its own metrics on LOOM_METRICS_PORT + its
// local rank, and a scrape of each, while the job runs, shows that rank's counters.
TEST(Metrics, PortPerLocalRank) {
  if (gExporterInThisProcess)
    GTEST_SKIP() << "forks ranks: run it in a process of its own (CTest does)";
  exporterEnv();
  int base = freePortPair();
  ASSERT_GT(base, 0);
  EnvGuard port("LOOM_METRICS_PORT", std::to_string(base).c_str());
  EnvGuard noFile("LOOM_METRICS_FILE", nullptr);
  constexpr int kRanks = 2, kOps = 6;
  struct Board {
    std::atomic<int> ready[kRanks]{};
    std::atomic<int> scraped{0};
  };
  SharedBoard<Board> board;
  LateId late;
  auto f = runEach(
      Mode::kProcesses, kRanks,
      [&](int rank, int n) -> std::string {
        ncclUniqueId id;
        RANK_TRY(late.wait(&id));
        ncclComm_t comm;
        RANK_NCCL(ncclCommInitRank(&comm, n, id, rank));
        std::vector<float> buf(kCount, 1.0f);
        for (int i = 0; i < kOps; ++i)
          RANK_NCCL(
              ncclAllReduce(buf.data(), buf.data(), kCount, ncclFloat, ncclSum, comm, nullptr));
        board->ready[rank] = 1;
        auto end = Clock::now() + std::chrono::seconds(60);
        while (!board->scraped.load() && Clock::now() < end)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        RANK_NCCL(ncclCommDestroy(comm));
        return "";
      },
      120,
      [&]() -> std::string {
        std::string e = makeId(late);
        auto end = Clock::now() + std::chrono::seconds(60);
        while (e.empty() && !(board->ready[0].load() && board->ready[1].load()))
          if (Clock::now() > end)
            e = "the ranks never finished their all-reduces";
          else
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        for (int i = 0; e.empty() && i < kRanks; ++i) {
          HttpReply r = httpGet(base + i);
          Scrape sc = parse(r.body);
          auto comms = sc.find("loom_last_queued_seq");
          if (r.status != 200)
            e = "port base+" + std::to_string(i) + ": " + r.error;
          else if (!sc.error.empty())
            e = sc.error;
          else if (comms.size() != 1)
            e = "port base+" + std::to_string(i) + " lists " + std::to_string(comms.size()) +
                " communicators: " + r.body;
          else if (comms[0]->labels.at("rank") != std::to_string(i))
            e = "port base+" + std::to_string(i) + " serves rank " + comms[0]->labels.at("rank");
          else
            e = checkRankAllReduces(sc, comms[0]->labels.at("comm"), i, kRanks, kOps);
        }
        board->scraped = 1;
        return e;
      });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

}  // namespace
}  // namespace loomtest
