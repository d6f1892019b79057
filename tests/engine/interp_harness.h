// What the interpreter's tests share (interp_test.cc on host threads, interp_cuda_test.cc
// on a GPU): plans of every algorithm, and the interpreter run on host threads over FIFOs
// laid out as on a GPU, which is also the GPU run's reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "algo/select.h"
#include "algo/simulate.h"
#include "engine/flat_plan.h"
#include "kernels/cpu_step_ops.h"
#include "kernels/interp.h"
#include "topo/load.h"
#include "transports/fifo.h"

namespace loom {
namespace interptest {

inline const topo::System& cpuOnly() {
  static const topo::System s = topo::loadSystemFile(LOOM_TOPO_FIXTURES "/cpu_only.xml");
  return s;
}

inline JobContexts job(const std::vector<int>& hostOf, size_t slot, int depth) {
  int local = 0;
  for (int h : hostOf) local = std::max(local, static_cast<int>(std::count(hostOf.begin(), hostOf.end(), h)));
  return JobContexts(hostOf, algo::buildNodeModel(cpuOnly(), local, true), slot, depth);
}


inline const Collective kColls[] = {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                             Collective::kBroadcast, Collective::kReduce};

// One directed connection laid out as a device connection: the receiver's block holds the
// control word (tail, slot sizes) and the slots, the sender's block the head.
struct DeviceLayoutConn {
  FifoCtrl ctrl{};                    // "receiver's memory"
  std::unique_ptr<char[]> slots;      // "receiver's memory"
  alignas(128) uint64_t head = 0;     // "sender's memory"
  FifoEnd send, recv;

  // Slots start zeroed, as a transport's fresh memory does: LL lines flag themselves.
  DeviceLayoutConn(size_t slotBytes, int depth) : slots(new char[slotBytes * depth]()) {
    for (FifoEnd* e : {&send, &recv}) {
      e->ctrl = &ctrl;
      e->slots = slots.get();
      e->slotBytes = slotBytes;
      e->depth = depth;
      e->headAt = &head;
    }
  }
};

// What a kernel's connection table gives one rank: its FIFO ends by (peer, conn). With LL
// on, the connections between ranks whose sum is a multiple of 3 carry plain slots (as a
// transport that ships slots would), the others LL lines.
struct TableEnv {
  int rank = 0;
  std::map<std::pair<int, int>, FifoEnd*> sends, recvs;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  void* scratch = nullptr;
  std::vector<char> stage[2];

  static bool lines(int a, int b) { return (a + b) % 3 != 0; }
  bool llRecv(int peer, int) const { return lines(peer, rank); }
  bool llSend(int peer, int) const { return lines(rank, peer); }
  void* llStage(int which, size_t bytes) {
    if (stage[which].size() < bytes || stage[which].empty()) stage[which].resize(bytes + 64);
    return stage[which].data();
  }

  FifoEnd* recvFifo(int peer, int conn) { return recvs.at({peer, conn}); }
  FifoEnd* sendFifo(int peer, int conn) { return sends.at({peer, conn}); }
  const char* ptr(BufRef r, size_t off) const { return bufAt(r, off, sendbuf, recvbuf, scratch); }
};

struct InterpOps : CpuStepOps {
  const void* received(FifoEnd& f, StepPiece& p) const {
    EXPECT_EQ(f.recvInfo().bytes, p.bytes);
    EXPECT_EQ(f.recvInfo().remote, 0u);
    return f.recvSlot();
  }
};

// Every connection the plans use, laid out as on a GPU, by (from, to, conn); each rank's
// ends go into its env's tables.
using Conns = std::map<std::tuple<int, int, int>, std::unique_ptr<DeviceLayoutConn>>;
inline Conns connectFifos(const std::vector<Plan>& plans, std::vector<TableEnv>& envs, size_t slotBytes,
                          int depth) {
  Conns conns;
  for (int r = 0; r < static_cast<int>(plans.size()); ++r) {
    std::vector<std::pair<int, int>> sends, recvs;
    plans[r].peers(&sends, &recvs);
    for (auto [p, c] : sends) {
      auto& x = conns[{r, p, c}];
      if (!x) x = std::make_unique<DeviceLayoutConn>(slotBytes, depth);
      envs[r].sends[{p, c}] = &x->send;
    }
    for (auto [p, c] : recvs) {
      auto& x = conns[{p, r, c}];
      if (!x) x = std::make_unique<DeviceLayoutConn>(slotBytes, depth);
      envs[r].recvs[{p, c}] = &x->recv;
    }
  }
  return conns;
}

// Each rank's plan written flat, as the kernel reads it.
inline std::vector<std::unique_ptr<FlatPlanBlock>> flatten(const std::vector<Plan>& plans) {
  std::vector<std::unique_ptr<FlatPlanBlock>> flat;
  for (const Plan& p : plans) flat.push_back(std::make_unique<FlatPlanBlock>(p));
  return flat;
}

// Runs every rank's plan with the interpreter, one thread per (rank, channel), over
// device-layout connections. False if a channel was still waiting after 20 s.
inline bool runInterp(const std::vector<Plan>& plans, size_t count, const Reducer& red, std::vector<TableEnv>& envs,
               size_t slotBytes, int depth, bool ll) {
  const int n = static_cast<int>(plans.size());
  const Conns conns = connectFifos(plans, envs, slotBytes, depth);
  const auto flat = flatten(plans);
  std::atomic<bool> stuck{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    for (size_t c = 0; c < plans[r].channels.size(); ++c)
      threads.emplace_back([&, r, c] {
        // Each "block" keeps its own copies of its FIFO ends, as a kernel's threads do.
        TableEnv env = envs[r];
        std::map<FifoEnd*, std::unique_ptr<FifoEnd>> mine;
        for (auto* m : {&env.sends, &env.recvs})
          for (auto& [k, e] : *m) {
            auto& copy = mine[e];
            if (!copy) copy = std::make_unique<FifoEnd>(*e);
            e = copy.get();
          }
        InterpOps ops;
        ops.red = &red;
        ChannelInterp<HostAtomics, TableEnv> in(flat[r]->plan(), c, count, red.eltSize, ll);
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (!in.done()) {
          if (in.ready(env)) {
            if (!in.run(env, ops, red.hasPost())) {
              ADD_FAILURE() << "rank " << r << " channel " << c << ": a piece of another size arrived";
              stuck.store(true);
              return;
            }
            continue;
          }
          if (stuck.load() || std::chrono::steady_clock::now() > deadline) {
            stuck.store(true);
            return;
          }
          std::this_thread::yield();
        }
      });
  for (auto& t : threads) t.join();
  return !stuck.load();
}

}  // namespace interptest
}  // namespace loom
