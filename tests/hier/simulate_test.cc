// The plan simulator (algo/simulate): every algorithm's plans of every collective it
// serves run to the exact result on one and several hosts and channel counts; and the
// simulator catches what it exists to catch (size mismatches, ranks left waiting, FIFOs
// too small for a one-shot, a wrong partial-result flag, out-of-bounds scratch).
#include <gtest/gtest.h>

#include <string>

#include "algo/direct.h"
#include "algo/ring.h"
#include "algo/simulate.h"
#include "algo/tree.h"
#include "topo/load.h"

namespace loom {
namespace {

const topo::System& cpuOnly() {
  static const topo::System s = topo::loadSystemFile(LOOM_TOPO_FIXTURES "/cpu_only.xml");
  return s;
}

JobContexts job(const std::vector<int>& hostOf, size_t slot = 256 << 10, int depth = 8) {
  int local = 0;
  for (int h : hostOf) local = std::max(local, static_cast<int>(std::count(hostOf.begin(), hostOf.end(), h)));
  return JobContexts(hostOf, algo::buildNodeModel(cpuOnly(), local, true), slot, depth);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Simulate, EveryAlgorithmAndChannelCountGivesTheExactResult) {
  const std::vector<std::vector<int>> layouts = {{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0, 0}, {0, 0, 1, 1}, {0, 1, 1}};
  const Collective colls[] = {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                              Collective::kBroadcast, Collective::kReduce};
  size_t runs = 0;
  for (const auto& hostOf : layouts) {
    JobContexts j = job(hostOf, 4096, 4);  // small FIFOs: many pieces and slices
    const int n = j.nranks();
    for (Collective coll : colls)
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{5000}})
        for (int a = 0; a < kAlgoCount; ++a)
          for (int channels : {1, 2, 3}) {
            const Algorithm algo = static_cast<Algorithm>(a);
            CollRequest req{coll, count, 4, n - 1};
            if (!canServe(algo, req, j[0])) continue;
            Selection sel = selectionFor(req, j[0], algo);
            sel.channels = channels;
            SimReport r = simulate(req, j, sel);
            ASSERT_EQ(r.error, "") << collectiveName(coll) << "/" << algorithmName(algo) << " count " << count << " on "
                                   << n << " ranks, " << channels << " channel(s)";
            ASSERT_TRUE(r.dataChecked);
            ++runs;
          }
  }
  EXPECT_GT(runs, 500u);
}

TEST(Simulate, ReportsSelectionStatsAndPrediction) {
  JobContexts j = job({0, 0, 0, 0});
  CollRequest req{Collective::kAllReduce, 1 << 18, 4, 0};  // 1 MiB
  SimReport r = simulate(req, j);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.selection, select(req, j[0]));
  EXPECT_DOUBLE_EQ(r.predictedUs, estimateMicros({req}, j[0]));
  ASSERT_EQ(r.stats.size(), 4u);
  ASSERT_EQ(r.plans.size(), 4u);
  // Whatever the algorithm, an all-reduce sends and receives the same total.
  size_t sent = 0, received = 0;
  for (const SimStats& s : r.stats) {
    sent += s.bytesSent;
    received += s.bytesReceived;
    EXPECT_GT(s.steps, 0u);
  }
  EXPECT_EQ(sent, received);
  // The ring sends 2(n-1)/n of the buffer per rank, all of it to its successor.
  SimReport ring = simulate(req, j, selectionFor(req, j[0], Algorithm::kRing));
  ASSERT_EQ(ring.error, "");
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(ring.stats[rank].bytesSent, size_t{2} * 3 * (1 << 20) / 4);
    EXPECT_EQ(ring.stats[rank].bytesTo[(rank + 1) % 4], ring.stats[rank].bytesSent);
  }
  // Too large to hold: sizes and order only.
  SimReport big = simulate({Collective::kAllReduce, size_t{1} << 26, 4, 0}, j);
  EXPECT_EQ(big.error, "");
  EXPECT_FALSE(big.dataChecked);
}

// Two ranks that exchange `a` and `b` bytes: both send, then both receive.
std::vector<Plan> exchange(size_t a, size_t b, bool sendFirst = true) {
  std::vector<Plan> plans(2);
  for (int r = 0; r < 2; ++r) {
    plans[r].channels.resize(1);
    PlanBuilder pb(plans[r].channels[0], 1 - r, 1 - r);
    size_t bytes = r == 0 ? a : b;
    if (sendFirst) pb.send(sendBuf(0), bytes);
    pb.recv(recvBuf(0), bytes);
    if (!sendFirst) pb.send(sendBuf(0), bytes);
  }
  return plans;
}

TEST(Simulate, CatchesBrokenPlans) {
  SimOptions opt;
  opt.eltSize = 8;
  opt.slotBytes = 64;
  opt.depth = 2;
  std::vector<SimBuffers> bufs(2);
  for (auto& b : bufs) {
    b.send.assign(16, 1);
    b.recv.assign(16, 0);
  }
  EXPECT_EQ(runPlans(exchange(128, 128), bufs, opt), "");
  EXPECT_EQ(bufs[1].recv[15], 1);
  // The two ends disagree on a message's size.
  EXPECT_TRUE(contains(runPlans(exchange(128, 120), bufs, opt), "sent 64 bytes where 56 were expected"));
  // Both wait for the other.
  std::string err = runPlans(exchange(64, 64, false), bufs, opt);
  EXPECT_TRUE(contains(err, "no rank can move")) << err;
  EXPECT_TRUE(contains(err, "rank 0 channel 0 step 0 (recv of 64 bytes) waits for rank 1")) << err;
  // Both send more than a FIFO holds before receiving: fine with unbounded FIFOs, a
  // deadlock with the real ones.
  bufs[0].send.assign(64, 1);
  bufs[1].send.assign(64, 1);
  bufs[0].recv.assign(64, 0);
  bufs[1].recv.assign(64, 0);
  err = runPlans(exchange(512, 512), bufs, opt);
  EXPECT_TRUE(contains(err, "waits for room toward rank")) << err;
  SimOptions unbounded = opt;
  unbounded.depth = 0;
  EXPECT_EQ(runPlans(exchange(512, 512), bufs, unbounded), "");
  // A receive into memory the plan does not have.
  err = runPlans(exchange(1024, 1024), bufs, unbounded);
  EXPECT_TRUE(contains(err, "lies outside the 512-byte buffer")) << err;
}

// The one-shot all-reduce sends everything before it receives: beyond a FIFO's capacity
// it would hang, which is why canServe() keeps it to messages that fit.
TEST(Simulate, OneShotNeedsTheFifoToHoldItsMessage) {
  JobContexts j = job({0, 0, 0}, 4096, 4);
  CollRequest fits{Collective::kAllReduce, 4096, 4, 0}, tooBig{Collective::kAllReduce, 4097, 4, 0};
  EXPECT_TRUE(canServe(Algorithm::kDirect, fits, j[0]));
  EXPECT_FALSE(canServe(Algorithm::kDirect, tooBig, j[0]));
  EXPECT_EQ(simulate(fits, j, selectionFor(fits, j[0], Algorithm::kDirect)).error, "");
  std::string err = simulate(tooBig, j, selectionFor(tooBig, j[0], Algorithm::kDirect)).error;
  EXPECT_TRUE(contains(err, "no rank can move")) << err;
}

// A size-free plan (the ring's) is built once and runs any count: its loops hold one
// round of steps whatever the size, and written out for each count it gives the exact
// all-reduce and all-gather, also with shares of the buffer on two channels.
TEST(Simulate, OneSizeFreePlanRunsEveryCount) {
  const int n = 3;
  for (int channels : {1, 2}) {
    std::vector<Plan> ar, ag;
    for (int r = 0; r < n; ++r) {
      Ring ring = Ring::identity(n, r);
      ar.push_back(ringAllReduce({ring}, 4, 4096, channels));
      ag.push_back(ringAllGather({ring}, r, 4, 4096, channels));
      ASSERT_TRUE(ar[r].sizeFree());
      ASSERT_EQ(ar[r].channels[0].loops.size(), 1u);
      EXPECT_EQ(ar[r].channels[0].loops[0].body.size(), size_t{2 * n - 1});  // one round
      EXPECT_TRUE(ar[r].channels[0].steps.empty());
    }
    for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{100003}}) {
      std::vector<Plan> arOut, agOut;
      std::vector<SimBuffers> arBufs(n), agBufs(n);
      for (int r = 0; r < n; ++r) {
        arOut.push_back(expandPlan(ar[r], count, 4));
        agOut.push_back(expandPlan(ag[r], count, 4));
        // StepSeq computes the same steps one at a time.
        StepSeq seq(ar[r], 0, count, 4);
        ASSERT_EQ(seq.size(), arOut[r].channels[0].steps.size());
        size_t total = 0;
        for (const Step& s : arOut[r].channels[0].steps) total += s.bytes;
        EXPECT_EQ(seq.bytes(), total);
        for (size_t i = 0; i < seq.size(); ++i) {
          EXPECT_EQ(seq[i].bytes, arOut[r].channels[0].steps[i].bytes);
          EXPECT_EQ(seq[i].src.offset, arOut[r].channels[0].steps[i].src.offset);
        }
        arBufs[r].send.resize(count);
        agBufs[r].send.resize(count);
        for (size_t i = 0; i < count; ++i) {
          arBufs[r].send[i] = r + 1 + static_cast<double>(i % 13);
          agBufs[r].send[i] = r * 1000000.0 + static_cast<double>(i);
        }
        arBufs[r].recv.assign(count, -1);
        agBufs[r].recv.assign(count * n, -1);
      }
      SimOptions opt;
      opt.eltSize = 4;
      opt.slotBytes = 4096;
      opt.depth = 4;
      ASSERT_EQ(runPlans(arOut, arBufs, opt), "") << count;
      ASSERT_EQ(runPlans(agOut, agBufs, opt), "") << count;
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(arBufs[r].recv[i], n * (n + 1) / 2 + n * static_cast<double>(i % 13)) << count << " " << i;
          for (int q = 0; q < n; ++q)
            ASSERT_EQ(agBufs[r].recv[q * count + i], q * 1000000.0 + static_cast<double>(i)) << count;
        }
    }
  }
  // Not written out: the simulator asks for an explicit plan.
  std::vector<SimBuffers> bufs(1);
  EXPECT_TRUE(contains(runPlans({ringAllReduce({Ring::identity(1, 0)}, 4, 4096)}, bufs, SimOptions{}), "size-free"));
}

// The tree's broadcast trails its reduction by two chunks: one loop whose broadcast steps
// lag. Written out for shares of fewer, as many and more chunks than the lag, the steps
// come in the pipeline's order (round k: reduce chunk k, broadcast chunk k - 2), StepSeq
// reaches any step directly, and every rank gets the exact all-reduce.
TEST(Simulate, LaggingLoopRunsTheTreePipelineForEveryCount) {
  const int n = 5, channels = 2;
  const size_t chunkElems = 1024;
  std::vector<Plan> plans;
  for (int r = 0; r < n; ++r) {
    plans.push_back(treeAllReduce(n, r, 4, chunkElems * 4, channels));
    ASSERT_TRUE(plans[r].sizeFree());
    for (const ChannelPlan& ch : plans[r].channels) {
      ASSERT_EQ(ch.loops.size(), 1u);
      EXPECT_EQ(ch.loops[0].lag, 2);
    }
  }
  for (size_t count : {size_t{1}, size_t{2048}, size_t{3000}, size_t{100003}}) {
    std::vector<Plan> out;
    std::vector<SimBuffers> bufs(n);
    for (int r = 0; r < n; ++r) {
      out.push_back(expandPlan(plans[r], count, 4));
      for (int c = 0; c < channels; ++c) {
        const Loop& loop = plans[r].channels[c].loops[0];
        const Share share = channelShare(count, channels, c);
        const size_t chunks = (share.size() + chunkElems - 1) / chunkElems;
        // The order the pipeline asks for, from the loop body.
        std::vector<std::pair<size_t, size_t>> want;  // (body index, chunk)
        for (size_t round = 0; round < chunks + 2; ++round)
          for (size_t k = 0; k < loop.body.size(); ++k) {
            const size_t lag = loop.body[k].lag;
            if (round >= lag && round - lag < chunks) want.push_back({k, round - lag});
          }
        const std::vector<Step>& got = out[r].channels[c].steps;
        ASSERT_EQ(got.size(), want.size()) << count;
        StepSeq seq(plans[r], c, count, 4);
        for (size_t i = got.size(); i-- > 0;) {  // backwards: StepSeq needs no walk from 0
          const Step& body = loop.body[want[i].first];
          const size_t at = share.begin + want[i].second * chunkElems;
          EXPECT_EQ(got[i].op, body.op) << count << " step " << i;
          EXPECT_EQ(got[i].recvPeer, body.recvPeer);
          EXPECT_EQ(got[i].bytes, (std::min(share.end, at + chunkElems) - at) * 4);
          const BufRef& ref = body.src.buf != Buf::kNone ? got[i].src : got[i].dst;
          EXPECT_EQ(ref.offset, at * 4) << count << " step " << i;
          EXPECT_EQ(seq[i].bytes, got[i].bytes);
          EXPECT_EQ(seq[i].dst.offset, got[i].dst.offset);
        }
      }
      bufs[r].send.resize(count);
      for (size_t i = 0; i < count; ++i) bufs[r].send[i] = r + 1 + static_cast<double>(i % 11);
      bufs[r].recv.assign(count, -1);
    }
    SimOptions opt;
    opt.eltSize = 4;
    opt.slotBytes = chunkElems * 4;
    opt.depth = 4;
    ASSERT_EQ(runPlans(out, bufs, opt), "") << count;
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(bufs[r].recv[i], n * (n + 1) / 2 + n * static_cast<double>(i % 11)) << count << " " << i;
  }
}

// A reduction's pre-scaling and final step are modelled, so a partial-result flag set or
// dropped by mistake changes the result.
TEST(Simulate, CatchesAWrongPartialResultFlag) {
  JobContexts j = job({0, 0, 0});
  CollRequest req{Collective::kAllReduce, 3000, 4, 0};
  Selection sel = selectionFor(req, j[0], Algorithm::kRing);
  ASSERT_EQ(simulate(req, j, sel).error, "");
  std::vector<Plan> plans;
  for (int r = 0; r < 3; ++r) plans.push_back(expandPlan(buildPlan(req, j[r], sel), req.count, req.eltSize));
  // Rank 1's final receive applies no final step: its result misses the post-op.
  for (Step& s : plans[1].channels[0].steps)
    if (s.op == StepOp::kRecv) s.flags |= kDstPartial;
  std::vector<SimBuffers> bufs(3);
  for (int r = 0; r < 3; ++r) {
    bufs[r].send.assign(3000, r + 1);
    bufs[r].recv.assign(3000, 0);
  }
  SimOptions opt;
  opt.eltSize = 4;
  opt.scaledReduction = true;
  ASSERT_EQ(runPlans(plans, bufs, opt), "");
  EXPECT_EQ(bufs[0].recv[0], 2 * (1 + 2 + 3) + 0.5);
  bool wrong = false;
  for (double v : bufs[1].recv) wrong |= v != 2 * (1 + 2 + 3) + 0.5;
  EXPECT_TRUE(wrong);
}

TEST(Simulate, CatchesScratchTooSmall) {
  JobContexts j = job({0, 0, 1, 1});
  CollRequest req{Collective::kReduceScatter, 1000, 4, 0};
  Selection sel = selectionFor(req, j[0], Algorithm::kHierarchical);
  std::vector<Plan> plans;
  std::vector<SimBuffers> bufs(4);
  for (int r = 0; r < 4; ++r) {
    plans.push_back(buildPlan(req, j[r], sel));
    ASSERT_GT(plans[r].scratchBytes, 0u);
    bufs[r].send.assign(4000, 1);
    bufs[r].recv.assign(1000, 0);
    bufs[r].scratch.assign(plans[r].scratchBytes / 4 - 1, 0);  // one element short
  }
  SimOptions opt;
  opt.eltSize = 4;
  std::string err = runPlans(plans, bufs, opt);
  EXPECT_TRUE(contains(err, "scratch+")) << err;
  EXPECT_TRUE(contains(err, "lies outside")) << err;
}

}  // namespace
}  // namespace loom
