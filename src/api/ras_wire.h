// What one process answers a RAS query (status detail kProcessReportDetail, over a
// communicator's authenticated status channel): who it is and the ranks it hosts in each of
// its communicators. Little-endian binary, length-checked on decode (and fuzzed).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "api/ras_report.h"

namespace loom::ras {

struct RankRecord {
  int32_t rank = 0, cudaDev = -1;
  int32_t initState = 0, asyncError = 0;  // ncclResult_t values
  bool finalizeCalled = false, destroyFlag = false, abortFlag = false;
  uint64_t collCounts[kRasColls] = {};
};

struct CommRecord {
  uint64_t hash = 0;
  uint64_t secondary[2] = {};
  int32_t nranks = 0;
  std::vector<RankRecord> ranks;  // the ranks this process hosts
};

struct ProcessRecord {
  std::string node;  // IP of the bootstrap interface
  int32_t pid = 0;
  uint64_t hostHash = 0, pidNs = 0;  // with pid: which process this is
  uint64_t cudaDevs = 0;
  std::vector<CommRecord> comms;
};

// Limits a decoder holds a record to (a reply is at most 1 MiB anyway).
constexpr size_t kMaxNodeBytes = 64;
constexpr uint32_t kMaxComms = 4096;
constexpr uint32_t kMaxLocalRanks = 4096;
constexpr int32_t kMaxCommRanks = 1 << 20;

std::string encodeProcess(const ProcessRecord& p);
// False (out untouched or partly filled) unless `bytes` is exactly one well-formed record.
bool decodeProcess(std::string_view bytes, ProcessRecord* out);

}  // namespace loom::ras
