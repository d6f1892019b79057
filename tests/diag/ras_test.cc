// NCCL's RAS queries against live jobs: three ranks as processes, each listening on
// NCCL_RAS_ADDR (one port, shared as NCCL's processes share it). A client speaks NCCL 2.28's
// protocol and gets NCCL's report: a healthy job (text and JSON), a rank ahead of the others
// (MISMATCH with the counts), a stopped process (INCOMPLETE and TIMEOUT), a killed one
// (DEAD); bad commands get NCCL's errors. A peer reached through another communicator when
// its rank of one is gone; communicators the answering process is not in. Ranks as threads
// (one process, two ranks; a report read while they run and go); the wire record; the
// knobs read as NCCL reads them.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "api/ras_gather.h"
#include "api/ras_server.h"
#include "api/ras_wire.h"
#include "core/core_util.h"
#include "core/late_id.h"
#include "core/rank_harness.h"
#include "diag/diag_util.h"
#include "fault/fault_util.h"

namespace loomtest {
namespace {

using namespace fault;

constexpr int kRanks = 3;
constexpr int kOps = 4;  // all-reduces before the first query (and 2 broadcasts)

struct Board {
  RankSlot ranks[kRanks];
  std::atomic<int> phase{0};
};

// Phases the test moves the ranks through; a rank's stage says it reached one.
enum : int { kReady = 1, kAhead = 2, kCaughtUp = 3, kDone = 4 };

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

bool waitPhase(Board* b, int phase) {
  return waitFor([&] { return b->phase.load() >= phase; }, 120000);
}

std::string rasRank(const ncclUniqueId& id, int rank, Board* b) {
  RankSlot& me = b->ranks[rank];
  ncclComm_t comm = nullptr;
  RANK_CHECK(ncclCommInitRank(&comm, kRanks, id, rank) == ncclSuccess, "init: %s",
             ncclGetLastError(nullptr));
  std::vector<float> v(1024, 1.0f);
  for (int it = 0; it < kOps; ++it)
    RANK_CHECK(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat32, ncclSum, comm, nullptr) ==
                   ncclSuccess, "all-reduce %d: %s", it, ncclGetLastError(comm));
  for (int it = 0; it < 2; ++it)
    RANK_CHECK(ncclBroadcast(v.data(), v.data(), v.size(), ncclFloat32, 0, comm, nullptr) ==
                   ncclSuccess, "broadcast: %s", ncclGetLastError(comm));
  RANK_CHECK(v[5] == 81.0f, "%g", v[5]);  // 3^4
  me.stage = kReady;
  RANK_CHECK(waitPhase(b, rank == 0 ? kAhead : kCaughtUp), "phase");
  // Rank 0 queues its fifth all-reduce while the others hold back: it waits in it.
  me.stage = kAhead;
  RANK_CHECK(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat32, ncclSum, comm, nullptr) ==
                 ncclSuccess, "fifth all-reduce: %s", ncclGetLastError(comm));
  RANK_CHECK(v[5] == 243.0f, "%g", v[5]);
  me.stage = kCaughtUp;
  RANK_CHECK(waitPhase(b, kDone), "phase");
  ncclCommAbort(comm);  // a peer may have been killed
  return "";
}

// A RAS client: connects to the port and sends `text`; what comes back until the server
// closes. A server that says nothing within a second to the handshake is a stopped
// process's (the port is shared): like ncclras, connect again.
std::string ask(int port, const std::string& text, bool handshake = true) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(fd);
      sleepMs(20);
      continue;
    }
    timeval tv{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string out;
    char buf[4096];
    if (handshake) {
      const char hello[] = "CLIENT PROTOCOL 2\n";
      if (send(fd, hello, sizeof(hello) - 1, MSG_NOSIGNAL) < 0) {
        close(fd);
        continue;
      }
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) {  // no answer within a second
        close(fd);
        continue;
      }
      out.assign(buf, n);
    }
    tv.tv_sec = 30;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    send(fd, text.data(), text.size(), MSG_NOSIGNAL);
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, n);
    close(fd);
    return out;
  }
  return "no server answered";
}

bool has(const std::string& out, const std::string& s) { return out.find(s) != std::string::npos; }

std::string row(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string row(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

TEST(RasQuery, AnswersNcclsProtocolForAJobOfProcesses) {
  const int port = freePort();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  EnvGuard ras("NCCL_RAS_ADDR", addr.c_str());
  EnvGuard enable("NCCL_RAS_ENABLE", nullptr);
  SharedBoard<Board> b;
  LateId id;
  std::vector<Child> kids(kRanks);
  for (int r = 0; r < kRanks; ++r) kids[r] = forkChild([&, r] { return rasRank(id, r, &*b); });
  struct Cleanup {  // whatever fails, no rank is left behind
    std::vector<Child>& kids;
    ~Cleanup() {
      for (Child& k : kids)
        if (k.fd >= 0) {
          kill(k.pid, SIGKILL);
          reapKilled(k);
        }
    }
  } cleanup{kids};
  ASSERT_EQ(id.make(), ncclSuccess);
  auto stageAll = [&](int s, std::vector<int> ranks) {
    return waitFor([&] {
      for (int r : ranks)
        if (b->ranks[r].stage.load() < s) return false;
      return true;
    }, 60000);
  };
  ASSERT_TRUE(stageAll(kReady, {0, 1, 2})) << "the ranks never got ready";

  // A healthy job: NCCL's handshake, preamble, job summary and one RUNNING communicator.
  std::string out = ask(port, "STATUS\n");
  printf("%s", out.c_str());
  EXPECT_EQ(out.rfind("SERVER PROTOCOL 2\nNCCL version 2.28.9+loom.", 0), 0u) << out;
  EXPECT_TRUE(has(out, "\nJob summary\n===========\n\n"
                       "  Nodes  Processes         GPUs  Processes     GPUs\n"
                       "(total)   per node  per process    (total)  (total)\n" +
                           row("%7d  %9d  %11d  %9d  %7d\n", 1, 3, 0, 3, 0)))
      << out;
  EXPECT_TRUE(has(out, "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
                       "    #  in group  per comm  per node  per comm  in group\n" +
                           row("%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s\n", 0, 1, 1, "3", 3, 3,
                               "RUNNING", "OK")))
      << out;
  EXPECT_TRUE(has(out, "\nErrors\n======\n\nWarnings\n========\n\n")) << out;

  // JSON: a valid document with every rank's counts.
  std::string json = ask(port, "SET FORMAT json\nSTATUS\n");
  ASSERT_EQ(json.rfind("SERVER PROTOCOL 2\nOK\n{", 0), 0u) << json;
  std::string doc = json.substr(json.find('{'));
  char path[] = "/tmp/loom-ras-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, doc.data(), doc.size()), static_cast<ssize_t>(doc.size()));
  close(fd);
  int rc = -1;
  std::string counts = runTool(std::string("python3 -c 'import json,sys\n"
                                           "d=json.load(open(sys.argv[1]))\n"
                                           "c=d[\"communicators\"][0]\n"
                                           "print(d[\"communicators_count\"], c[\"size\"], c[\"ranks_count\"], c[\"missing_ranks_count\"])\n"
                                           "for r in c[\"ranks\"]: print(r[\"rank\"], r[\"pid\"], r[\"status\"][\"init_state\"], "
                                           "r[\"collective_counts\"][\"AllReduce\"], r[\"collective_counts\"][\"Broadcast\"], "
                                           "r[\"collective_counts\"][\"Reduce\"])' ") + path, &rc);
  unlink(path);
  EXPECT_EQ(rc, 0) << counts << doc;
  EXPECT_EQ(counts, row("1 3 3 0\n0 %d 0 4 2 0\n1 %d 0 4 2 0\n2 %d 0 4 2 0\n", kids[0].pid,
                        kids[1].pid, kids[2].pid)) << doc;

  // Bad commands get NCCL's errors and the connection stays; lower case is fine.
  out = ask(port, "timeout abc\nSET FORMAT xml\nbogus\nverbose status\n", false);
  EXPECT_EQ(out.rfind("ERROR: Invalid timeout value abc\nERROR: Invalid format xml\n"
                      "ERROR: Unknown command bogus\nNCCL version ", 0), 0u) << out;
  // A line longer than NCCL's buffer ends the connection with nothing said.
  EXPECT_EQ(ask(port, std::string(2000, 'x'), false), "");

  // Rank 0 in its fifth all-reduce, the others not yet: MISMATCH, and who is ahead.
  b->phase = kAhead;
  ASSERT_TRUE(stageAll(kAhead, {0}));
  sleepMs(100);  // into the call
  out = ask(port, "STATUS\n");
  printf("%s", out.c_str());
  EXPECT_TRUE(has(out, row("%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s\n", 0, 1, 1, "3", 3, 3,
                           "RUNNING", "MISMATCH"))) << out;
  EXPECT_TRUE(has(out, ") MISMATCH\n  Communicator ranks have different AllReduce operation counts\n"
                       "  2 ranks have launched up to operation 4\n")) << out;
  EXPECT_TRUE(has(out, "  Rank 0 has launched up to operation 5 -- GPU ")) << out;
  EXPECT_TRUE(has(out, row("managed by process %d on node ", kids[0].pid))) << out;

  // They catch up; then rank 2's process stops: its data is missing, after a time-out.
  b->phase = kCaughtUp;
  ASSERT_TRUE(stageAll(kCaughtUp, {0, 1, 2}));
  ASSERT_EQ(kill(kids[2].pid, SIGSTOP), 0);
  out = ask(port, "TIMEOUT 1\nSTATUS\n");
  printf("%s", out.c_str());
  EXPECT_TRUE(has(out, row("%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s\n", 0, 1, 1, "2", 3, 2,
                           "RUNNING", "INCOMPLETE"))) << out;
  EXPECT_TRUE(has(out, row("INCOMPLETE\n  Missing communicator data from 1 job process\n"
                           "  Process %d on node ", kids[2].pid))) << out;
  EXPECT_TRUE(has(out, ") INCOMPLETE\n  Missing communicator data from 1 rank\n")) << out;
  EXPECT_TRUE(has(out, "TIMEOUT\n  Encountered 1 communication timeout while gathering "
                       "communicator data\n")) << out;

  // Killed (and reaped): dead, not late.
  kill(kids[2].pid, SIGKILL);
  reapKilled(kids[2]);
  out = ask(port, "STATUS\n");
  printf("%s", out.c_str());
  EXPECT_TRUE(has(out, row("DEAD\n  1 job process is considered dead (unreachable via the RAS "
                           "network)\n  Process %d on node ", kids[2].pid))) << out;
  EXPECT_FALSE(has(out, "TIMEOUT\n")) << out;  // refused at once, not waited for
  b->phase = kDone;
  for (int r = 0; r < 2; ++r) EXPECT_EQ(waitChild(kids[r], 60), "") << "rank " << r;
}

// Three processes A, B, C: a world communicator, P = {A, B} and Q = {B, C}; B then destroys
// its rank of P. Asked at A's own RAS port, A still reaches B (through the world
// communicator if P's channel refuses), sees P's missing rank as NOCOMM (B answered without
// it), and sees Q, which A is not in, through B's and C's answers.
struct ThreeBoard {
  RankSlot ranks[3];
  std::atomic<int> phase{0};
  ncclUniqueId ids[2];  // P's and Q's, made by A and B
  std::atomic<int> idsReady{0};
  int ports[3];  // each process's RAS port
};

std::string threeRank(const ncclUniqueId& world, int me, ThreeBoard* b) {
  const std::string addr = "127.0.0.1:" + std::to_string(b->ports[me]);  // a port of its own
  setenv("NCCL_RAS_ADDR", addr.c_str(), 1);
  ncclComm_t w = nullptr, sub = nullptr, sub2 = nullptr;
  RANK_CHECK(ncclCommInitRank(&w, 3, world, me) == ncclSuccess, "%s", ncclGetLastError(nullptr));
  if (me < 2) {  // A makes P's id, B makes Q's
    ncclUniqueId id;
    RANK_CHECK(ncclGetUniqueId(&id) == ncclSuccess, "id");
    b->ids[me] = id;
    b->idsReady.fetch_add(1);
  }
  RANK_CHECK(waitFor([&] { return b->idsReady.load() == 2; }, 60000), "ids");
  if (me <= 1) RANK_CHECK(ncclCommInitRank(&sub, 2, b->ids[0], me) == ncclSuccess, "P");
  if (me >= 1) RANK_CHECK(ncclCommInitRank(&sub2, 2, b->ids[1], me - 1) == ncclSuccess, "Q");
  std::vector<float> v(64, 1.0f);
  RANK_CHECK(ncclAllReduce(v.data(), v.data(), 64, ncclFloat32, ncclSum, w, nullptr) == ncclSuccess, "W");
  if (sub2) RANK_CHECK(ncclBroadcast(v.data(), v.data(), 64, ncclFloat32, 0, sub2, nullptr) == ncclSuccess, "Q");
  if (me == 1) ncclCommDestroy(sub), sub = nullptr;  // B leaves P
  b->ranks[me].stage = kReady;
  RANK_CHECK(waitFor([&] { return b->phase.load() >= kDone; }, 120000), "phase");
  for (ncclComm_t c : {w, sub, sub2})
    if (c) ncclCommAbort(c);
  return "";
}

TEST(RasQuery, PeersAreReachedThroughAnyCommunicatorAndTheirsAreSeen) {
  SharedBoard<ThreeBoard> b;
  for (int& p : b->ports) p = freePort();
  LateId id;
  std::vector<Child> kids(3);
  for (int r = 0; r < 3; ++r) kids[r] = forkChild([&, r] { return threeRank(id, r, &*b); });
  struct Cleanup {
    std::vector<Child>& kids;
    ~Cleanup() {
      for (Child& k : kids)
        if (k.fd >= 0) {
          kill(k.pid, SIGKILL);
          reapKilled(k);
        }
    }
  } cleanup{kids};
  ASSERT_EQ(id.make(), ncclSuccess);
  ASSERT_TRUE(waitFor([&] {
    for (auto& s : b->ranks)
      if (s.stage.load() < kReady) return false;
    return true;
  }, 60000)) << "the ranks never got ready";
  std::string json = ask(b->ports[0], "SET FORMAT json\nSTATUS\n");  // A's port
  std::string doc = json.substr(std::min(json.find('{'), json.size()));
  char path[] = "/tmp/loom-ras-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, doc.data(), doc.size()), static_cast<ssize_t>(doc.size()));
  close(fd);
  int rc = -1;
  // Per communicator, by size and pids: its ranks' pids and its missing ranks' pid and
  // whether their process did not answer.
  std::string comms = runTool(std::string("python3 -c 'import json,sys\n"
                                          "d=json.load(open(sys.argv[1]))\n"
                                          "for c in sorted(d[\"communicators\"], key=lambda c: (-c[\"size\"], sorted(r[\"pid\"] for r in c[\"ranks\"]))):\n"
                                          " print(c[\"size\"], sorted(r[\"pid\"] for r in c[\"ranks\"]), "
                                          "[(m[\"pid\"], m[\"status\"][\"unresponsive\"]) for m in c[\"missing_ranks\"]])' ") + path, &rc);
  unlink(path);
  EXPECT_EQ(rc, 0) << comms << doc;
  const int A = kids[0].pid, B = kids[1].pid, C = kids[2].pid;
  std::vector<int> all{A, B, C}, bc{B, C};
  std::sort(all.begin(), all.end());
  std::sort(bc.begin(), bc.end());
  // W: every rank. P: A's rank only, B's missing though B answered (NOCOMM, not
  // unresponsive). Q: both ranks, seen through B's and C's answers. P and Q in the order
  // the script sorts them (by their ranks' pids).
  std::vector<std::pair<std::vector<int>, std::string>> pq{
      {{A}, row("2 [%d] [(%d, False)]\n", A, B)}, {bc, row("2 [%d, %d] []\n", bc[0], bc[1])}};
  std::sort(pq.begin(), pq.end());
  const std::string want = row("3 [%d, %d, %d] []\n", all[0], all[1], all[2]) + pq[0].second + pq[1].second;
  EXPECT_EQ(comms, want) << doc;
  b->phase = kDone;
  for (int r = 0; r < 3; ++r) EXPECT_EQ(waitChild(kids[r], 60), "") << "rank " << r;
}

// Two ranks of one communicator as threads of this process: one process, both ranks in
// its record, and nothing to ask anyone else.
TEST(RasQuery, RanksAsThreadsAreOneProcess) {
  ncclComm_t comms[2];
  int devs[2] = {-1, -1};
  ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess);
  std::vector<std::thread> t;
  for (int r = 0; r < 2; ++r)
    t.emplace_back([&, r] {
      std::vector<int> in(32, r), out(64);
      for (int i = 0; i < 3; ++i) ncclAllGather(in.data(), out.data(), 32, ncclInt32, comms[r], nullptr);
      ncclReduce(out.data(), out.data(), 64, ncclInt32, ncclSum, 1, comms[r], nullptr);
    });
  for (auto& th : t) th.join();
  loom::ras::JobView view;
  const loom::ras::Report& rep = view.gather(5);
  ASSERT_EQ(rep.processes.size(), 1u);
  EXPECT_TRUE(rep.processes[0].answered);
  EXPECT_EQ(rep.processes[0].pid, getpid());
  EXPECT_EQ(rep.timeouts, 0);
  const loom::ras::CommView* mine = nullptr;
  for (const auto& c : rep.comms)
    if (c.nranks == 2 && c.ranks.size() == 2 && c.ranks[0].collCounts[2] == 3) mine = &c;
  ASSERT_NE(mine, nullptr) << rep.comms.size() << " communicators";
  EXPECT_TRUE(mine->missing.empty());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(mine->ranks[r].rank, r);
    EXPECT_EQ(mine->ranks[r].initState, 0);
    EXPECT_EQ(mine->ranks[r].collCounts[1], 1u);  // Reduce
    EXPECT_EQ(mine->ranks[r].collCounts[4], 0u);  // AllReduce
  }
  ncclCommFinalize(comms[0]);
  loom::ras::JobView after;
  int seen = 0;
  for (const auto& c : after.gather(5).comms) {
    if (c.hash != mine->hash) continue;
    ++seen;
    EXPECT_TRUE(c.ranks[0].finalizeCalled && !c.ranks[1].finalizeCalled);
  }
  EXPECT_EQ(seen, 1);
  for (ncclComm_t c : comms) ncclCommDestroy(c);
}

// A RAS query reads the communicators of the process while their ranks run collectives and
// destroy them (the RAS thread's reads against the ranks' writes: run under TSan too).
TEST(RasQuery, ReportsWhileRanksRunAndGo) {
  constexpr int kIters = 200;
  ncclComm_t comms[2];
  int devs[2] = {-1, -1};
  ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess);
  std::atomic<int> running{2};
  std::vector<std::thread> t;
  for (int r = 0; r < 2; ++r)
    t.emplace_back([&, r] {
      std::vector<float> v(256, 1.0f);
      for (int i = 0; i < kIters; ++i) ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat32, ncclSum, comms[r], nullptr);
      if (r == 0) ncclCommFinalize(comms[r]);
      ncclCommDestroy(comms[r]);
      running.fetch_sub(1);
    });
  uint64_t last[2] = {0, 0};
  int looks = 0;
  bool monotonic = true, bounded = true;
  while (running.load() > 0 || looks < 3) {
    loom::ras::JobView view;
    for (const auto& c : view.gather(1).comms)
      for (const auto& k : c.ranks) {
        if (c.nranks != 2) continue;  // this test's communicator (no other lives here now)
        monotonic &= k.collCounts[4] >= last[k.rank];
        bounded &= k.collCounts[4] <= kIters;
        last[k.rank] = k.collCounts[4];
      }
    ++looks;
  }
  for (auto& th : t) th.join();
  EXPECT_TRUE(monotonic);
  EXPECT_TRUE(bounded);
  EXPECT_GT(looks, 3);
  // Gone with their destroy.
  loom::ras::JobView after;
  for (const auto& c : after.gather(1).comms) EXPECT_NE(c.nranks, 2);
}

// What a process answers a peer: every field survives the wire; anything cut short, or
// saying more than it carries, is refused.
TEST(RasWire, RoundTripsAndRefusesWhatIsMalformed) {
  loom::ras::ProcessRecord p;
  p.node = "10.1.2.3";
  p.pid = 4242;
  p.hostHash = 0x1111222233334444ull;
  p.pidNs = 0xf00;
  p.cudaDevs = 0x5;
  loom::ras::CommRecord c;
  c.hash = 0xae94423cfbb2ef4aull;
  c.secondary[0] = 7;
  c.secondary[1] = 8;
  c.nranks = 4;
  for (int r : {0, 2}) {
    loom::ras::RankRecord k;
    k.rank = r;
    k.cudaDev = r;
    k.initState = r == 2 ? 7 : 0;
    k.asyncError = r == 2 ? 6 : 0;
    k.finalizeCalled = r == 0;
    k.abortFlag = r == 2;
    for (int i = 0; i < loom::ras::kRasColls; ++i) k.collCounts[i] = 1000u * r + i;
    c.ranks.push_back(k);
  }
  p.comms.push_back(c);
  const std::string bytes = loom::ras::encodeProcess(p);
  loom::ras::ProcessRecord q;
  ASSERT_TRUE(loom::ras::decodeProcess(bytes, &q));
  EXPECT_EQ(q.node, p.node);
  EXPECT_EQ(q.pid, p.pid);
  EXPECT_EQ(q.hostHash, p.hostHash);
  EXPECT_EQ(q.pidNs, p.pidNs);
  EXPECT_EQ(q.cudaDevs, p.cudaDevs);
  ASSERT_EQ(q.comms.size(), 1u);
  EXPECT_EQ(q.comms[0].hash, c.hash);
  EXPECT_EQ(q.comms[0].secondary[1], 8u);
  ASSERT_EQ(q.comms[0].ranks.size(), 2u);
  const loom::ras::RankRecord& k = q.comms[0].ranks[1];
  EXPECT_EQ(k.rank, 2);
  EXPECT_EQ(k.initState, 7);
  EXPECT_EQ(k.asyncError, 6);
  EXPECT_TRUE(k.abortFlag && !k.finalizeCalled && !k.destroyFlag);
  EXPECT_TRUE(q.comms[0].ranks[0].finalizeCalled);
  EXPECT_EQ(k.collCounts[4], 2004u);
  EXPECT_EQ(loom::ras::encodeProcess(q), bytes);
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(loom::ras::decodeProcess(std::string_view(bytes).substr(0, n), &q)) << n;
  EXPECT_FALSE(loom::ras::decodeProcess(bytes + "x", &q));
  p.comms[0].ranks[1].rank = 4;  // not a rank of a 4-rank communicator
  EXPECT_FALSE(loom::ras::decodeProcess(loom::ras::encodeProcess(p), &q));
}

// NCCL_RAS_ENABLE other than 1: no listener (in a process of its own: one listener per
// process). No value of the RAS knobs fails an init or a query (NCCL reads them with
// strtoll): a factor of "1.5" is 1.
TEST(RasQuery, KnobsAreReadAsNcclReadsThem) {
  const int port = freePort();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  EnvGuard ras("NCCL_RAS_ADDR", addr.c_str());
  EnvGuard factor("NCCL_RAS_TIMEOUT_FACTOR", "1.5");
  for (const char* enable : {"0", "2", "yes", "1", "0x1"}) {
    EnvGuard e("NCCL_RAS_ENABLE", enable);
    const bool on = strtoll(enable, nullptr, 0) == 1;
    Child c = forkChild([&]() -> std::string {
      ncclComm_t comm;
      int dev = -1;
      RANK_CHECK(ncclCommInitAll(&comm, 1, &dev) == ncclSuccess, "%s", ncclGetLastError(nullptr));
      std::string at = loom::ras::serverAddress();
      std::string out = on ? ask(port, "STATUS\n") : "";
      ncclCommDestroy(comm);
      RANK_CHECK(at == (on ? addr : ""), "NCCL_RAS_ENABLE=%s: listening at '%s'", enable, at.c_str());
      RANK_CHECK(!on || out.find(row("%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s\n", 0, 1, 1, "1", 1, 1,
                                     "RUNNING", "OK")) != std::string::npos, "%s", out.c_str());
      return "";
    });
    EXPECT_EQ(waitChild(c, 60), "") << "NCCL_RAS_ENABLE=" << enable;
  }
}

}  // namespace
}  // namespace loomtest
