// Loom's test NCCL tuner plugin: exports ncclTunerPlugin_v<LOOM_TEST_TUNER_VERSION> (2..6)
// with the name "LoomTestTuner". Written against Loom's own typing of the ABI
// (src/engine/tuner_abi.h), as an outside plugin would be against NCCL's headers.
//
// LOOM_TEST_TUNER_MODE (read at init):
//   ""            changes nothing
//   "tree"        all-reduce: Tree/Simple costs nothing (v2: names it), and 3 channels
//   "no_ring"     all-reduce: every Ring entry ruled out (-1); v2 cannot say it
//   "tie"         all-reduce: Ring/Simple and Tree/Simple both cost nothing (v2: Tree)
//   "ll"          all-reduce: Tree/LL costs nothing (v2: names it), which host memory cannot run
//   "init_fails"  init returns ncclInternalError
//   "coll_fails"  getCollInfo returns ncclInternalError
// LOOM_TEST_TUNER_CHUNK (v6, read at init): what getChunkSize does
//   unset         leaves the chunk as Loom passes it
//   "<N>"         all-reduce: N bytes, whatever the algorithm and protocol
//   "numbered"    all-reduce: 1000 * (1 + 3 * algorithm + protocol) bytes, in NCCL's numbers
//   "every:<N>"   every collective: N bytes
//   "fail"        returns ncclInternalError
// LOOM_TEST_TUNER_LOG: a file each call appends a line to ("init ...", "coll ...",
// "chunk ...", "finalize").
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/tuner_abi.h"

#ifndef LOOM_TEST_TUNER_VERSION
#error "LOOM_TEST_TUNER_VERSION must be set"
#endif

using loom::netabi::kLogInfo;
using loom::tunerabi::Constants;
using loom::tunerabi::kOk;
using loom::tunerabi::Logger;
using loom::tunerabi::NvlDomainInfo;
using loom::tunerabi::Result;
using loom::tunerabi::TunerV2;
using loom::tunerabi::TunerV3;
using loom::tunerabi::TunerV4;
using loom::tunerabi::TunerV5;
using loom::tunerabi::TunerV6;

// NCCL's numbers, written out here rather than taken from Loom's header, so that a wrong
// number there fails the tests (nccl_tuner.h, nccl_common.h).
constexpr int kAlgoTree = 0, kAlgoRing = 1, kAlgoPat = 6;
constexpr int kProtoLL = 0, kProtoSimple = 2, kNumProtocols = 3;
constexpr int kFuncAllReduce = 4;
constexpr float kIgnore = -1.0f;

namespace {

struct Ctx {
  std::string mode, chunk;
  size_t nranks, nnodes;
};

void note(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void note(const char* fmt, ...) {
  const char* path = getenv("LOOM_TEST_TUNER_LOG");
  if (!path) return;
  FILE* f = fopen(path, "a");
  if (!f) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fclose(f);
}

Result start(void** context, size_t nRanks, size_t nNodes) {
  const char* m = getenv("LOOM_TEST_TUNER_MODE");
  if (m && strcmp(m, "init_fails") == 0) return 3;
  const char* chunk = getenv("LOOM_TEST_TUNER_CHUNK");
  *context = new Ctx{m ? m : "", chunk ? chunk : "", nRanks, nNodes};
  return kOk;
}

#if LOOM_TEST_TUNER_VERSION >= 3
// v3 and later: the cost table (rows of kNumProtocols floats, as NCCL lays it out).
Result edit(void* context, int coll, size_t nBytes, float** collCostTable, int numAlgo, int numProto,
            int* nChannels) {
  auto* c = static_cast<Ctx*>(context);
  auto table = reinterpret_cast<float (*)[kNumProtocols]>(collCostTable);
  note("coll %d bytes %zu algos %d protos %d ring_simple %.3f tree_simple %.3f ring_ll %.3f pat_simple %.3f "
       "channels %d",
       coll, nBytes, numAlgo, numProto, table[kAlgoRing][kProtoSimple], table[kAlgoTree][kProtoSimple],
       table[kAlgoRing][kProtoLL], table[kAlgoPat][kProtoSimple], *nChannels);
  if (c->mode == "coll_fails") return 3;
  if (coll != kFuncAllReduce) return kOk;
  if (c->mode == "tree") {
    if (table[kAlgoTree][kProtoSimple] != kIgnore) table[kAlgoTree][kProtoSimple] = 0;
    *nChannels = 3;
  } else if (c->mode == "no_ring") {
    for (int p = 0; p < kNumProtocols; ++p) table[kAlgoRing][p] = kIgnore;
  } else if (c->mode == "tie") {
    table[kAlgoRing][kProtoSimple] = 0;
    table[kAlgoTree][kProtoSimple] = 0;
  } else if (c->mode == "ll") {
    table[kAlgoTree][kProtoLL] = 0;  // a careless plugin: the cell is NCCL_ALGO_PROTO_IGNORE
  }
  return kOk;
}
#endif

Result stop(void* context) {
  note("finalize");
  delete static_cast<Ctx*>(context);
  return kOk;
}

#if LOOM_TEST_TUNER_VERSION <= 4
Result initOld(size_t nRanks, size_t nNodes, Logger log, void** context) {
  note("init v%d nranks %zu nnodes %zu", LOOM_TEST_TUNER_VERSION, nRanks, nNodes);
  log(kLogInfo, 0x40, __FILE__, __LINE__, "LoomTestTuner v%d up for %zu ranks", LOOM_TEST_TUNER_VERSION, nRanks);
  return start(context, nRanks, nNodes);
}
#else
Result initNew(void** context, uint64_t commId, size_t nRanks, size_t nNodes, Logger log, NvlDomainInfo* nvl,
               Constants* constants) {
  note("init v%d nranks %zu nnodes %zu commid %s nvl %d %d %d constants %g", LOOM_TEST_TUNER_VERSION, nRanks,
       nNodes, commId ? "set" : "zero", nvl->nNvlDomains, nvl->minRanksPerNvlDomain, nvl->maxRanksPerNvlDomain,
       constants->baseLatencies[kAlgoRing][kProtoSimple]);
  constants->baseLatencies[kAlgoRing][kProtoSimple] = 1e6;  // in/out: Loom must not care
  log(kLogInfo, 0x40, __FILE__, __LINE__, "LoomTestTuner v%d up for %zu ranks", LOOM_TEST_TUNER_VERSION, nRanks);
  return start(context, nRanks, nNodes);
}
#endif

#if LOOM_TEST_TUNER_VERSION == 2
Result collInfoV2(void* context, int coll, size_t nBytes, int collNet, int nvls, int numPipeOps, int* algorithm,
                  int* protocol, int* nChannels) {
  auto* c = static_cast<Ctx*>(context);
  note("coll %d bytes %zu collnet %d nvls %d pipeops %d channels %d", coll, nBytes, collNet, nvls, numPipeOps,
       *nChannels);
  if (c->mode == "coll_fails") return 3;
  if (coll == kFuncAllReduce && (c->mode == "tree" || c->mode == "tie" || c->mode == "ll")) {
    *algorithm = kAlgoTree;
    *protocol = c->mode == "ll" ? kProtoLL : kProtoSimple;
    if (c->mode == "tree") *nChannels = 3;
  }
  return kOk;
}
#elif LOOM_TEST_TUNER_VERSION == 3
Result collInfoV3(void* context, int coll, size_t nBytes, int, float** table, int numAlgo, int numProto,
                  int* nChannels) {
  return edit(context, coll, nBytes, table, numAlgo, numProto, nChannels);
}
#else
Result collInfoV4(void* context, int coll, size_t nBytes, int, float** table, int numAlgo, int numProto, int,
                  int* nChannels) {
  return edit(context, coll, nBytes, table, numAlgo, numProto, nChannels);
}
#endif

#if LOOM_TEST_TUNER_VERSION == 6
Result chunkSize(void* context, int coll, size_t nBytes, int algo, int proto, int nChannels, size_t* chunk) {
  auto* c = static_cast<Ctx*>(context);
  note("chunk coll %d bytes %zu algo %d proto %d channels %d in %zu", coll, nBytes, algo, proto, nChannels, *chunk);
  if (c->chunk == "fail") return 3;
  if (c->chunk.rfind("every:", 0) == 0) {
    *chunk = strtoull(c->chunk.c_str() + 6, nullptr, 10);
    return kOk;
  }
  if (coll != kFuncAllReduce || c->chunk.empty()) return kOk;
  *chunk = c->chunk == "numbered" ? size_t{1000} * static_cast<size_t>(1 + 3 * algo + proto)
                                  : strtoull(c->chunk.c_str(), nullptr, 10);
  return kOk;
}
#endif

}  // namespace

#define LOOM_TEST_TUNER_EXPORT extern "C" __attribute__((visibility("default")))
#if LOOM_TEST_TUNER_VERSION == 2
LOOM_TEST_TUNER_EXPORT const TunerV2 ncclTunerPlugin_v2 = {"LoomTestTuner", initOld, collInfoV2, stop};
#elif LOOM_TEST_TUNER_VERSION == 3
LOOM_TEST_TUNER_EXPORT const TunerV3 ncclTunerPlugin_v3 = {"LoomTestTuner", initOld, collInfoV3, stop};
#elif LOOM_TEST_TUNER_VERSION == 4
LOOM_TEST_TUNER_EXPORT const TunerV4 ncclTunerPlugin_v4 = {"LoomTestTuner", initOld, collInfoV4, stop};
#elif LOOM_TEST_TUNER_VERSION == 5
LOOM_TEST_TUNER_EXPORT const TunerV5 ncclTunerPlugin_v5 = {"LoomTestTuner", initNew, collInfoV4, stop};
#else
LOOM_TEST_TUNER_EXPORT const TunerV6 ncclTunerPlugin_v6 = {{"LoomTestTuner", initNew, collInfoV4, stop}, chunkSize};
#endif
