// The collectives test matrix: which cases one (mode, nranks, algorithm) configuration
// runs, and a rank body that runs them all on one communicator, checking every output
// element against coll_reference.h, the guard bytes around every buffer, and that inputs
// and buffers a rank must not write stay untouched.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/coll_reference.h"
#include "core/rank_harness.h"

namespace colltest {

enum class Coll {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAlltoAll,
  kGather,
  kScatter,
  kSendRecv,
};
const char* collName(Coll c);
bool isReduction(Coll c);

// The all-reduce algorithm a configuration forces through NCCL_ALGO / LOOM_ALGO; kDefault
// leaves the choice to Loom's size rule (and runs the other collectives).
enum class Algo { kDefault, kRing, kTree, kHalvingDoubling, kDirect };
const char* algoName(Algo a);

struct Case {
  Coll coll;
  ncclDataType_t type;
  Op op;
  bool inPlace;
  size_t count;
  int root;       // rooted collectives; the peer shift for send/recv
  uint64_t seed;
  int variant;    // varies minor choices: ncclBcast vs ncclBroadcast, NULL ignored buffers
};
std::string describe(const Case& c, int nranks, Algo algo, int rank);

struct MatrixConfig {
  loomtest::Mode mode;
  int nranks;
  Algo algo;
  bool allTypes;        // false: float32, bfloat16 and int8 only
  bool socket = false;  // NCCL_SHM_DISABLE=1: TCP between the ranks of this host
  // LOOM_SHM_CMA for the run ("" leaves Loom's choice): both shared-memory data paths
  // (peers reading the sender's buffer, copies through the FIFO) run on every machine.
  const char* cma = "";
  // LOOM_STREAM_MIN_BYTES for the run: "1M" makes the large cases write their results
  // with streaming stores.
  const char* streamMin = "";
};
std::string configName(const MatrixConfig& cfg);

constexpr size_t kMidCount = 65536 * 3 + 7;  // spans FIFO slots; a multiple of nothing useful
// More than the 2 MiB a rank can have in flight (LOOM_SLOT_BYTES x LOOM_FIFO_DEPTH).
size_t largeCount(ncclDataType_t t);

std::vector<Case> buildCases(const MatrixConfig& cfg);

// Runs every case as `rank`. Wrong results are collected (the first few in full) and the
// rank keeps going, so all ranks stay in step; an NCCL error ends the rank's run.
// `digests`, if given, gets a hash of every byte of each case's buffers on this rank after
// the call (guard bytes included), to compare the bytes two executors give: the checks
// allow reductions a tolerance, other outputs must equal the reference exactly.
// `check` false skips the comparisons with the reference (and the guard checks): for a
// run whose digests are compared with those of a checked run, which then says as much.
std::string runCases(int rank, int nranks, ncclComm_t comm, Algo algo,
                     const std::vector<Case>& cases, std::vector<uint64_t>* digests = nullptr,
                     bool check = true);

}  // namespace colltest
