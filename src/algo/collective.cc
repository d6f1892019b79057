#include "algo/collective.h"

namespace loom {

const char* collectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "AllReduce";
    case Collective::kBroadcast: return "Broadcast";
    case Collective::kReduce: return "Reduce";
    case Collective::kAllGather: return "AllGather";
    case Collective::kReduceScatter: return "ReduceScatter";
    case Collective::kAlltoAll: return "AlltoAll";
    case Collective::kGather: return "Gather";
    case Collective::kScatter: return "Scatter";
    case Collective::kSendRecv: return "SendRecv";
    default: return "?";
  }
}

const char* algorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kRing: return "Ring";
    case Algorithm::kTree: return "Tree";
    case Algorithm::kHalvingDoubling: return "HalvingDoubling";
    case Algorithm::kDirect: return "Direct";
    case Algorithm::kHierarchical: return "Hierarchical";
    default: return "?";
  }
}

const char* protocolName(Protocol p) {
  switch (p) {
    case Protocol::kSimple: return "Simple";
    case Protocol::kLL: return "LL";
    case Protocol::kLL128: return "LL128";
    default: return "?";
  }
}

}  // namespace loom
