// Vocabulary shared by the tuner, the plan builders and the engine.
#pragma once

#include <cstdint>

namespace loom {

enum class Collective : int {
  kAllReduce = 0,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAlltoAll,
  kGather,
  kScatter,
  kSendRecv,
  kCount,
};

enum class Algorithm : int {
  kRing = 0,
  kTree,             // double binary tree
  kHalvingDoubling,  // recursive halving-doubling (Rabenseifner)
  kDirect,           // one-shot / all-pairs, for small messages
  kHierarchical,     // intra-host, inter-host per rail, intra-host
  kCount,
};

enum class Protocol : int {
  kSimple = 0,  // data slots + a flag per step
  kLL,          // low-latency: 8-byte flag+data lines
  kLL128,       // 128-byte lines with a flag word
  kCount,
};

constexpr int kCollectiveCount = static_cast<int>(Collective::kCount);
constexpr int kAlgoCount = static_cast<int>(Algorithm::kCount);
constexpr int kProtoCount = static_cast<int>(Protocol::kCount);

const char* collectiveName(Collective c);  // "AllReduce", as NCCL prints it
const char* algorithmName(Algorithm a);     // "Ring", "Tree", "HalvingDoubling", ...
const char* protocolName(Protocol p);       // "Simple", "LL", "LL128"

}  // namespace loom
