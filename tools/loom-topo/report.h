// What loom-topo shows: the host, the orders Loom would use, and the tuner's choices.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "algo/tuner.h"
#include "topo/search.h"
#include "topo/system.h"

namespace loom::tools {

struct TuningRow {
  algo::TuningRequest req;
  algo::TuningChoice choice;
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
};

void printText(FILE* out, const Report& r);
std::string toJson(const Report& r);

}  // namespace loom::tools
