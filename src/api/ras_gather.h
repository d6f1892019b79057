// The job view behind a RAS query: this process's record, and every other process it shares
// a communicator with, asked over that communicator's authenticated status channel. NCCL
// keeps a RAS network of every process of the job; Loom asks, at query time, the processes
// the answering one knows through its communicators (in a job with a world communicator:
// every process).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "api/ras_report.h"
#include "api/ras_wire.h"

namespace loom::ras {

// This process now: the ranks it hosts in each of its initialised communicators.
ProcessRecord localProcess();
// The same, encoded: what a peer's status query of kProcessReportDetail gets.
std::string localProcessPayload();

class JobView {
 public:
  // Looks at this process's communicators: the processes known, and how to ask them.
  JobView();
  ~JobView();
  JobView(const JobView&) = delete;
  JobView& operator=(const JobView&) = delete;

  // What is known before asking (versions, processes): enough for the text head.
  const Report& head() const { return report_; }
  // Asks every other known process (in parallel; timeoutSec <= 0: no limit) and merges
  // their answers with this process's own.
  const Report& gather(double timeoutSec);

 private:
  struct Known;
  std::vector<Known> known_;  // this process first
  // Where every rank of this process's communicators lives, by (hash, size): a rank none
  // reports is then NOCOMM or unresponsive by its process.
  struct Home {
    int process = -1;  // index in known_
    int cudaDev = -1;
  };
  std::map<std::pair<uint64_t, int>, std::vector<Home>> homes_;
  ProcessRecord self_;
  Report report_;
};

}  // namespace loom::ras
