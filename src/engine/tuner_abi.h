// The binary interface of NCCL tuner plugins (libnccl-tuner*.so, or a net plugin library
// that also exports one), versions 2 to 6: a plugin exports a struct object
// `ncclTunerPlugin_v<N>` of function pointers. Typed here from NCCL's published interface
// description (ext-tuner); member order and types are the ABI. Plain C layout: Loom's test
// plugins include it too.
//
// What changed per version: v3 getCollInfo edits a cost table (algorithms x protocols, in
// microseconds; -1 where NCCL ignores the pair) instead of naming an algorithm and
// protocol; v4 adds regBuff; v5 init takes the communicator's id, NVLink domains and NCCL's
// model constants (in/out) instead of handing back a context last, and `destroy` became
// `finalize`; v6 adds an optional getChunkSize.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transports/net/plugin_abi.h"

namespace loom::tunerabi {

using netabi::Logger;
using netabi::Result;
using netabi::kOk;

// NCCL's algorithm and protocol numbers: the cost table's rows and columns.
enum : int { kAlgoTree = 0, kAlgoRing = 1, kAlgoCollNetDirect = 2, kAlgoCollNetChain = 3,
             kAlgoNvls = 4, kAlgoNvlsTree = 5, kAlgoPat = 6, kNumAlgorithms = 7 };
enum : int { kProtoLL = 0, kProtoLL128 = 1, kProtoSimple = 2, kNumProtocols = 3 };
constexpr float kIgnore = -1.0f;  // NCCL_ALGO_PROTO_IGNORE
constexpr int kAlgoUndef = -1;    // NCCL_ALGO_UNDEF, NCCL_PROTO_UNDEF

// ncclFunc_t values of the collectives NCCL asks a tuner about.
enum : int { kFuncBroadcast = 0, kFuncReduce = 1, kFuncAllGather = 2, kFuncReduceScatter = 3,
             kFuncAllReduce = 4 };

// ncclNvlDomainInfo_v5_t
struct NvlDomainInfo {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
};

// ncclTunerConstants_v5_t: NCCL's own model constants, which a v5 plugin may rewrite.
struct Constants {
  double baseLatencies[7][3];
  double hwLatencies[3][7][3];
  double llMaxBws[4][3];
  double perChMaxRingLL128Bws[4][3];
  double perChMaxTreeLL128Bws[4][3];
  double perChMaxTreeBws[4][3];
  double perChMaxNVLSTreeBws[4][3];
};

struct TunerV2 {
  const char* name;
  Result (*init)(size_t nRanks, size_t nNodes, Logger logFunction, void** context);
  Result (*getCollInfo)(void* context, int collType, size_t nBytes, int collNetSupport,
                        int nvlsSupport, int numPipeOps, int* algorithm, int* protocol,
                        int* nChannels);
  Result (*destroy)(void* context);
};

struct TunerV3 {
  const char* name;
  Result (*init)(size_t nRanks, size_t nNodes, Logger logFunction, void** context);
  Result (*getCollInfo)(void* context, int collType, size_t nBytes, int numPipeOps,
                        float** collCostTable, int numAlgo, int numProto, int* nChannels);
  Result (*destroy)(void* context);
};

struct TunerV4 {
  const char* name;
  Result (*init)(size_t nRanks, size_t nNodes, Logger logFunction, void** context);
  Result (*getCollInfo)(void* context, int collType, size_t nBytes, int numPipeOps,
                        float** collCostTable, int numAlgo, int numProto, int regBuff,
                        int* nChannels);
  Result (*destroy)(void* context);
};

struct TunerV5 {
  const char* name;
  Result (*init)(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                 Logger logFunction, NvlDomainInfo* nvlDomainInfo, Constants* constants);
  Result (*getCollInfo)(void* context, int collType, size_t nBytes, int numPipeOps,
                        float** collCostTable, int numAlgo, int numProto, int regBuff,
                        int* nChannels);
  Result (*finalize)(void* context);
};

// v6: v5's members, then an optional getChunkSize.
struct TunerV6 {
  TunerV5 v5;
  Result (*getChunkSize)(void* context, int collType, size_t nBytes, int algo, int proto,
                         int nChannels, size_t* chunkSize);  // may be null
};

static_assert(sizeof(Constants) == (21 + 63 + 5 * 12) * sizeof(double), "ncclTunerConstants_v5_t");
static_assert(sizeof(TunerV5) == 4 * sizeof(void*), "ncclTuner_v5_t");
static_assert(sizeof(TunerV6) == 5 * sizeof(void*), "ncclTuner_v6_t");

}  // namespace loom::tunerabi
