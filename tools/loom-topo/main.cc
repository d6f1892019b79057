// loom-topo: shows the host (or a topology file) as Loom sees it, the rings and trees it
// would build, and the selector's choice for every collective at every power-of-two size;
// with --plan, one request's selection and plan, checked in the plan simulator.
//
//   loom-topo [--topo-file F] [--nodes N] [--nranks R] [--host-memory] [--json] [--dump-xml]
//   loom-topo --plan <collective> <bytes> [--rank R] [--root R] [--topo-file F] [--nodes N] ...
#include <getopt.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "base/config.h"
#include "base/error.h"
#include "engine/tuner_plugin.h"
#include "report.h"
#include "topo/load.h"
#include "topo/topo_xml.h"

namespace {

using namespace loom;

void usage(FILE* out) {
  fprintf(out,
          "usage: loom-topo [options]\n"
          "       loom-topo --plan <collective> <bytes> [options]\n"
          "  --topo-file F   read NCCL topology XML F instead of probing this host\n"
          "  --nodes N       N copies of the host joined by a non-blocking fabric, one NIC per rail (default 1)\n"
          "  --nranks R      ranks in total (default: GPUs per host x N; without GPUs, max(2, NUMA domains) x N)\n"
          "  --host-memory   tune for buffers in host memory (the CPU executor)\n"
          "  --json          print JSON instead of text\n"
          "  --dump-xml      print the topology in NCCL's XML format and exit\n"
          "  --plan C B      select and plan collective C (allreduce, allgather, reducescatter, broadcast,\n"
          "                  reduce) of B bytes (nccl-tests' size; K/M/G suffixes), run every rank's plan\n"
          "                  in the plan simulator and print the selection and one rank's plan\n"
          "  --rank R        the rank whose plan --plan prints (default 0)\n"
          "  --root R        the root of a --plan broadcast or reduce (default 0)\n"
          "Ranks fill hosts in contiguous blocks. Environment: NCCL_TOPO_FILE merges a file over what is\n"
          "detected; NCCL_ALGO / NCCL_PROTO restrict the selector as they would in a job; LOOM_SLOT_BYTES /\n"
          "LOOM_FIFO_DEPTH give the FIFO shape plans are cut for.\n");
}

int parseCount(const char* opt, const char* text, int lo) {
  char* end = nullptr;
  long v = strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < lo || v > 1 << 20)
    LOOM_THROW(kInvalidArgument, "%s expects an integer from %d, got '%s'", opt, lo, text);
  return static_cast<int>(v);
}

// "AllReduce", "all_reduce", "allreduce" ... as the collective they name.
Collective parseCollective(const std::string& text) {
  auto squash = [](const std::string& s) {
    std::string o;
    for (char c : s)
      if (c != '_' && c != '-') o += static_cast<char>(tolower(static_cast<unsigned char>(c)));
    return o;
  };
  for (Collective c : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                       Collective::kBroadcast, Collective::kReduce})
    if (squash(text) == squash(collectiveName(c))) return c;
  LOOM_THROW(kInvalidArgument,
             "--plan: '%s' is not a collective loom-topo can plan (allreduce, allgather, reducescatter, broadcast, "
             "reduce; the point-to-point ones run as a batch of sends and receives)",
             text.c_str());
}

// The FIFO shape a job on this host would use: the engine's knobs where they are linked in.
std::pair<size_t, int> fifoShape() {
  size_t slot = 256 << 10;
  int depth = 8;
  const KnobBase* k = findKnob("LOOM_SLOT_BYTES");
  if (k && k->type() == KnobType::kSize) slot = static_cast<const SizeKnob*>(k)->get();
  k = findKnob("LOOM_FIFO_DEPTH");
  if (k && k->type() == KnobType::kInt) depth = static_cast<int>(static_cast<const IntKnob*>(k)->get());
  if (slot < 4096 || slot % 64 != 0 || depth < 2)
    LOOM_THROW(kInvalidArgument, "FIFOs of %d x %zu bytes cannot carry plans (LOOM_SLOT_BYTES / LOOM_FIFO_DEPTH)",
               depth, slot);
  return {slot, depth};
}

// The selector's choice for every collective at every power of two, as a job would make it.
void tabulate(tools::Report& r, const JobContexts& job) {
  const PlanContext& ctx = job[0];
  for (int c = 0; c < kCollectiveCount; ++c) {
    const Collective coll = static_cast<Collective>(c);
    for (size_t bytes = 8; bytes <= (size_t{1} << 30); bytes *= 2) {
      tools::TuningRow row;
      row.coll = coll;
      row.bytes = bytes;
      row.nranks = r.nranks;
      // One-byte elements: the request is exactly nccl-tests' size (per rank for the
      // gathered / scattered collectives).
      CollRequest req{coll, bytes / static_cast<size_t>(modelBytes(coll, 1, r.nranks)), 1, 0};
      row.sel = select(req, ctx);
      const bool p2p = coll == Collective::kAlltoAll || coll == Collective::kGather ||
                       coll == Collective::kScatter || coll == Collective::kSendRecv;
      if (!p2p && (!ctx.allowed[static_cast<size_t>(c)][static_cast<size_t>(row.sel.algorithm)] ||
                   !ctx.allowedProtocols[static_cast<size_t>(c)][static_cast<size_t>(row.sel.protocol)])) {
        row.error = strprintf("NCCL_ALGO / NCCL_PROTO leave nothing that can run this; a job runs %s/%s instead",
                              algorithmName(row.sel.algorithm), protocolName(row.sel.protocol));
      }
      row.predictedUs = estimateMicros({req}, ctx);
      const double size = static_cast<double>(modelBytes(coll, req.count, r.nranks));
      row.busBw = row.predictedUs > 0 ? algo::busBwFactor(coll, r.nranks) * size / (row.predictedUs * 1e3) : 0;
      r.tuning.push_back(std::move(row));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string topoFile, planColl;
  int nodes = 1, nranks = 0, rank = 0, root = 0;
  bool json = false, dumpXml = false, hostMemory = false, plan = false;
  const option longOpts[] = {{"topo-file", required_argument, nullptr, 'f'},
                             {"nodes", required_argument, nullptr, 'n'},
                             {"nranks", required_argument, nullptr, 'r'},
                             {"host-memory", no_argument, nullptr, 'm'},
                             {"json", no_argument, nullptr, 'j'},
                             {"dump-xml", no_argument, nullptr, 'x'},
                             {"plan", required_argument, nullptr, 'p'},
                             {"rank", required_argument, nullptr, 'k'},
                             {"root", required_argument, nullptr, 'o'},
                             {"help", no_argument, nullptr, 'h'},
                             {nullptr, 0, nullptr, 0}};
  try {
    for (int c; (c = getopt_long(argc, argv, "f:n:r:mjxp:k:o:h", longOpts, nullptr)) != -1;) {
      switch (c) {
        case 'f': topoFile = optarg; break;
        case 'n': nodes = parseCount("--nodes", optarg, 1); break;
        case 'r': nranks = parseCount("--nranks", optarg, 1); break;
        case 'm': hostMemory = true; break;
        case 'j': json = true; break;
        case 'x': dumpXml = true; break;
        case 'p':
          plan = true;
          planColl = optarg;
          break;
        case 'k': rank = parseCount("--rank", optarg, 0); break;
        case 'o': root = parseCount("--root", optarg, 0); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
      }
    }
    const int positional = argc - optind;
    if (positional != (plan ? 1 : 0)) {
      if (plan) fprintf(stderr, "loom-topo: --plan takes a collective and a size in bytes\n");
      else fprintf(stderr, "loom-topo: unexpected argument '%s'\n", argv[optind]);
      usage(stderr);
      return 2;
    }
    if (plan && (json || dumpXml)) {
      fprintf(stderr, "loom-topo: --plan prints text; it does not combine with --json or --dump-xml\n");
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
    if (rank >= nranks) LOOM_THROW(kInvalidArgument, "--rank %d: the job has ranks 0..%d", rank, nranks - 1);
    if (root >= nranks) LOOM_THROW(kInvalidArgument, "--root %d: the job has ranks 0..%d", root, nranks - 1);

    int local = (nranks + nodes - 1) / nodes;
    const auto [slot, depth] = fifoShape();
    algo::NodeModel model = algo::buildNodeModel(sys, local, host);
    // The NCCL tuner plugin a communicator of this job would load adjusts the choices too.
    std::unique_ptr<TunerPlugin> tuner = TunerPlugin::open(0, nranks, nodes, nranks / nodes, local);
    JobContexts job(JobContexts::contiguous(nranks, nodes), model, slot, depth, tuner.get());
    if (plan) {
      if (tuner) printf("tuner plugin: %s (NCCL_TUNER_PLUGIN)\n", tuner->describe().c_str());
      const Collective coll = parseCollective(planColl);
      const size_t bytes = parseSize(argv[optind], "--plan size");
      // Four-byte elements (nccl-tests' default float); the size is nccl-tests' (the
      // whole gathered / scattered buffer for all-gather and reduce-scatter).
      const size_t perRank = bytes / static_cast<size_t>(modelBytes(coll, 1, nranks));
      CollRequest req{coll, perRank / 4, 4, root};
      return tools::printPlan(stdout, req, job, rank, host) ? 0 : 1;
    }

    tools::Report r;
    r.sys = &sys;
    r.nodes = nodes;
    r.nranks = nranks;
    r.hostMemory = host;
    r.model = model;
    if (tuner) r.tunerPlugin = tuner->describe();
    if (!host) {
      std::vector<int> used;
      for (int g = 0; g < std::min(local, sys.gpuCount()); ++g) used.push_back(g);
      r.rings = topo::searchRings(sys, used);
      if (nodes > 1 && !r.rings.rings.empty()) r.railRings = topo::railRings(sys, r.rings.rings.front());
    }
    if (nodes > 1) r.trees = topo::doubleBinaryTree(nodes);
    tabulate(r, job);
    if (json) fputs(tools::toJson(r).c_str(), stdout);
    else tools::printText(stdout, r);
    return 0;
  } catch (const Error& e) {
    fprintf(stderr, "loom-topo: %s\n", e.what());
    return 1;
  }
}
