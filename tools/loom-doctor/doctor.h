// loom-doctor: the checks cluster runbooks do by hand before a job, each a verdict
// (PASS / WARN / FAIL / SKIP), what was found and, where something is wrong, what to fix.
// The checks gather facts (system_checks.cc, network_checks.cc, topo_checks.cc, sweep.cc);
// report.cc prints them as text or JSON, so both forms always carry the same facts.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/json.h"
#include "topo/system.h"

namespace loom::doctor {

enum class Status { kPass, kWarn, kFail, kSkip };
const char* statusName(Status s);

struct Check {
  std::string name;  // short, no spaces: "interface", "shm", "allreduce-4"
  Status status = Status::kPass;
  std::string found;  // what was found, one sentence
  std::string fix;    // what to do about it (WARN / FAIL)
  // Machine-readable facts for --json: key and an already encoded JSON value.
  std::vector<std::pair<std::string, std::string>> facts;
  std::vector<std::string> detail;  // extra text lines shown with --verbose

  explicit Check(std::string n) : name(std::move(n)) {}
  Check& set(Status s, std::string f, std::string x = "") {
    status = s;
    found = std::move(f);
    fix = std::move(x);
    return *this;
  }
  void fact(const std::string& key, std::string json) { facts.emplace_back(key, std::move(json)); }
};

// What several checks need to know about this host, gathered once.
struct Host {
  std::optional<topo::System> sys;  // discovery (+ NCCL_TOPO_FILE); empty when that failed
  std::string topoError;
  bool bootstrapOk = false;  // the interface check found the bootstrap interface
  int rdmaDevices = 0;       // entries of /sys/class/infiniband
};

std::string jsonNumber(double v);  // jsonString is base/json.h's
std::string jsonBool(bool v);
std::string humanBytes(double bytes);  // "8 B", "64 KiB", "1.5 GiB"

// system_checks.cc
Check checkKnobs();
Check checkShm();
Check checkMemlock(const Host& host);
Check checkOpenFiles();
Check checkAffinity(const Host& host);
// network_checks.cc
Check checkInterface(Host* host);
Check checkRendezvous(int timeoutMs);
Check checkRdma(Host* host);
Check checkGdr(const Host& host);
// topo_checks.cc
Host loadHost();
Check checkGpus(const Host& host);
Check checkNvLink(const Host& host);
Check checkGpuNic(const Host& host);

// sweep.cc: an all-reduce sweep on host memory with `nranks` ranks as threads of this
// process, results checked exactly and times compared with the cost model's prediction;
// slower than `factor` times the prediction (plus a fixed allowance for scheduling) fails.
struct SweepOptions {
  int nranks = 2;
  double factor = 10;
  double timeoutS = 60;
};
Check runSweep(const Host& host, const SweepOptions& opt);
// Whether a sweep timed out and left its rank threads running (the caller must then end
// the process with _exit, as those threads cannot be joined).
bool sweepLeftThreads();

// report.cc
void printText(FILE* out, const std::vector<Check>& checks, bool verbose);
void printJson(FILE* out, const std::vector<Check>& checks);

}  // namespace loom::doctor
