// The per-collective facts the tools print (counts, algbw and busbw factors, sweeps), and
// their fill/check logic run against an in-test reference implementation of each
// collective over n simulated ranks: correct results give #wrong 0, and every corrupted
// element is counted.
#include "bench/common/collectives.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace loom::bench {
namespace {

TEST(BenchCollectives, BusBandwidthFactorsAreNcclTests) {
  for (int n = 1; n <= 8; ++n) {
    const double ring = double(n - 1) / n;
    EXPECT_DOUBLE_EQ(allReduceCollective().busBwFactor(n), 2.0 * (n - 1) / n) << n;
    EXPECT_DOUBLE_EQ(allGatherCollective().busBwFactor(n), ring);
    EXPECT_DOUBLE_EQ(reduceScatterCollective().busBwFactor(n), ring);
    EXPECT_DOUBLE_EQ(broadcastCollective().busBwFactor(n), 1.0);
    EXPECT_DOUBLE_EQ(reduceCollective().busBwFactor(n), 1.0);
    EXPECT_DOUBLE_EQ(allToAllCollective().busBwFactor(n), ring);
    EXPECT_DOUBLE_EQ(sendRecvCollective().busBwFactor(n), 1.0);
    EXPECT_DOUBLE_EQ(gatherCollective().busBwFactor(n), ring);
    EXPECT_DOUBLE_EQ(scatterCollective().busBwFactor(n), ring);
    // algbw counts the per-rank block times n for the gathering/scattering collectives.
    EXPECT_DOUBLE_EQ(allReduceCollective().algBytesFactor(n), 1);
    EXPECT_DOUBLE_EQ(allGatherCollective().algBytesFactor(n), n);
    EXPECT_DOUBLE_EQ(reduceScatterCollective().algBytesFactor(n), n);
    EXPECT_DOUBLE_EQ(broadcastCollective().algBytesFactor(n), 1);
    EXPECT_DOUBLE_EQ(reduceCollective().algBytesFactor(n), 1);
    EXPECT_DOUBLE_EQ(allToAllCollective().algBytesFactor(n), n);
    EXPECT_DOUBLE_EQ(sendRecvCollective().algBytesFactor(n), 1);
    EXPECT_DOUBLE_EQ(gatherCollective().algBytesFactor(n), n);
    EXPECT_DOUBLE_EQ(scatterCollective().algBytesFactor(n), n);
  }
  EXPECT_DOUBLE_EQ(allReduceCollective().busBwFactor(4), 1.5);
  EXPECT_DOUBLE_EQ(allGatherCollective().busBwFactor(4), 0.75);
}

void expectCounts(const Counts& c, size_t send, size_t recv, size_t param, size_t sendOff,
                  size_t recvOff) {
  EXPECT_EQ(c.sendCount, send);
  EXPECT_EQ(c.recvCount, recv);
  EXPECT_EQ(c.paramCount, param);
  EXPECT_EQ(c.sendInplaceOffset, sendOff);
  EXPECT_EQ(c.recvInplaceOffset, recvOff);
}

TEST(BenchCollectives, CountsRoundPerRankBlocksTo16Bytes) {
  // 1000 floats over 3 ranks: 333 per rank, rounded down to a multiple of 4 floats.
  expectCounts(allReduceCollective().counts(1000, 4, 3), 1000, 1000, 1000, 0, 0);
  expectCounts(allGatherCollective().counts(1000, 4, 3), 332, 996, 332, 332, 0);
  expectCounts(reduceScatterCollective().counts(1000, 4, 3), 996, 332, 332, 0, 332);
  expectCounts(broadcastCollective().counts(1000, 4, 3), 1000, 1000, 1000, 0, 0);
  expectCounts(reduceCollective().counts(1000, 4, 3), 1000, 1000, 1000, 0, 0);
  expectCounts(allToAllCollective().counts(1000, 4, 3), 996, 996, 332, 0, 0);
  expectCounts(sendRecvCollective().counts(1000, 4, 3), 1000, 1000, 1000, 0, 0);
  expectCounts(gatherCollective().counts(1000, 4, 3), 332, 996, 332, 332, 0);
  expectCounts(scatterCollective().counts(1000, 4, 3), 996, 332, 332, 0, 332);
  // Bytes: multiples of 16 elements; doubles: of 2.
  expectCounts(allGatherCollective().counts(1000, 1, 3), 320, 960, 320, 320, 0);
  expectCounts(allGatherCollective().counts(1000, 8, 3), 332, 996, 332, 332, 0);
  // Too small to split: nccl-tests runs (and prints) a zero-count call.
  expectCounts(allGatherCollective().counts(2, 4, 2), 0, 0, 0, 0, 0);
}

TEST(BenchCollectives, SweepsMatchNcclTests) {
  struct Shape {
    bool ops, roots, usesOp, inPlaceChecked;
  };
  std::map<std::string, Shape> want = {
      {"all_reduce_perf", {true, false, true, true}},
      {"all_gather_perf", {false, false, false, true}},
      {"reduce_scatter_perf", {true, false, true, true}},
      {"broadcast_perf", {false, true, false, true}},
      {"reduce_perf", {true, true, true, true}},
      {"alltoall_perf", {false, false, false, false}},
      {"sendrecv_perf", {true, false, false, false}},
      {"gather_perf", {false, true, false, true}},
      {"scatter_perf", {false, true, false, true}},
  };
  ASSERT_EQ(allCollectives().size(), want.size());
  for (const NamedCollective& c : allCollectives()) {
    const Shape& s = want.at(c.tool);
    EXPECT_EQ(c.get().sweepsOps(), s.ops) << c.tool;
    EXPECT_EQ(c.get().sweepsRoots(), s.roots) << c.tool;
    EXPECT_EQ(c.get().usesOp(), s.usesOp) << c.tool;
    EXPECT_EQ(c.get().checksInPlace(), s.inPlaceChecked) << c.tool;
  }
}

// ---- n simulated ranks ----

struct Sim {
  const Collective& coll;
  int n;
  int root;
  bool inPlace;
  const TypeInfo* type;
  const OpInfo* op;
  Counts counts;
  std::vector<std::vector<char>> send, recv;
  std::vector<DataContext> ctx;

  Sim(const Collective& c, int nranks, int rootRank, bool place, const TypeInfo* t, const OpInfo* o,
      size_t bytes)
      : coll(c), n(nranks), root(rootRank), inPlace(place), type(t), op(o) {
    counts = coll.counts(bytes / t->size, t->size, n);
    for (int r = 0; r < n; ++r) {
      send.emplace_back(bytes + 64, char(0x11));
      recv.emplace_back(bytes + 64, char(0x22));  // garbage the fill must clear
    }
    for (int r = 0; r < n; ++r)
      ctx.push_back(DataContext{type, op, r, n, root, inPlace, 12345, counts, send[r].data(),
                                recv[r].data()});
  }

  double reduce(const std::vector<double>& v) const {
    double acc = v[0] * (op->preMulSum ? preMulScalar(0) : 1);
    for (int r = 1; r < n; ++r) {
      double x = v[r];
      if (op->op == ncclProd)
        acc *= x;
      else if (op->op == ncclMax)
        acc = std::max(acc, x);
      else if (op->op == ncclMin)
        acc = std::min(acc, x);
      else
        acc += op->preMulSum ? x * preMulScalar(r) : x;
    }
    if (op->op == ncclAvg) {
      acc /= n;
      if (type->kind != TypeKind::kFloat) acc = std::trunc(acc);
    }
    return acc;
  }

  // The reference collective, reading every rank's input before writing any result.
  void execute() {
    const size_t es = type->size;
    std::vector<std::vector<char>> in(n);
    for (int r = 0; r < n; ++r)
      in[r].assign(ctx[r].input(), ctx[r].input() + counts.sendCount * es);
    auto copyOut = [&](int dst, size_t dstElt, int src, size_t srcElt, size_t elts) {
      memcpy(ctx[dst].result() + dstElt * es, in[src].data() + srcElt * es, elts * es);
    };
    auto reduceOut = [&](int dst, size_t dstElt, size_t srcElt, size_t elts) {
      std::vector<double> v(n);
      for (size_t i = 0; i < elts; ++i) {
        for (int r = 0; r < n; ++r) v[r] = loadValue(type->type, in[r].data(), srcElt + i);
        storeValue(type->type, ctx[dst].result(), dstElt + i, reduce(v));
      }
    };
    const std::string name = coll.name();
    const size_t p = counts.paramCount;
    for (int r = 0; r < n; ++r) {
      if (name == "AllReduce")
        reduceOut(r, 0, 0, p);
      else if (name == "AllGather")
        for (int j = 0; j < n; ++j) copyOut(r, j * p, j, 0, p);
      else if (name == "ReduceScatter")
        reduceOut(r, 0, r * p, p);
      else if (name == "Broadcast")
        copyOut(r, 0, root, 0, p);
      else if (name == "Reduce") {
        if (r == root) reduceOut(r, 0, 0, p);
      } else if (name == "AlltoAll")
        for (int j = 0; j < n; ++j) copyOut(r, j * p, j, r * p, p);
      else if (name == "SendRecv")
        copyOut(r, 0, (r - 1 + n) % n, 0, p);
      else if (name == "Gather") {
        if (r == root)
          for (int j = 0; j < n; ++j) copyOut(r, j * p, j, 0, p);
      } else if (name == "Scatter")
        copyOut(r, 0, root, r * p, p);
      else
        ADD_FAILURE() << "no reference for " << name;
    }
  }

  int64_t checkAll() const {
    int64_t wrong = 0;
    for (int r = 0; r < n; ++r) wrong += coll.check(ctx[r]);
    return wrong;
  }
};

std::string label(const Sim& s) {
  return std::string(s.coll.name()) + " n=" + std::to_string(s.n) +
         " root=" + std::to_string(s.root) + (s.inPlace ? " in-place " : " out-of-place ") +
         s.type->name + " " + s.op->name;
}

TEST(BenchCollectives, ReferenceResultsCheckCleanAndCorruptionIsCounted) {
  int cases = 0;
  for (const NamedCollective& named : allCollectives()) {
    const Collective& coll = named.get();
    std::vector<const OpInfo*> ops;
    if (coll.usesOp())
      for (const OpInfo& o : allOps()) ops.push_back(&o);
    else
      ops.push_back(&noOp());
    for (int n : {1, 2, 3, 5, 8}) {
      for (bool inPlace : {false, true}) {
        for (const TypeInfo& type : allTypes()) {
          for (const OpInfo* op : ops) {
            int root = coll.sweepsRoots() ? n - 1 : -1;
            Sim sim(coll, n, root, inPlace, &type, op, 2000);
            for (int r = 0; r < n; ++r) coll.fill(sim.ctx[r]);
            sim.execute();
            ASSERT_EQ(sim.checkAll(), 0) << label(sim);
            // Corrupt 3 elements of the last rank's result: exactly 3 are counted.
            const DataContext& last = sim.ctx[n - 1];
            size_t resultElts = sim.counts.recvCount;
            ASSERT_GE(resultElts, 3u) << label(sim);
            for (size_t e : {size_t(0), resultElts / 2, resultElts - 1})
              for (size_t b = 0; b < type.size; ++b) last.result()[e * type.size + b] ^= 0x5a;
            EXPECT_EQ(coll.check(last), 3) << label(sim);
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 1000);
}

TEST(BenchCollectives, SkippedCollectiveIsDetected) {
  // A library that does nothing must not pass: the fill leaves results that check wrong.
  for (const NamedCollective& named : allCollectives()) {
    const Collective& coll = named.get();
    const OpInfo* op = coll.usesOp() ? findOp("sum") : &noOp();
    Sim sim(coll, 3, coll.sweepsRoots() ? 1 : -1, false, findType("int32"), op, 4096);
    for (int r = 0; r < 3; ++r) coll.fill(sim.ctx[r]);
    EXPECT_GT(sim.checkAll(), 0) << named.tool;
  }
}

}  // namespace
}  // namespace loom::bench
