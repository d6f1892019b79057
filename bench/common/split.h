// nccl-tests' NCCL_TESTS_SPLIT / NCCL_TESTS_SPLIT_MASK: the processes split into groups by a
// color computed from each process's index, every group runs the test on a communicator of
// its own (ncclCommSplit of the whole job's), side by side, while the whole job's
// communicator carries the barriers and the averaged times. "MOD 8" on 8-GPU hosts, say,
// runs one communicator per local rank across the hosts (the network alone); "DIV 8" one
// per host.
#pragma once

#include <string>
#include <vector>

namespace loom::bench {

struct TestSplit {
  std::string spec;  // as set, for the header; "" when no split
  char op = 0;       // '&', '|', '%', '/'; 0: no split (every process is color 0)
  long value = 0;

  bool active() const { return op != 0; }
  int colorOf(int proc) const;
  // One entry per color in use (ascending): how many processes have it.
  std::vector<int> groupSizes(int nProcs) const;
};

// Reads NCCL_TESTS_SPLIT_MASK (a hex mask, as nccl-tests: color = process & mask), else
// NCCL_TESTS_SPLIT ("AND|&|OR|\||MOD|%|DIV|/ <integer>", any case). A value nccl-tests would
// silently ignore or divide by is refused here (kInvalidUsage, saying what was expected).
TestSplit parseTestSplit();

}  // namespace loom::bench
