// loom-topo: shows the host (or a topology file) as Loom sees it, the rings and trees it
// would build, and the tuner's choice for every collective at every power-of-two size.
//
//   loom-topo [--topo-file F] [--nodes N] [--nranks R] [--host-memory] [--json] [--dump-xml]
#include <getopt.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "report.h"
#include "topo/load.h"
#include "topo/topo_xml.h"

namespace {

void usage(FILE* out) {
  fprintf(out,
          "usage: loom-topo [options]\n"
          "  --topo-file F   read NCCL topology XML F instead of probing this host\n"
          "  --nodes N       N copies of the host joined by a non-blocking fabric, one NIC per rail (default 1)\n"
          "  --nranks R      ranks in total (default: GPUs per host x N; without GPUs, max(2, NUMA domains) x N)\n"
          "  --host-memory   tune for buffers in host memory (the CPU executor)\n"
          "  --json          print JSON instead of text\n"
          "  --dump-xml      print the topology in NCCL's XML format and exit\n"
          "Environment: NCCL_TOPO_FILE merges a file over what is detected; NCCL_ALGO / NCCL_PROTO\n"
          "restrict the tuner as they would in a job.\n");
}

int parsePositive(const char* opt, const char* text) {
  char* end = nullptr;
  long v = strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < 1 || v > 1 << 20)
    LOOM_THROW(kInvalidArgument, "%s expects a positive integer, got '%s'", opt, text);
  return static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace loom;
  std::string topoFile;
  int nodes = 1, nranks = 0;
  bool json = false, dumpXml = false, hostMemory = false;
  const option longOpts[] = {{"topo-file", required_argument, nullptr, 'f'},
                             {"nodes", required_argument, nullptr, 'n'},
                             {"nranks", required_argument, nullptr, 'r'},
                             {"host-memory", no_argument, nullptr, 'm'},
                             {"json", no_argument, nullptr, 'j'},
                             {"dump-xml", no_argument, nullptr, 'x'},
                             {"help", no_argument, nullptr, 'h'},
                             {nullptr, 0, nullptr, 0}};
  try {
    for (int c; (c = getopt_long(argc, argv, "f:n:r:mjxh", longOpts, nullptr)) != -1;) {
      switch (c) {
        case 'f': topoFile = optarg; break;
        case 'n': nodes = parsePositive("--nodes", optarg); break;
        case 'r': nranks = parsePositive("--nranks", optarg); break;
        case 'm': hostMemory = true; break;
        case 'j': json = true; break;
        case 'x': dumpXml = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
      }
    }
    if (optind < argc) {
      fprintf(stderr, "loom-topo: unexpected argument '%s'\n", argv[optind]);
      usage(stderr);
      return 2;
    }
    topo::System sys = topoFile.empty() ? topo::loadLocalSystem() : topo::loadSystemFile(topoFile);
    if (dumpXml) {
      fputs(topo::writeXml(topo::systemToXml(sys)).c_str(), stdout);
      return 0;
    }
    bool host = hostMemory || sys.gpuCount() == 0;
    if (nranks == 0) nranks = nodes * (sys.gpuCount() > 0 ? sys.gpuCount() : std::max(2, sys.cpuCount()));
    if (nranks < nodes)
      LOOM_THROW(kInvalidArgument, "--nranks %d is fewer than --nodes %d (every host needs a rank)", nranks, nodes);

    tools::Report r;
    r.sys = &sys;
    r.nodes = nodes;
    r.nranks = nranks;
    r.hostMemory = host;
    int local = (nranks + nodes - 1) / nodes;
    r.model = algo::buildNodeModel(sys, local, host);
    if (!host) {
      std::vector<int> used;
      for (int g = 0; g < std::min(local, sys.gpuCount()); ++g) used.push_back(g);
      r.rings = topo::searchRings(sys, used);
      if (nodes > 1 && !r.rings.rings.empty()) r.railRings = topo::railRings(sys, r.rings.rings.front());
    }
    if (nodes > 1) r.trees = topo::doubleBinaryTree(nodes);
    for (int c = 0; c < static_cast<int>(Collective::kCount); ++c) {
      Collective coll = static_cast<Collective>(c);
      algo::AlgoFilter filter = algo::filterFromEnv(coll);
      for (size_t bytes = 8; bytes <= (size_t{1} << 30); bytes *= 2) {
        algo::TuningRequest req{coll, bytes, nranks, nodes, host};
        tools::TuningRow row{req, {}, ""};
        try {
          row.choice = algo::tune(r.model, req, filter);
        } catch (const Error& e) {
          row.error = e.what();
        }
        r.tuning.push_back(std::move(row));
      }
    }
    if (json) fputs(tools::toJson(r).c_str(), stdout);
    else tools::printText(stdout, r);
    return 0;
  } catch (const Error& e) {
    fprintf(stderr, "loom-topo: %s\n", e.what());
    return 1;
  }
}
