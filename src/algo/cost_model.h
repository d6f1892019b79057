// Alpha-beta cost model: predicted time of one collective for an algorithm and protocol,
// given what the topology says about one host (NodeModel) and how many hosts there are.
//
//   time = base latency (launch / hand-off)
//        + sum over steps of the per-step latency of the link class the step crosses
//        + bytes moved per rank / effective bandwidth of the bottleneck
//
// Constants follow NCCL's published tuning tables (src/graph/tuning.cc: base latencies,
// per-hop latencies for NVLink/PCI/NET, LL and LL128 efficiencies and caps) and NCCL's
// topology bandwidths (topo.h: NVLink per link, PCIe per lane, CPU interconnects), so that
// the model lands on the figures NVIDIA and users publish (docs/topology.md). Host-memory
// (shared memory) and TCP socket classes are Loom's own estimates and are marked as such.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "algo/collective.h"
#include "topo/system.h"

namespace loom::algo {

enum class LinkClass : int { kNvLink = 0, kPcie, kShm, kNetIb, kNetSocket, kCount };
const char* linkClassName(LinkClass c);

// What the tuner needs to know about one host for a given number of local ranks.
struct NodeModel {
  int localRanks = 1;
  bool hostMemory = false;     // buffers in host memory: the CPU executor and shm
  LinkClass intra = LinkClass::kShm;
  int sm = 0;                  // smallest compute capability among the GPUs used (0: none)
  double ringBw = 0;           // GB/s, intra-host rings (bus bandwidth of a ring collective)
  double portBw = 0;           // GB/s, one rank's injection bandwidth (direct, halving-doubling)
  double allToAllBw = 0;       // GB/s per rank when every rank sends to every other at once
  std::vector<double> hdBw;    // GB/s per rank, halving-doubling step k (partner distance 2^k)
  int maxChannels = 1;         // parallel pipelines the hardware can keep busy
  double perChannelBw = 0;     // GB/s one channel moves (one CUDA block / one CPU thread)
  LinkClass inter = LinkClass::kNetSocket;
  double netBw = 0;            // GB/s per host across the network, all rails, after efficiency
  int rails = 0;               // NICs the host's ranks use
  // GPU indices of the intra-host rings the topology search found, best first: channel c
  // rides ringOrders[c % size] (empty for host memory: ranks in local order).
  std::vector<std::vector<int>> ringOrders;
  std::string notes;           // assumptions made (shown by loom-topo and TUNING logs)
  // The connection FIFOs (LOOM_SLOT_BYTES x LOOM_FIFO_DEPTH): host plans cut their steps to
  // fit them; GPU plans keep NCCL's chunks, cut to fit them too where they are smaller (the
  // device executor's FIFOs have the host's shape).
  size_t fifoSlotBytes = 256 << 10;
  int fifoDepth = 8;
};

// Builds the host model for `localRanks` ranks per host. GPUs 0..localRanks-1 carry the
// ranks unless `hostMemory` (or the host has no GPU), in which case ranks are processes
// sharing memory.
NodeModel buildNodeModel(const topo::System& sys, int localRanks, bool hostMemory);

struct Estimate {
  bool feasible = false;
  std::string why;          // why not, when infeasible
  double us = 0;            // predicted time
  double latencyUs = 0;     // the alpha part of `us`
  double busBw = 0;         // GB/s implied, nccl-tests' definition for the collective
  int channels = 0;         // planShape()'s, which the plan builders get
  size_t chunkBytes = 0;    // per pipeline step and channel
};

// How an algorithm's plan is cut for a message: `channels` pipelines that run at once, each
// on its own share of the buffer and its own connections, and the most one step of a
// channel carries (a step larger than a FIFO slot still streams through it slot by slot).
// These are what the plan builders are given, so the plan is the one the model priced.
struct PlanShape {
  int channels = 1;
  size_t chunkBytes = 0;
};
// `bytes` as for estimate(). One rank's plan is a local copy: one channel, uncut.
PlanShape planShape(const NodeModel& node, Collective coll, Algorithm algo, Protocol proto, size_t bytes,
                    int nranks);

// The most one step of a channel may carry for `algo`/`proto` on this executor's buffers:
// the chunk planShape() cuts the largest message into (2^40 bytes), before it shrinks
// chunks for smaller ones, as NCCL's buffer-based ceiling is its chunk before it shrinks.
// Host memory: half a FIFO for ring and halving-doubling exchanges (both ends send before
// they receive), two slots for the tree; GPU memory: a slot of the protocol, as NCCL's
// buffers. Chains (broadcast, reduce) and one-shot messages stream through the FIFO slot by
// slot, so their ceiling is the message. A tuner's chunk is clamped to it.
size_t chunkCeiling(const NodeModel& node, Collective coll, Algorithm algo, Protocol proto, int nranks);

// Whether the executor of this host model can move data in protocol `p` across `nnodes`
// hosts at all (the CPU executor only has Simple slots; LL128 needs NVLink and GPUDirect);
// `why` says why not.
bool protocolRuns(const NodeModel& node, Protocol p, int nnodes, std::string* why = nullptr);

// `bytes` is nccl-tests' "size" for the collective: the buffer for AllReduce, Broadcast,
// Reduce and SendRecv; the full (gathered / scattered / exchanged) buffer for AllGather,
// ReduceScatter, AlltoAll, Gather and Scatter.
Estimate estimate(const NodeModel& node, Collective coll, Algorithm algo, Protocol proto,
                  size_t bytes, int nranks, int nnodes);

// nccl-tests' bus bandwidth factor for a collective (2(n-1)/n for AllReduce, ...).
double busBwFactor(Collective coll, int nranks);

}  // namespace loom::algo
