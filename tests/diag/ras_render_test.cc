// The RAS report renderer against NCCL 2.28.9's bytes: each test builds a gathered job view
// and compares the whole text (or JSON document) with what NCCL sends for that state, so a
// wrong width, order, grouping or outlier decision fails. JSON is also parsed by python3.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "api/ras_report.h"

namespace loomtest {
namespace {

using loom::ras::CommView;
using loom::ras::MissingRank;
using loom::ras::ProcessView;
using loom::ras::RankView;
using loom::ras::Report;

ProcessView proc(const char* node, int pid, uint64_t cudaDevs, bool answered = true, bool dead = false) {
  ProcessView p;
  p.node = node;
  p.pid = pid;
  p.cudaDevs = p.nvmlDevs = cudaDevs;
  p.answered = answered;
  p.dead = dead;
  return p;
}

RankView rank(int r, int process, int dev) {
  RankView v;
  v.rank = r;
  v.process = process;
  v.cudaDev = v.nvmlDev = dev;
  return v;
}

MissingRank missing(int r, int process, int dev, bool unresponsive) {
  MissingRank m;
  m.rank = r;
  m.process = process;
  m.cudaDev = m.nvmlDev = dev;
  m.unresponsive = unresponsive;
  return m;
}

CommView comm(uint64_t hash, int nranks, std::vector<RankView> ranks, std::vector<MissingRank> gone = {}) {
  CommView c;
  c.hash = hash;
  c.nranks = nranks;
  c.ranks = std::move(ranks);
  c.missing = std::move(gone);
  return c;
}

// NCCL 2.28.9 built with CUDA 12.9, as in the spec's healthy example.
Report job(std::vector<ProcessView> procs, std::vector<CommView> comms = {}) {
  Report r;
  r.ncclMajor = 2, r.ncclMinor = 28, r.ncclPatch = 9;
  r.cudaMajor = 12, r.cudaMinor = 9;
  r.cudaRuntime = 12090, r.cudaDriver = 12080;
  r.processes = std::move(procs);
  r.comms = std::move(comms);
  r.collectSec = 0.001;
  return r;
}

// n processes on one node, pids base.., one GPU each (device i); ranks i -> process i.
std::vector<ProcessView> oneNode(int n, int basePid, const char* node = "10.0.0.1") {
  std::vector<ProcessView> procs;
  for (int i = 0; i < n; ++i) procs.push_back(proc(node, basePid + i, uint64_t{1} << i));
  return procs;
}

std::vector<RankView> ranksOnProcesses(int n) {
  std::vector<RankView> ranks;
  for (int i = 0; i < n; ++i) ranks.push_back(rank(i, i, i));
  return ranks;
}

std::string body(const Report& r, bool verbose = false) { return loom::ras::renderTextBody(r, verbose); }

int countOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// python3's json.tool on the document: 0 when it parses.
int pythonJsonCheck(const std::string& doc) {
  char path[] = "/tmp/ras_render_test_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return -1;
  bool written = write(fd, doc.data(), doc.size()) == static_cast<ssize_t>(doc.size());
  close(fd);
  int rc = written ? std::system(("python3 -m json.tool " + std::string(path) + " >/dev/null 2>&1").c_str())
                   : -1;
  unlink(path);
  return rc;
}

constexpr const char* kTableHeader =
    "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
    "    #  in group  per comm  per node  per comm  in group\n";

// The spec's complete healthy example (1 node, 8 processes, 1 GPU each); the head is sent
// at once and ends at "Communicators...", the body completes that line once gathered.
TEST(RasRender, HealthyOneNodeJobIsNcclsExampleByteForByte) {
  Report r = job(oneNode(8, 1000), {comm(0x42, 8, ranksOnProcesses(8))});
  std::string expected =
      "NCCL version 2.28.9 compiled with CUDA 12.9\n"
      "CUDA runtime version 12090, driver version 12080\n"
      "\n"
      "Job summary\n"
      "===========\n"
      "\n"
      "  Nodes  Processes         GPUs  Processes     GPUs\n"
      "(total)   per node  per process    (total)  (total)\n"
      "      1          8            1          8        8\n"
      "\n"
      "Communicators... (0.001s)\n"
      "=============\n"
      "\n"
      "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
      "    #  in group  per comm  per node  per comm  in group\n"
      "    0         1         1         8         8         8   RUNNING      OK\n"
      "\n"
      "Errors\n"
      "======\n"
      "\n"
      "Warnings\n"
      "========\n"
      "\n";
  size_t cut = expected.find(" (0.001s)");
  EXPECT_EQ(loom::ras::renderTextHead(r, false), expected.substr(0, cut));
  EXPECT_EQ(body(r), expected.substr(cut));
}

TEST(RasRender, PreambleCarriesSuffixAndUnknownCudaVersions) {
  Report r = job({});
  r.ncclSuffix = "+loom";
  r.cudaRuntime = r.cudaDriver = -1;
  std::string head = loom::ras::renderTextHead(r, false);
  EXPECT_EQ(head.substr(0, head.find("Job summary")),
            "NCCL version 2.28.9+loom compiled with CUDA 12.9\n"
            "CUDA runtime version -1, driver version -1\n\n");
}

TEST(RasRender, TwoNodesWithUnevenProcessesNameTheOutlierNode) {
  std::vector<ProcessView> procs = {proc("10.0.0.2", 300, 0x1), proc("10.0.0.1", 201, 0x2),
                                    proc("10.0.0.1", 200, 0x1)};
  EXPECT_EQ(loom::ras::renderTextHead(job(procs), false),
            "NCCL version 2.28.9 compiled with CUDA 12.9\n"
            "CUDA runtime version 12090, driver version 12080\n"
            "\n"
            "Job summary\n"
            "===========\n"
            "\n"
            "  Nodes  Processes         GPUs\n"
            "          per node  per process\n"
            "      1          2            1\n"
            "      1          1            1\n"
            "\n"
            "  Nodes  Processes         GPUs\n"
            "(total)    (total)      (total)\n"
            "      2          3            3\n"
            "\n"
            "The outlier node:\n"
            "  Node 10.0.0.2 running process 300\n"
            "\n"
            "Communicators...");
}

// Outlier nodes are listed in address order (10.0.0.3 before 10.0.0.10, as NCCL compares
// binary addresses), each with its own pids (NCCL 2.28.9 would print the job's first two
// pids, 20,90, for both). Two of five nodes are outliers only in VERBOSE STATUS (< 50%),
// not in STATUS (> 25%).
TEST(RasRender, OutlierNodesListTheirOwnPidsInAddressOrderOnlyWhenVerbose) {
  std::vector<ProcessView> procs = {proc("10.0.0.9", 90, 0x1),  proc("10.0.0.10", 101, 0x2),
                                    proc("10.0.0.10", 100, 0x1), proc("10.0.0.11", 110, 0x1),
                                    proc("10.0.0.2", 20, 0x1),  proc("10.0.0.3", 31, 0x2),
                                    proc("10.0.0.3", 30, 0x1)};
  std::string summary =
      "Job summary\n"
      "===========\n"
      "\n"
      "  Nodes  Processes         GPUs\n"
      "          per node  per process\n"
      "      3          1            1\n"
      "      2          2            1\n"
      "\n"
      "  Nodes  Processes         GPUs\n"
      "(total)    (total)      (total)\n"
      "      5          7            7\n";
  std::string quiet = loom::ras::renderTextHead(job(procs), false);
  EXPECT_EQ(quiet.substr(quiet.find("Job summary")), summary + "\nCommunicators...");
  std::string verbose = loom::ras::renderTextHead(job(procs), true);
  EXPECT_EQ(verbose.substr(verbose.find("Job summary")),
            summary +
                "\n"
                "The outlier nodes:\n"
                "  Node 10.0.0.3 running processes 30,31\n"
                "  Node 10.0.0.10 running processes 100,101\n"
                "\n"
                "Communicators...");
}

// With GPUs per process uneven too, NCCL names no outlier node, even a lone one.
TEST(RasRender, InconsistentGpusPerProcessGetTheirOwnTable) {
  // Loom also runs without GPUs: the process with none counts 0.
  std::vector<ProcessView> procs = {proc("10.0.0.1", 10, 0x3), proc("10.0.0.1", 11, 0xc),
                                    proc("10.0.0.2", 20, 0x1), proc("10.0.0.3", 30, 0x0)};
  std::string head = loom::ras::renderTextHead(job(procs), true);
  EXPECT_EQ(head.substr(head.find("Job summary")),
            "Job summary\n"
            "===========\n"
            "\n"
            "  Nodes  Processes\n"
            "          per node\n"
            "      2          1\n"
            "      1          2\n"
            "\n"
            "         Processes         GPUs\n"
            "                    per process\n"
            "                 2            2\n"
            "                 1            1\n"
            "                 1            0\n"
            "\n"
            "  Nodes  Processes         GPUs\n"
            "(total)    (total)      (total)\n"
            "      3          4            5\n"
            "\n"
            "Communicators...");
}

TEST(RasRender, RankOfAProcessThatDidNotAnswerMakesTheCommIncomplete) {
  std::vector<ProcessView> procs = {proc("10.0.0.1", 101, 0x1), proc("10.0.0.1", 102, 0x2, /*answered=*/false),
                                    proc("10.0.0.1", 103, 0x8)};
  // Rank 3's process answered without it: NOCOMM, listed under MISMATCH, not INCOMPLETE.
  Report r = job(procs, {comm(0xaa, 4, {rank(0, 0, 0)},
                              {missing(1, 1, 1, true), missing(2, -1, 2, true), missing(3, 2, 3, false)})});
  // The summary counts the process that did not answer.
  std::string head = loom::ras::renderTextHead(r, false);
  EXPECT_NE(head.find("      1          3            1          3        3\n"), std::string::npos) << head;
  EXPECT_EQ(body(r),
            " (0.001s)\n"
            "=============\n"
            "\n" +
                std::string(kTableHeader) +
                "    0         1         1         1         4         1   RUNNING  INCOMPLETE,MISMATCH\n"
                "\n"
                "Errors\n"
                "======\n"
                "\n"
                "INCOMPLETE\n"
                "  Missing communicator data from 1 job process\n"
                "  Process 102 on node 10.0.0.1 managing GPU 1\n"
                "\n"
                "#0-0 (00000000000000aa) INCOMPLETE\n"
                "  Missing communicator data from 2 ranks\n"
                "  Rank 1 -- GPU 1 managed by process 102 on node 10.0.0.1\n"
                "  Rank 2 -- [process information not found]\n"
                "\n"
                "Warnings\n"
                "========\n"
                "\n"
                "#0-0 (00000000000000aa) MISMATCH\n"
                "  Communicator ranks have different status\n"
                "  Rank 0 has status RUNNING -- GPU 0 managed by process 101 on node 10.0.0.1\n"
                "  Rank 3 has status NOCOMM -- GPU 3 managed by process 103 on node 10.0.0.1\n");
}

// NCCL lists processes by binary address, then pid: IPv4 before IPv6, 10.0.0.9 before
// 10.0.0.10, fe80::9 before fe80::10, an unknown address last (printed empty, as NCCL does).
TEST(RasRender, MissingProcessesAreListedInAddressOrder) {
  std::vector<ProcessView> procs = {proc("10.0.0.1", 1, 0x1),           proc("fe80::10", 5, 0x1, false),
                                    proc("fe80::9", 6, 0x1, false),     proc("", 7, 0x1, false),
                                    proc("10.0.0.10", 4, 0x1, false),   proc("10.0.0.9", 3, 0x1, false),
                                    proc("::ffff:1.2.3.4", 8, 0x1, false), proc("10.0.0.9", 2, 0x1, false)};
  std::string b = body(job(procs));
  EXPECT_EQ(b.substr(b.find("INCOMPLETE"), b.find("Warnings") - b.find("INCOMPLETE")),
            "INCOMPLETE\n"
            "  Missing communicator data from 7 job processes\n"
            "  Process 2 on node 10.0.0.9 managing GPU 0\n"
            "  Process 3 on node 10.0.0.9 managing GPU 0\n"
            "  Process 4 on node 10.0.0.10 managing GPU 0\n"
            "  Process 8 on node ::ffff:1.2.3.4 managing GPU 0\n"
            "  Process 6 on node fe80::9 managing GPU 0\n"
            "  Process 5 on node fe80::10 managing GPU 0\n"
            "  Process 7 on node  managing GPU 0\n"
            "\n");
}

TEST(RasRender, RankMissingFromAnAnsweringProcessIsNocommAndMismatch) {
  Report r = job(oneNode(3, 10), {comm(0xbb, 3, {rank(0, 0, 0), rank(1, 1, 1)}, {missing(2, 2, 2, false)})});
  std::string expected =
      " (0.001s)\n"
      "=============\n"
      "\n" +
      std::string(kTableHeader) +
      "    0         1         1         2         3         2   RUNNING  MISMATCH\n"
      "\n"
      "Errors\n"
      "======\n"
      "\n"
      "Warnings\n"
      "========\n"
      "\n"
      "#0-0 (00000000000000bb) MISMATCH\n"
      "  Communicator ranks have different status\n"
      "  2 ranks have status RUNNING\n"
      "  Rank 2 has status NOCOMM -- GPU 2 managed by process 12 on node 10.0.0.1\n";
  EXPECT_EQ(body(r), expected);
  EXPECT_EQ(body(r, true), expected);  // 2 of 3 is not under half either
}

// ABORT outranks FINALIZE (ncclCommAbort also sets destroyFlag); single ranks of each
// status are listed, the most frequent status first, then the higher one.
TEST(RasRender, DifferentStatusesListHighestStatusFirst) {
  std::vector<RankView> ranks = ranksOnProcesses(3);
  ranks[1].finalizeCalled = true;
  ranks[2].abortFlag = ranks[2].destroyFlag = true;
  std::string b = body(job(oneNode(3, 10), {comm(0xbc, 3, ranks)}));
  EXPECT_NE(b.find("    0         1         1         3         3         3     ABORT  MISMATCH\n"), std::string::npos)
      << b;
  EXPECT_EQ(b.substr(b.find("Warnings")),
            "Warnings\n"
            "========\n"
            "\n"
            "#0-0 (00000000000000bc) MISMATCH\n"
            "  Communicator ranks have different status\n"
            "  Rank 2 has status ABORT -- GPU 2 managed by process 12 on node 10.0.0.1\n"
            "  Rank 1 has status FINALIZE -- GPU 1 managed by process 11 on node 10.0.0.1\n"
            "  Rank 0 has status RUNNING -- GPU 0 managed by process 10 on node 10.0.0.1\n");
}

TEST(RasRender, DifferentCollectiveCountsNameTheLaggingRanks) {
  std::vector<RankView> ranks = ranksOnProcesses(8);
  for (RankView& k : ranks) k.collCounts[0] = k.rank < 2 ? 0 : 3;                             // Broadcast
  for (RankView& k : ranks) k.collCounts[4] = k.rank == 5 ? 9 : k.rank == 7 ? 0 : 10;  // AllReduce
  std::string b = body(job(oneNode(8, 100), {comm(0xcc, 8, ranks)}));
  EXPECT_EQ(b,
            " (0.001s)\n"
            "=============\n"
            "\n" +
                std::string(kTableHeader) +
                "    0         1         1         8         8         8   RUNNING  MISMATCH\n"
                "\n"
                "Errors\n"
                "======\n"
                "\n"
                "Warnings\n"
                "========\n"
                "\n"
                "#0-0 (00000000000000cc) MISMATCH\n"
                "  Communicator ranks have different Broadcast operation counts\n"
                "  6 ranks have launched up to operation 3\n"
                "  2 ranks have not launched any operations\n"
                "  Rank 0 -- GPU 0 managed by process 100 on node 10.0.0.1\n"
                "  Rank 1 -- GPU 1 managed by process 101 on node 10.0.0.1\n"
                "\n"
                "  Communicator ranks have different AllReduce operation counts\n"
                "  6 ranks have launched up to operation 10\n"
                "  Rank 5 has launched up to operation 9 -- GPU 5 managed by process 105 on node 10.0.0.1\n"
                "  Rank 7 has not launched any operations -- GPU 7 managed by process 107 on node 10.0.0.1\n"
                "\n");
}

TEST(RasRender, InitAndAsyncErrorsAreBrokenDownByKind) {
  std::vector<RankView> ranks = ranksOnProcesses(4);
  ranks[0].initState = 5, ranks[0].asyncError = 6;
  ranks[1].initState = 5;
  ranks[2].initState = 2, ranks[2].nvmlDev = 6;
  ranks[3].initState = 7, ranks[3].asyncError = 1;  // still initialising: no init error
  std::string b = body(job(oneNode(4, 40), {comm(0xdd, 4, ranks)}));
  EXPECT_EQ(b,
            " (0.001s)\n"
            "=============\n"
            "\n" +
                std::string(kTableHeader) +
                "    0         1         1         4         4         4      INIT   ERROR\n"
                "\n"
                "Errors\n"
                "======\n"
                "\n"
                "#0-0 (00000000000000dd) ERROR\n"
                "  Initialization errors on 3 ranks\n"
                "  2 ranks reported Invalid usage\n"
                "  Rank 0 -- GPU 0 managed by process 40 on node 10.0.0.1\n"
                "  Rank 1 -- GPU 1 managed by process 41 on node 10.0.0.1\n"
                "  Rank 2 reported System error -- GPU 2 (NVML 6) managed by process 42 on node 10.0.0.1\n"
                "  Asynchronous errors on 2 ranks\n"
                "  Rank 3 reported Unhandled CUDA error -- GPU 3 managed by process 43 on node 10.0.0.1\n"
                "  Rank 0 reported Remote process error -- GPU 0 managed by process 40 on node 10.0.0.1\n"
                "\n"
                "Warnings\n"
                "========\n"
                "\n");
}

// An asynchronous error alone, on a running communicator, is an ERROR too.
TEST(RasRender, AsyncErrorAloneIsAnError) {
  std::vector<RankView> ranks = ranksOnProcesses(2);
  ranks[1].asyncError = 3;
  std::string b = body(job(oneNode(2, 40), {comm(0xde, 2, ranks)}));
  EXPECT_EQ(b.substr(b.find("    0 ")),
            "    0         1         1         2         2         2   RUNNING   ERROR\n"
            "\n"
            "Errors\n"
            "======\n"
            "\n"
            "#0-0 (00000000000000de) ERROR\n"
            "  Asynchronous error on 1 rank\n"
            "  Rank 1 reported Internal error -- GPU 1 managed by process 41 on node 10.0.0.1\n"
            "\n"
            "Warnings\n"
            "========\n"
            "\n");
}

TEST(RasRender, DeadProcessIsReportedDeadAfterTheMissingOnes) {
  ProcessView gone = proc("10.0.0.2", 7, 0x3, /*answered=*/false, /*dead=*/true);
  gone.nvmlDevs = 0x30;
  MissingRank m1 = missing(1, 1, 0, true), m2 = missing(2, 1, 1, true);
  m1.nvmlDev = 4, m2.nvmlDev = 5;
  // Also one that did not answer and is not dead: missing processes come before dead ones.
  Report r = job({proc("10.0.0.1", 1, 0x1), gone, proc("10.0.0.3", 9, 0x1, false)},
                 {comm(0xee, 3, {rank(0, 0, 0)}, {m1, m2})});
  EXPECT_EQ(body(r),
            " (0.001s)\n"
            "=============\n"
            "\n" +
                std::string(kTableHeader) +
                "    0         1         1         1         3         1   RUNNING  INCOMPLETE\n"
                "\n"
                "Errors\n"
                "======\n"
                "\n"
                "INCOMPLETE\n"
                "  Missing communicator data from 1 job process\n"
                "  Process 9 on node 10.0.0.3 managing GPU 0\n"
                "\n"
                "DEAD\n"
                "  1 job process is considered dead (unreachable via the RAS network)\n"
                "  Process 7 on node 10.0.0.2 managing GPUs 0,1 (NVML 4,5)\n"
                "\n"
                "#0-0 (00000000000000ee) INCOMPLETE\n"
                "  Missing communicator data from 2 ranks\n"
                "  Rank 1 -- GPU 0 (NVML 4) managed by process 7 on node 10.0.0.2\n"
                "  Rank 2 -- GPU 1 (NVML 5) managed by process 7 on node 10.0.0.2\n"
                "\n"
                "Warnings\n"
                "========\n"
                "\n");
}

TEST(RasRender, TimeoutsAreAWarning) {
  Report r = job(oneNode(2, 10), {comm(0x1, 2, ranksOnProcesses(2))});
  r.timeouts = 1;
  std::string one = body(r);
  EXPECT_EQ(one.substr(one.find("Warnings")),
            "Warnings\n========\n\nTIMEOUT\n  Encountered 1 communication timeout while gathering communicator data\n\n");
  r.timeouts = 3;
  std::string three = body(r);
  EXPECT_EQ(three.substr(three.find("Warnings")),
            "Warnings\n========\n\nTIMEOUT\n  Encountered 3 communication timeouts while gathering communicator data\n\n");
}

// Communicators sorted by size, nodes, status, errors (all descending), then responding
// ranks ascending; groups share the first four. A group's ranks per node span all its
// comms, and its ranks are the distinct (process, device) pairs.
TEST(RasRender, CommunicatorsAreSortedAndGroupedAsNccl) {
  std::vector<ProcessView> procs = oneNode(8, 1);  // indexes 0-7: pids 1-8, devices 0-7
  for (ProcessView& p : oneNode(8, 11, "10.0.0.2")) procs.push_back(p);  // 8-15: pids 11-18
  auto ranksOn = [](std::vector<int> processes) {
    std::vector<RankView> ranks;
    for (size_t i = 0; i < processes.size(); ++i)
      ranks.push_back(rank(static_cast<int>(i), processes[i], processes[i] % 8));
    return ranks;
  };
  std::vector<CommView> comms;
  comms.push_back(comm(0x1, 4, ranksOn({0, 1, 2, 3})));  // one node
  comms.push_back(comm(0x2, 4, ranksOn({0, 1, 8, 9})));
  comms.push_back(comm(0x3, 4, ranksOn({4, 5, 12, 13})));
  for (RankView& k : comms.back().ranks) k.finalizeCalled = true;
  comms.push_back(comm(0x4, 4, ranksOn({0, 1, 8, 9})));
  for (RankView& k : comms.back().ranks) k.collCounts[4] = k.rank == 3 ? 1 : 2;
  comms.push_back(comm(0x5, 16, ranksOn({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})));
  // A missing rank in a communicator that is not the last one (NCCL 2.28.9 garbles the rest).
  comms.push_back(comm(0x6, 4, ranksOn({0, 1, 8}), {missing(3, 9, 1, false)}));
  comms.push_back(comm(0x7, 15, ranksOn({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14})));
  // Ranks alternate nodes (still 2 nodes); 0x2's GPUs 9, 1 and 8 here as other ranks.
  comms.push_back(comm(0x8, 4, ranksOn({9, 1, 8, 10})));
  EXPECT_EQ(body(job(procs, comms)),
            " (0.001s)\n"
            "=============\n"
            "\n" +
                std::string(kTableHeader) +
                "    0         1         2         8        16        16   RUNNING      OK\n"
                "    1         1         2       7-8        15        15   RUNNING      OK\n"
                "    2         1         2         2         4         4  FINALIZE      OK\n"
                "    3         2         2       1-2         4         4   RUNNING  MISMATCH\n"
                "    4         2         2       1-3         4         5   RUNNING      OK\n"
                "    5         1         1         4         4         4   RUNNING      OK\n"
                "\n"
                "Errors\n"
                "======\n"
                "\n"
                "Warnings\n"
                "========\n"
                "\n"
                "#3-0 (0000000000000006) MISMATCH\n"
                "  Communicator ranks have different status\n"
                "  3 ranks have status RUNNING\n"
                "  Rank 3 has status NOCOMM -- GPU 1 managed by process 12 on node 10.0.0.2\n"
                "#3-1 (0000000000000004) MISMATCH\n"
                "  Communicator ranks have different AllReduce operation counts\n"
                "  3 ranks have launched up to operation 2\n"
                "  Rank 3 has launched up to operation 1 -- GPU 1 managed by process 12 on node 10.0.0.2\n"
                "\n");
}

TEST(RasRender, NoCommunicatorsSaysSo) {
  Report r = job(oneNode(2, 10));
  r.collectSec = 0.0125;  // "%.3f" rounds the binary value, just above 0.0125, up
  EXPECT_EQ(body(r),
            " (0.013s)\n"
            "=============\n"
            "\n"
            "No communicator data collected!\n"
            "\n"
            "Errors\n"
            "======\n"
            "\n"
            "Warnings\n"
            "========\n"
            "\n");
}

// An n-rank comm where `late` ranks (the last ones) launched one AllReduce fewer: how many
// of its ranks are listed one by one.
int listedLaggards(int n, int late, bool verbose) {
  std::vector<RankView> ranks = ranksOnProcesses(n);
  for (RankView& k : ranks) k.collCounts[4] = k.rank >= n - late ? 1 : 2;
  std::vector<ProcessView> procs;
  for (int i = 0; i < n; ++i) procs.push_back(proc("10.0.0.1", 100 + i, 0x1));
  return countOf(body(job(procs, {comm(0x9, n, ranks)}), verbose), "  Rank ");
}

// n processes that did not answer (or are dead): how many are listed one by one.
int listedProcesses(int n, bool verbose, bool dead) {
  std::vector<ProcessView> procs = {proc("10.0.0.1", 1, 0x1)};
  for (int i = 0; i < n; ++i) procs.push_back(proc("10.0.0.2", 100 + i, 0x1, false, dead));
  return countOf(body(job(procs), verbose), "  Process ");
}

TEST(RasRender, OutliersAreListedByNcclsQuarterTenAndHalfRules) {
  // Of a communicator: STATUS lists a group of at most 10 and at most a quarter of its
  // ranks; VERBOSE STATUS one under half. A group of one is always listed.
  EXPECT_EQ(listedLaggards(8, 2, false), 2);
  EXPECT_EQ(listedLaggards(8, 3, false), 0);
  EXPECT_EQ(listedLaggards(12, 3, false), 3);  // exactly a quarter
  EXPECT_EQ(listedLaggards(10, 3, false), 0);
  EXPECT_EQ(listedLaggards(8, 3, true), 3);
  EXPECT_EQ(listedLaggards(8, 4, true), 0);  // 4 and 4: neither is under half
  EXPECT_EQ(listedLaggards(48, 10, false), 10);
  EXPECT_EQ(listedLaggards(48, 11, false), 0);
  EXPECT_EQ(listedLaggards(48, 11, true), 11);
  EXPECT_EQ(listedLaggards(2, 1, false), 2);  // 1 and 1: the majority is listed too
  // Of the job's processes (no total): STATUS lists at most 10, VERBOSE STATUS all.
  EXPECT_EQ(listedProcesses(10, false, false), 10);
  EXPECT_EQ(listedProcesses(11, false, false), 0);
  EXPECT_EQ(listedProcesses(11, true, false), 11);
  EXPECT_EQ(listedProcesses(11, false, true), 0);
  EXPECT_EQ(listedProcesses(11, true, true), 11);
  std::string quiet = body(job({proc("10.0.0.1", 1, 0x1), proc("10.0.0.2", 2, 0x1, false, true),
                                proc("10.0.0.2", 3, 0x1, false, true)}));
  EXPECT_NE(quiet.find("DEAD\n  2 job processes are considered dead (unreachable via the RAS network)\n"
                       "  Process 2 on node 10.0.0.2 managing GPU 0\n"
                       "  Process 3 on node 10.0.0.2 managing GPU 0\n\n"),
            std::string::npos)
      << quiet;
}

TEST(RasRender, JsonOfAHealthyCommunicatorIsNccls) {
  std::vector<RankView> ranks = ranksOnProcesses(2);
  ranks[0].collCounts[2] = 3, ranks[1].collCounts[2] = 3;
  ranks[1].collCounts[4] = 18446744073709551615ull;
  Report r = job(oneNode(2, 100), {comm(0xae94423cfbb2ef4a, 2, ranks)});
  r.comms[0].secondary[0] = 0x1234, r.comms[0].secondary[1] = 0xabc;
  r.timestamp = "2025-12-19 13:06:53";
  r.collectSec = 0.0125;
  std::string doc = loom::ras::renderJson(r);
  EXPECT_EQ(doc,
            "{\n"
            "  \"nccl_version\": \"2.28.9\",\n"
            "  \"cuda_runtime_version\": 12090,\n"
            "  \"cuda_driver_version\": 12080,\n"
            "  \"timestamp\": \"2025-12-19 13:06:53\",\n"
            "  \"communicators_count\": 1,\n"
            "  \"communicators\": [\n"
            "    {\n"
            "      \"hash\": \"0xae94423cfbb2ef4a\",\n"
            "      \"secondary_hash\": \"0x1234:0xabc\",\n"
            "      \"size\": 2,\n"
            "      \"ranks_count\": 2,\n"
            "      \"missing_ranks_count\": 0,\n"
            "      \"ranks\": [\n"
            "        {\n"
            "          \"rank\": 0,\n"
            "          \"host\": \"10.0.0.1\",\n"
            "          \"pid\": 100,\n"
            "          \"cuda_dev\": 0,\n"
            "          \"nvml_dev\": 0,\n"
            "          \"status\": {\n"
            "            \"init_state\": 0,\n"
            "            \"async_error\": 0,\n"
            "            \"finalize_called\": false,\n"
            "            \"destroy_flag\": false,\n"
            "            \"abort_flag\": false\n"
            "          },\n"
            "          \"collective_counts\": {\n"
            "            \"Broadcast\": 0,\n"
            "            \"Reduce\": 0,\n"
            "            \"AllGather\": 3,\n"
            "            \"ReduceScatter\": 0,\n"
            "            \"AllReduce\": 0\n"
            "          }\n"
            "        },\n"
            "        {\n"
            "          \"rank\": 1,\n"
            "          \"host\": \"10.0.0.1\",\n"
            "          \"pid\": 101,\n"
            "          \"cuda_dev\": 1,\n"
            "          \"nvml_dev\": 1,\n"
            "          \"status\": {\n"
            "            \"init_state\": 0,\n"
            "            \"async_error\": 0,\n"
            "            \"finalize_called\": false,\n"
            "            \"destroy_flag\": false,\n"
            "            \"abort_flag\": false\n"
            "          },\n"
            "          \"collective_counts\": {\n"
            "            \"Broadcast\": 0,\n"
            "            \"Reduce\": 0,\n"
            "            \"AllGather\": 3,\n"
            "            \"ReduceScatter\": 0,\n"
            "            \"AllReduce\": 18446744073709551615\n"
            "          }\n"
            "        }\n"
            "      ],\n"
            "      \"missing_ranks\": [\n"
            "\n"
            "      ]\n"
            "    }\n"
            "  ],\n"
            "  \"ras\": {\n"
            "    \"collection_time_sec\": 0.013,\n"
            "    \"timeouts_count\": 0\n"
            "  }\n"
            "}\n");
  EXPECT_EQ(pythonJsonCheck(doc), 0) << doc;
}

// Missing ranks carry the comma NCCL 2.28.9 leaves out after "nvml_dev" (so the document
// parses); a rank of no known process, or of one with no node, is "unknown" with pid -1.
TEST(RasRender, JsonWithMissingRanksIsValidAndInNcclsKeyOrder) {
  ProcessView noNode = proc("", 300, 0x4);
  Report r = job({proc("10.0.0.1", 100, 0x1), proc("10.0.0.2", 200, 0x2, false, true), noNode},
                 {comm(0x1, 4, {rank(0, 0, 0)},
                       {missing(1, 1, 1, true), missing(2, -1, 3, true), missing(3, 2, 2, false)}),
                  comm(0x2, 1, {rank(0, 0, 0)})});
  r.comms[0].ranks[0].abortFlag = r.comms[0].ranks[0].destroyFlag = true;
  r.comms[0].ranks[0].asyncError = 6;
  r.timeouts = 2;
  std::string doc = loom::ras::renderJson(r);
  std::string ranks0 =
      "        {\n"
      "          \"rank\": 0,\n"
      "          \"host\": \"10.0.0.1\",\n"
      "          \"pid\": 100,\n"
      "          \"cuda_dev\": 0,\n"
      "          \"nvml_dev\": 0,\n"
      "          \"status\": {\n"
      "            \"init_state\": 0,\n"
      "            \"async_error\": %ASYNC%,\n"
      "            \"finalize_called\": false,\n"
      "            \"destroy_flag\": %FLAG%,\n"
      "            \"abort_flag\": %FLAG%\n"
      "          },\n"
      "          \"collective_counts\": {\n"
      "            \"Broadcast\": 0,\n"
      "            \"Reduce\": 0,\n"
      "            \"AllGather\": 0,\n"
      "            \"ReduceScatter\": 0,\n"
      "            \"AllReduce\": 0\n"
      "          }\n"
      "        }\n";
  auto fill = [](std::string s, const char* async, const char* flag) {
    for (size_t at; (at = s.find("%ASYNC%")) != std::string::npos;) s.replace(at, 7, async);
    for (size_t at; (at = s.find("%FLAG%")) != std::string::npos;) s.replace(at, 6, flag);
    return s;
  };
  EXPECT_EQ(doc,
            "{\n"
            "  \"nccl_version\": \"2.28.9\",\n"
            "  \"cuda_runtime_version\": 12090,\n"
            "  \"cuda_driver_version\": 12080,\n"
            "  \"timestamp\": \"\",\n"
            "  \"communicators_count\": 2,\n"
            "  \"communicators\": [\n"
            "    {\n"
            "      \"hash\": \"0x1\",\n"
            "      \"secondary_hash\": \"0x0:0x0\",\n"
            "      \"size\": 4,\n"
            "      \"ranks_count\": 1,\n"
            "      \"missing_ranks_count\": 3,\n"
            "      \"ranks\": [\n" +
                fill(ranks0, "6", "true") +
                "      ],\n"
                "      \"missing_ranks\": [\n"
                "        {\n"
                "          \"rank\": 1,\n"
                "          \"host\": \"10.0.0.2\",\n"
                "          \"pid\": 200,\n"
                "          \"cuda_dev\": 1,\n"
                "          \"nvml_dev\": 1,\n"
                "          \"status\": {\n"
                "            \"unresponsive\": true,\n"
                "            \"considered_dead\": true\n"
                "          }\n"
                "        },\n"
                "        {\n"
                "          \"rank\": 2,\n"
                "          \"host\": \"unknown\",\n"
                "          \"pid\": -1,\n"
                "          \"cuda_dev\": 3,\n"
                "          \"nvml_dev\": 3,\n"
                "          \"status\": {\n"
                "            \"unresponsive\": true,\n"
                "            \"considered_dead\": false\n"
                "          }\n"
                "        },\n"
                "        {\n"
                "          \"rank\": 3,\n"
                "          \"host\": \"unknown\",\n"
                "          \"pid\": -1,\n"
                "          \"cuda_dev\": 2,\n"
                "          \"nvml_dev\": 2,\n"
                "          \"status\": {\n"
                "            \"unresponsive\": false,\n"
                "            \"considered_dead\": false\n"
                "          }\n"
                "        }\n"
                "      ]\n"
                "    },\n"
                "    {\n"
                "      \"hash\": \"0x2\",\n"
                "      \"secondary_hash\": \"0x0:0x0\",\n"
                "      \"size\": 1,\n"
                "      \"ranks_count\": 1,\n"
                "      \"missing_ranks_count\": 0,\n"
                "      \"ranks\": [\n" +
                fill(ranks0, "0", "false") +
                "      ],\n"
                "      \"missing_ranks\": [\n"
                "\n"
                "      ]\n"
                "    }\n"
                "  ],\n"
                "  \"ras\": {\n"
                "    \"collection_time_sec\": 0.001,\n"
                "    \"timeouts_count\": 2\n"
                "  }\n"
                "}\n");
  EXPECT_EQ(pythonJsonCheck(doc), 0) << doc;
  // The check has teeth: NCCL 2.28.9's form, without that comma, does not parse.
  std::string ncclForm = doc;
  size_t at = ncclForm.find("\"nvml_dev\": 1,\n          \"status\": {\n            \"unresponsive\"");
  ASSERT_NE(at, std::string::npos);
  ncclForm.erase(at + std::string("\"nvml_dev\": 1").size(), 1);
  EXPECT_NE(pythonJsonCheck(ncclForm), 0);
}

TEST(RasRender, JsonWithNoCommunicatorsParses) {
  Report r = job(oneNode(1, 5));
  r.timestamp = "2026-01-02 03:04:05";
  std::string doc = loom::ras::renderJson(r);
  EXPECT_NE(doc.find("  \"communicators_count\": 0,\n  \"communicators\": [\n\n  ],\n  \"ras\": {\n"),
            std::string::npos)
      << doc;
  EXPECT_EQ(pythonJsonCheck(doc), 0) << doc;
}

// Loom's host-memory ranks have no device (-1): a process without one "manages no GPU", and
// every such rank counts in "Ranks in group" (threads of one process as ranks included),
// where NCCL counts distinct (process, GPU) pairs.
TEST(RasRender, HostRanksWithoutADevice) {
  Report r = job({proc("10.0.0.1", 100, 0), proc("10.0.0.1", 101, 0, false)},
                 {comm(0xab, 3, {rank(0, 0, -1), rank(1, 0, -1)}, {missing(2, 1, -1, true)})});
  const std::string body = loom::ras::renderTextBody(r, false);
  EXPECT_NE(body.find("    0         1         1         2         3         2   RUNNING  INCOMPLETE\n"),
            std::string::npos) << body;
  EXPECT_NE(body.find("  Missing communicator data from 1 job process\n"
                      "  Process 101 on node 10.0.0.1 managing no GPU\n"), std::string::npos) << body;
  EXPECT_NE(body.find("  Rank 2 -- GPU -1 managed by process 101 on node 10.0.0.1\n"), std::string::npos)
      << body;
}

}  // namespace
}  // namespace loomtest
