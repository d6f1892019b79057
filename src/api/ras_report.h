// NCCL's RAS queries (`ncclras`, `echo status | nc localhost 28028`): what one status
// report holds, and its rendering as NCCL 2.28 renders it (text for STATUS / VERBOSE
// STATUS, JSON after SET FORMAT json). Gathering it is ras_server.cc's; this is the part
// that turns a gathered job view into NCCL's bytes, a pure function tested without sockets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::ras {

// NCCL's collective order in RAS (its ncclFunc order): Broadcast, Reduce, AllGather,
// ReduceScatter, AllReduce.
constexpr int kRasColls = 5;
extern const char* const kRasCollNames[kRasColls];

// A process of the job: one that answered the query, or one the answering process knows
// (a rank of one of its communicators) that did not.
struct ProcessView {
  std::string node;   // the IP address of its bootstrap interface ("" unknown)
  int pid = -1;
  uint64_t cudaDevs = 0;  // bit d: the process has a rank on CUDA device d
  uint64_t nvmlDevs = 0;  // the same devices as NVML numbers them (Loom: = cudaDevs)
  bool answered = false;
  bool dead = false;  // known to be gone (a process of this host that no longer exists)
};

// A rank that answered, as NCCL's RAS reports it.
struct RankView {
  int rank = 0;
  int process = -1;  // index into Report::processes
  int cudaDev = -1, nvmlDev = -1;
  int initState = 0;   // ncclResult_t: 0 done, 7 (ncclInProgress) initialising, else its error
  int asyncError = 0;  // ncclResult_t
  bool finalizeCalled = false, destroyFlag = false, abortFlag = false;
  uint64_t collCounts[kRasColls] = {};  // operations queued per collective (kRasCollNames)
};

// A rank no answer reported. unresponsive: its process did not answer (or is not known and
// some process did not answer); else its process answered without it (not, or no longer,
// or not yet a member: NCCL's NOCOMM).
struct MissingRank {
  int rank = 0;
  int process = -1;  // index into Report::processes, -1 not known
  int cudaDev = -1, nvmlDev = -1;
  bool unresponsive = false;
};

struct CommView {
  uint64_t hash = 0;
  uint64_t secondary[2] = {};  // JSON "secondary_hash": rank 0's host hash and process id hash
  int nranks = 0;
  std::vector<RankView> ranks;       // in rank order
  std::vector<MissingRank> missing;  // in rank order; ranks.size() + missing.size() == nranks
};

struct Report {
  // Preamble: "NCCL version 2.28.9<suffix> compiled with CUDA 13.0", then the CUDA
  // runtime's and driver's versions (-1: not known).
  int ncclMajor = 0, ncclMinor = 0, ncclPatch = 0;
  std::string ncclSuffix;
  int cudaMajor = 0, cudaMinor = 0;
  int cudaRuntime = -1, cudaDriver = -1;
  std::string timestamp;  // JSON only: local time, "%F %T"

  std::vector<ProcessView> processes;  // every known process, this one included
  std::vector<CommView> comms;         // in hash order
  int timeouts = 0;         // processes that did not answer in time
  double collectSec = 0;    // how long gathering took
};

// Text, as sent: head() at once (preamble, job summary, "\nCommunicators..." with no end of
// line), body() once gathered (" (0.003s)", the communicator table, Errors, Warnings).
// verbose: VERBOSE STATUS (outliers listed more freely).
std::string renderTextHead(const Report& r, bool verbose);
std::string renderTextBody(const Report& r, bool verbose);
// SET FORMAT json: one document, sent once gathered.
std::string renderJson(const Report& r);

}  // namespace loom::ras
