// The device executor's plan interpreter (kernels/interp.h) without a communicator:
//  - a plan written flat (engine/flat_plan.h) and moved elsewhere in memory yields, step
//    for step, what StepSeq yields from the plan itself, for every algorithm's plans of
//    every collective it serves, on one and two hosts, 1-3 channels, edge counts;
//  - the interpreter runs those plans to the exact result on FIFOs laid out as on a GPU
//    (tail, slot sizes and slots in the receiver's memory, the head in the sender's), one
//    thread per rank and channel as a GPU runs one block per channel.
// The matrix of tests/collectives/interp_test.cc runs it over real transports.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "interp_harness.h"

namespace loom {
namespace {

using namespace interptest;

bool sameRef(const BufRef& a, const BufRef& b) { return a.buf == b.buf && a.offset == b.offset; }

std::string stepStr(const Step& s) {
  return "op " + std::to_string(int(s.op)) + " to " + std::to_string(s.sendPeer) + " from " +
         std::to_string(s.recvPeer) + " conn " + std::to_string(s.conn) + " bytes " +
         std::to_string(s.bytes) + " src " + std::to_string(int(s.src.buf)) + "+" +
         std::to_string(s.src.offset) + " dst " + std::to_string(int(s.dst.buf)) + "+" +
         std::to_string(s.dst.offset) + " flags " + std::to_string(s.flags);
}

TEST(FlatPlan, YieldsTheStepsOfStepSeqForEveryPlan) {
  const std::vector<std::vector<int>> layouts = {{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0, 0},
                                                 {0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 1, 1}, {0, 1, 1}};
  size_t plans = 0, steps = 0;
  for (const auto& hostOf : layouts) {
    JobContexts j = job(hostOf, 4096, 4);
    const int n = j.nranks();
    for (Collective coll : kColls)
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{5000}, size_t{100003}})
        for (int a = 0; a < kAlgoCount; ++a)
          for (int channels : {1, 2, 3}) {
            const Algorithm algo = static_cast<Algorithm>(a);
            CollRequest req{coll, count, 4, n - 1};
            if (!canServe(algo, req, j[0])) continue;
            Selection sel = selectionFor(req, j[0], algo);
            sel.channels = channels;
            for (int r = 0; r < n; ++r) {
              const Plan plan = buildPlan(req, j[r], sel);
              const FlatPlanBlock block(plan);
              // Moved: the block holds offsets only.
              std::vector<uint64_t> moved(block.bytes() / 8 + 1);
              std::memcpy(moved.data() + 1, block.data(), block.bytes());
              const FlatPlan& flat = *reinterpret_cast<const FlatPlan*>(moved.data() + 1);
              ASSERT_EQ(flat.magic, kFlatPlanMagic);
              ASSERT_EQ(flat.nChannels, plan.channels.size());
              EXPECT_EQ(flat.scratchBytes, plan.scratchBytes);
              for (size_t c = 0; c < plan.channels.size(); ++c) {
                const StepSeq want(plan, c, count, 4);
                const auto got = flatSteps(flat, c, count, 4);
                const std::string where = std::string(collectiveName(coll)) + "/" + algorithmName(algo) +
                                          " count " + std::to_string(count) + " rank " + std::to_string(r) +
                                          " of " + std::to_string(n) + " channel " + std::to_string(c);
                ASSERT_EQ(got.size(), want.size()) << where;
                ASSERT_EQ(got.bytes(), want.bytes()) << where;
                for (size_t i = 0; i < want.size(); ++i) {
                  const Step w = want[i], g = got[i];
                  ASSERT_TRUE(g.op == w.op && g.sendPeer == w.sendPeer && g.recvPeer == w.recvPeer &&
                              g.conn == w.conn && g.bytes == w.bytes && g.flags == w.flags &&
                              sameRef(g.src, w.src) && sameRef(g.dst, w.dst))
                      << where << " step " << i << ": " << stepStr(g) << " where StepSeq has " << stepStr(w);
                }
                steps += want.size();
              }
              ++plans;
            }
          }
  }
  EXPECT_GT(plans, 2000u);
  EXPECT_GT(steps, 100000u);
}

class Interp : public testing::TestWithParam<bool> {};

// Simple, and LL (kernels/ll.h) with some connections carrying plain slots.
TEST_P(Interp, RunsEveryAlgorithmToTheExactResultOnDeviceLayoutFifos) {
  const bool ll = GetParam();
  const std::vector<std::vector<int>> layouts = {{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0, 0}, {0, 0, 1, 1}};
  const size_t slot = 4096;
  const int depth = 4;
  size_t runs = 0;
  for (const auto& hostOf : layouts) {
    // Plans count on a step's pieces fitting the FIFOs: with LL they are cut for its payload.
    JobContexts j = job(hostOf, ll ? llCapacity(slot) : slot, depth);
    const int n = j.nranks();
    for (Collective coll : kColls)
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{5000}})
        for (int a = 0; a < kAlgoCount; ++a)
          for (int channels : {1, 2}) {
            const Algorithm algo = static_cast<Algorithm>(a);
            const int root = n - 1;
            CollRequest req{coll, count, 4, root};
            if (!canServe(algo, req, j[0])) continue;
            Selection sel = selectionFor(req, j[0], algo);
            sel.channels = channels;
            const bool gathers = coll == Collective::kAllGather;
            const bool scatters = coll == Collective::kReduceScatter;
            const size_t inCount = scatters ? count * n : count, outCount = gathers ? count * n : count;
            std::vector<Plan> plans;
            std::vector<std::vector<float>> in(n), out(n), scratch(n);
            std::vector<TableEnv> envs(n);
            for (int r = 0; r < n; ++r) {
              plans.push_back(buildPlan(req, j[r], sel));
              in[r].resize(inCount);
              for (size_t i = 0; i < inCount; ++i) in[r][i] = float(r + 1) + float(i % 17);
              out[r].assign(outCount, -1.0f);
              scratch[r].resize(plans[r].scratchBytes / 4 + 1);
              envs[r].sendbuf = in[r].data();
              envs[r].recvbuf = out[r].data();
              envs[r].scratch = scratch[r].data();
              envs[r].rank = r;
            }
            const Reducer red = Reducer::make(7 /* float32 */, 0 /* sum */, n);
            const std::string where = std::string(collectiveName(coll)) + "/" + algorithmName(algo) + " count " +
                                      std::to_string(count) + " on " + std::to_string(n) + " ranks, " +
                                      std::to_string(channels) + " channel(s)";
            ASSERT_TRUE(runInterp(plans, count, red, envs, slot, depth, ll)) << where << ": a channel never finished";
            // The sum over ranks of (r + 1) + i % 17.
            auto sum = [&](size_t i) { return float(n * (n + 1) / 2) + float(n) * float(i % 17); };
            for (int r = 0; r < n; ++r) {
              if (coll == Collective::kReduce && r != root) continue;
              for (size_t i = 0; i < outCount; ++i) {
                float want = 0;
                switch (coll) {
                  case Collective::kAllReduce:
                  case Collective::kReduce: want = sum(i); break;
                  case Collective::kReduceScatter: want = sum(r * count + i); break;
                  case Collective::kAllGather: want = float(i / count + 1) + float((i % count) % 17); break;
                  case Collective::kBroadcast: want = float(root + 1) + float(i % 17); break;
                  default: break;
                }
                ASSERT_EQ(out[r][i], want) << where << ": rank " << r << " element " << i;
              }
            }
            ++runs;
          }
  }
  EXPECT_GT(runs, 150u);
}

INSTANTIATE_TEST_SUITE_P(Protocols, Interp, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool>& info) { return info.param ? "LL" : "Simple"; });

}  // namespace
}  // namespace loom
