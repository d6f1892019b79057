// What loom-topo shows: the host, the orders Loom would use, and the selector's choices.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "algo/select.h"
#include "algo/simulate.h"
#include "topo/search.h"
#include "topo/system.h"

namespace loom::tools {

// The selector's choice for one collective at one nccl-tests size.
struct TuningRow {
  Collective coll = Collective::kAllReduce;
  size_t bytes = 0;  // nccl-tests' "size"
  int nranks = 1;
  Selection sel;
  double predictedUs = 0;
  double busBw = 0;   // GB/s, nccl-tests' bus bandwidth the prediction implies
  std::string error;  // set when NCCL_ALGO/NCCL_PROTO leave this collective nothing to run
};

struct Report {
  const topo::System* sys = nullptr;
  int nodes = 1;
  int nranks = 1;
  bool hostMemory = false;
  algo::NodeModel model;
  topo::RingSet rings;
  std::vector<topo::RailRing> railRings;  // when nodes > 1
  topo::DoubleTree trees;                 // over hosts, when nodes > 1
  std::vector<TuningRow> tuning;
  std::string tunerPlugin;  // the NCCL tuner plugin that adjusted the choices ("": none)
};

void printText(FILE* out, const Report& r);
std::string toJson(const Report& r);

// loom-topo --plan: the selection for one request, the simulator's verdict on every rank's
// plan, and rank `rank`'s plan. Returns false when the simulation found a fault.
bool printPlan(FILE* out, const CollRequest& req, const JobContexts& job, int rank, bool hostMemory);

}  // namespace loom::tools
