// loom-doctor: checks this host the way cluster runbooks do before a job (interfaces and
// NCCL_SOCKET_IFNAME, /dev/shm and limits, affinity, GPUs / NVLink / NIC placement, RDMA
// and GPUDirect modules, the rendezvous address), then runs a short all-reduce sweep on
// host memory against the cost model, and says what to fix.
//
//   loom-doctor [--json] [--verbose] [--no-sweep] [--ranks N] [--factor F] [--timeout S]
//
// Exit status: 0 when no check FAILs, 1 when one does, 2 on bad usage.
#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "base/host.h"
#include "base/log.h"
#include "doctor.h"

namespace {

using namespace loom;
using namespace loom::doctor;

void shortUsage() {
  fprintf(stderr,
          "usage: loom-doctor [--json] [-v] [--no-sweep] [--ranks N] [--factor F] [--timeout S] "
          "[--connect-timeout MS] (--help explains)\n");
}

void usage(FILE* out) {
  fprintf(out,
          "usage: loom-doctor [options]\n"
          "Checks this host before a job and prints one line per check: PASS, WARN, FAIL or SKIP, what was\n"
          "found and, for WARN and FAIL, what to fix.\n"
          "  --json            print one JSON document instead of text\n"
          "  -v, --verbose     also print the sweep's table (model and measured time per size)\n"
          "  --no-sweep        skip the all-reduce sweep\n"
          "  --ranks N         sweep with 2, 4, ... up to N ranks as threads (default: CPUs of this host,\n"
          "                    from 2 to 8)\n"
          "  --factor F        a size fails when its fastest run is over F x the model + 50 us (default 10)\n"
          "  --timeout S       seconds one sweep may take before it fails (default 60)\n"
          "  --connect-timeout MS  how long the rendezvous check waits for NCCL_COMM_ID (default 2000)\n"
          "Exit status: 0 when no check fails, 1 when one does, 2 on bad usage.\n"
          "The environment is read as a job reads it (NCCL_SOCKET_IFNAME, NCCL_COMM_ID, NCCL_TOPO_FILE, ...).\n"
          "Library log lines (NCCL_DEBUG) go to stderr so that stdout stays parseable.\n");
}

// Throws kInvalidArgument naming the option.
double parseNumber(const char* opt, const char* text, double lo, double hi) {
  char* end = nullptr;
  double v = strtod(text, &end);
  if (*text == '\0' || *end != '\0' || !(v >= lo && v <= hi))
    LOOM_THROW(kInvalidArgument, "%s expects a number from %g to %g, got '%s'", opt, lo, hi, text);
  return v;
}

// 2, 4, 8, ... below n, then n.
std::vector<int> rankCounts(int n) {
  std::vector<int> out;
  for (int r = 2; r < n; r *= 2) out.push_back(r);
  out.push_back(n);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false, verbose = false, sweep = true;
  int ranks = std::clamp(hostCpus(), 2, 8);
  int connectMs = 2000;
  SweepOptions opt;
  const option longOpts[] = {{"json", no_argument, nullptr, 'j'},
                             {"verbose", no_argument, nullptr, 'v'},
                             {"no-sweep", no_argument, nullptr, 'n'},
                             {"ranks", required_argument, nullptr, 'r'},
                             {"factor", required_argument, nullptr, 'f'},
                             {"timeout", required_argument, nullptr, 't'},
                             {"connect-timeout", required_argument, nullptr, 'c'},
                             {"help", no_argument, nullptr, 'h'},
                             {nullptr, 0, nullptr, 0}};
  try {
    opterr = 0;  // our own message, naming the option
    for (int c; (c = getopt_long(argc, argv, "vh", longOpts, nullptr)) != -1;) {
      switch (c) {
        case 'j': json = true; break;
        case 'v': verbose = true; break;
        case 'n': sweep = false; break;
        case 'r':
          ranks = static_cast<int>(parseNumber("--ranks", optarg, 2, 64));
          if (ranks != strtod(optarg, nullptr))
            LOOM_THROW(kInvalidArgument, "--ranks expects a whole number, got '%s'", optarg);
          break;
        case 'f': opt.factor = parseNumber("--factor", optarg, 1, 1e6); break;
        case 't': opt.timeoutS = parseNumber("--timeout", optarg, 1, 3600); break;
        case 'c': connectMs = static_cast<int>(parseNumber("--connect-timeout", optarg, 1, 600000)); break;
        case 'h': usage(stdout); return 0;
        default:
          fprintf(stderr, "loom-doctor: unknown option or missing value: '%s'\n", argv[optind - 1]);
          shortUsage();
          return 2;
      }
    }
    if (optind < argc) {
      fprintf(stderr, "loom-doctor: unexpected argument '%s'\n", argv[optind]);
      shortUsage();
      return 2;
    }
  } catch (const Error& e) {
    fprintf(stderr, "loom-doctor: %s\n", e.what());
    shortUsage();
    return 2;
  }

  FILE* out = loom::takeStdoutForReport();
  std::vector<Check> checks;
  try {
    Host host = loadHost();
    checks.push_back(checkKnobs());
    checks.push_back(checkInterface(&host));
    checks.push_back(checkRendezvous(connectMs));
    checks.push_back(checkRdma(&host));  // before memlock and gdr, which ask about RDMA devices
    checks.push_back(checkShm());
    checks.push_back(checkMemlock(host));
    checks.push_back(checkOpenFiles());
    checks.push_back(checkAffinity(host));
    checks.push_back(checkGpus(host));
    checks.push_back(checkNvLink(host));
    checks.push_back(checkGpuNic(host));
    checks.push_back(checkGdr(host));
    if (sweep) {
      for (int n : rankCounts(ranks)) {
        opt.nranks = n;
        checks.push_back(runSweep(host, opt));
        if (checks.back().status != Status::kPass) break;  // one failing size tells enough
      }
    } else {
      checks.push_back(Check("allreduce").set(Status::kSkip, "--no-sweep"));
    }
  } catch (const Error& e) {
    checks.push_back(Check("doctor").set(Status::kFail, std::string("internal error: ") + e.what(),
                                         "report it with loom-info's output"));
  }
  if (json)
    printJson(out, checks);
  else
    printText(out, checks, verbose);
  const bool failed =
      std::any_of(checks.begin(), checks.end(), [](const Check& c) { return c.status == Status::kFail; });
  if (fflush(out) != 0 || ferror(out)) {
    perror("loom-doctor: writing the report");
    return 1;
  }
  if (sweepLeftThreads()) _exit(1);  // rank threads still blocked inside Loom cannot be joined
  return failed ? 1 : 0;
}
