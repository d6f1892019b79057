// The hierarchical plans of every rank, run together by the library's plan simulator
// (algo/simulate: FIFOs of the communicator's default shape between ranks, integer-valued
// doubles summed exactly): each layout of hosts, even or not, each count, channel count and
// root must produce the collective's exact result, with both ends of every message
// agreeing on its size and no rank left waiting.
#include <gtest/gtest.h>

#include <map>
#include <tuple>
#include <vector>

#include "algo/hierarchical.h"
#include "algo/simulate.h"

namespace loom {
namespace {

// Every rank's plan and buffers.
struct Ranks {
  std::vector<Plan> plans;
  std::vector<SimBuffers> bufs;
  explicit Ranks(int n) : plans(n), bufs(n) {}
  void sizeScratch() {
    for (size_t r = 0; r < plans.size(); ++r) bufs[r].scratch.resize(plans[r].scratchBytes / sizeof(double));
  }
};

// Runs the ranks' plans, every channel, to completion. Returns "" or what went wrong.
std::string run(Ranks& ranks) {
  SimOptions opt;
  opt.eltSize = sizeof(double);
  return runPlans(ranks.plans, ranks.bufs, opt);
}

// Two channels that run at once must not share a connection.
bool channelsShareAConnection(const Plan& p) {
  std::map<std::tuple<int, int, int>, size_t> owner;  // (direction, peer, conn) -> channel
  for (size_t ch = 0; ch < p.channels.size(); ++ch)
    for (const Step& s : p.channels[ch].steps) {
      std::tuple<int, int, int> keys[2] = {{0, s.sendPeer, s.conn}, {1, s.recvPeer, s.conn}};
      for (int d = 0; d < 2; ++d) {
        if (std::get<1>(keys[d]) < 0) continue;
        auto [it, fresh] = owner.emplace(keys[d], ch);
        if (!fresh && it->second != ch) return true;
      }
    }
  return false;
}

HostLayout layoutOf(const std::vector<int>& hostOf, int rank) {
  HostLayout l;
  std::map<int, int> index;
  for (int r = 0; r < static_cast<int>(hostOf.size()); ++r) {
    auto [it, fresh] = index.emplace(hostOf[r], static_cast<int>(l.hosts.size()));
    if (fresh) l.hosts.emplace_back();
    if (r == rank) {
      l.host = it->second;
      l.local = static_cast<int>(l.hosts[it->second].size());
    }
    l.hosts[it->second].push_back(r);
  }
  return l;
}

double input(int rank, size_t i) { return static_cast<double>((rank + 1) * 1000 + i % 997); }

const std::vector<std::vector<int>> kLayouts = {
    {0, 0, 1, 1}, {0, 1, 0, 1}, {0, 0, 1, 2, 2, 2}, {0, 1, 0, 0}, {0, 0, 0, 1, 1, 1, 2, 2, 2},
    {0, 1}, {0, 0, 1}, {0, 1, 2, 0, 1, 2, 0, 1}};
const size_t kCounts[] = {0, 1, 5, 1000, 40000, 300000};
const int kChannels[] = {1, 2, 3};  // the cost model gives the CPU executor 1 or 2
constexpr size_t kChunk = 4096;  // bytes per step: many slices for the larger counts

TEST(HierPlan, AllReduceEveryLayout) {
  for (const auto& hostOf : kLayouts)
    for (size_t count : kCounts)
      for (int channels : kChannels) {
        int n = static_cast<int>(hostOf.size());
        Ranks ranks(n);
        for (int r = 0; r < n; ++r) {
          ranks.plans[r] = hierarchicalAllReduce(layoutOf(hostOf, r), count, sizeof(double), kChunk, channels);
          ranks.bufs[r].send.resize(count);
          ranks.bufs[r].recv.assign(count, -1);
          for (size_t i = 0; i < count; ++i) ranks.bufs[r].send[i] = input(r, i);
        }
        ranks.sizeScratch();
        for (int r = 0; r < n; ++r) ASSERT_FALSE(channelsShareAConnection(ranks.plans[r]));
        ASSERT_EQ(run(ranks), "") << "layout of " << n << " ranks, count " << count << ", " << channels << " ch";
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) {
            double want = 0;
            for (int q = 0; q < n; ++q) want += input(q, i);
            ASSERT_EQ(ranks.bufs[r].recv[i], want) << "rank " << r << " element " << i << " of " << count;
          }
      }
}

TEST(HierPlan, ReduceScatterAndAllGatherEveryLayout) {
  for (const auto& hostOf : kLayouts) {
    for (size_t count : kCounts)
      for (int channels : kChannels) {
        int n = static_cast<int>(hostOf.size());
        Ranks rs(n), ag(n);
        for (int r = 0; r < n; ++r) {
          HostLayout l = layoutOf(hostOf, r);
          rs.plans[r] = hierarchicalReduceScatter(l, count, sizeof(double), kChunk, channels);
          rs.bufs[r].send.resize(count * n);
          for (size_t i = 0; i < count * n; ++i) rs.bufs[r].send[i] = input(r, i);
          rs.bufs[r].recv.assign(count, -1);
          ag.plans[r] = hierarchicalAllGather(l, count, sizeof(double), kChunk, channels);
          ag.bufs[r].send.resize(count);
          for (size_t i = 0; i < count; ++i) ag.bufs[r].send[i] = input(r, i);
          ag.bufs[r].recv.assign(count * n, -1);
          ASSERT_FALSE(channelsShareAConnection(rs.plans[r]));
          ASSERT_FALSE(channelsShareAConnection(ag.plans[r]));
        }
        rs.sizeScratch();
        ag.sizeScratch();
        ASSERT_EQ(run(rs), "") << "reduce-scatter, " << n << " ranks, count " << count << ", " << channels << " ch";
        ASSERT_EQ(run(ag), "") << "all-gather, " << n << " ranks, count " << count << ", " << channels << " ch";
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) {
            double want = 0;
            for (int q = 0; q < n; ++q) want += input(q, r * count + i);
            ASSERT_EQ(rs.bufs[r].recv[i], want) << "reduce-scatter rank " << r << " element " << i << ", " << n << " ranks";
            for (int q = 0; q < n; ++q)
              ASSERT_EQ(ag.bufs[r].recv[q * count + i], input(q, i))
                  << "all-gather rank " << r << " block " << q << ", " << n << " ranks";
          }
      }
  }
}

// Broadcast and reduce from every root: non-roots' unused buffers are never read or written.
TEST(HierPlan, BroadcastAndReduceEveryLayoutAndRoot) {
  for (const auto& hostOf : kLayouts)
    for (size_t count : kCounts)
      for (int channels : kChannels) {
        int n = static_cast<int>(hostOf.size());
        for (int root = 0; root < n; ++root) {
          Ranks bc(n), rd(n);
          for (int r = 0; r < n; ++r) {
            HostLayout l = layoutOf(hostOf, r);
            bc.plans[r] = hierarchicalBroadcast(l, root, count, sizeof(double), kChunk, channels);
            bc.bufs[r].send.assign(count, -7);
            bc.bufs[r].recv.assign(count, -1);
            rd.plans[r] = hierarchicalReduce(l, root, count, sizeof(double), kChunk, channels);
            rd.bufs[r].send.resize(count);
            rd.bufs[r].recv.assign(count, -1);
            for (size_t i = 0; i < count; ++i) {
              if (r == root) bc.bufs[r].send[i] = input(r, i);
              rd.bufs[r].send[i] = input(r, i);
            }
            ASSERT_FALSE(channelsShareAConnection(bc.plans[r]));
            ASSERT_FALSE(channelsShareAConnection(rd.plans[r]));
          }
          bc.sizeScratch();
          rd.sizeScratch();
          ASSERT_EQ(run(bc), "") << "broadcast, " << n << " ranks, root " << root << ", count " << count;
          ASSERT_EQ(run(rd), "") << "reduce, " << n << " ranks, root " << root << ", count " << count;
          for (int r = 0; r < n; ++r)
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(bc.bufs[r].recv[i], input(root, i)) << "broadcast rank " << r << " root " << root << " of " << n;
              double want = 0;
              for (int q = 0; q < n; ++q) want += input(q, i);
              ASSERT_EQ(rd.bufs[r].recv[i], r == root ? want : -1)
                  << "reduce rank " << r << " root " << root << " of " << n << " element " << i;
            }
        }
      }
}

// Each host sends 2(N-1)/N of the buffer over the network for an all-reduce, split over
// its local ranks; the flat ring would send 2(n-1)/n from its one crossing rank.
TEST(HierPlan, NetworkBytesPerHost) {
  std::vector<int> hostOf = {0, 0, 1, 1};
  size_t count = 1 << 16, bytes = count * sizeof(double);
  Ranks ranks(4);
  for (int r = 0; r < 4; ++r)
    ranks.plans[r] = hierarchicalAllReduce(layoutOf(hostOf, r), count, sizeof(double), 1 << 20);
  SimOptions opt;
  opt.eltSize = sizeof(double);
  opt.moveData = false;  // bytes only
  std::vector<SimStats> stats;
  ASSERT_EQ(runPlans(ranks.plans, ranks.bufs, opt, &stats), "");
  size_t crossing = 0;
  for (int r = 0; r < 4; ++r)
    for (int q = 0; q < 4; ++q)
      if (hostOf[q] != hostOf[r]) crossing += stats[r].bytesTo[q];
  EXPECT_EQ(crossing, 2 * bytes);  // 2 hosts x 2(N-1)/N x bytes
}

}  // namespace
}  // namespace loom
