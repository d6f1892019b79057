// The hierarchical plans of every rank, run together by a small interpreter (unbounded
// in-order queues between ranks, integer-valued doubles summed exactly): each layout of
// hosts, even or not, each count and each root must produce the collective's exact result, with
// both ends of every message agreeing on its size and no rank left waiting.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <map>
#include <tuple>
#include <vector>

#include "algo/hierarchical.h"

namespace loom {
namespace {

using Msg = std::vector<double>;

struct RankState {
  Plan plan;
  std::vector<double> send, recv, scratch;
  std::vector<size_t> step;  // per channel
};

double* at(RankState& r, BufRef b) {
  size_t i = b.offset / sizeof(double);
  switch (b.buf) {
    case Buf::kSend: return r.send.data() + i;
    case Buf::kRecv: return r.recv.data() + i;
    case Buf::kScratch: return r.scratch.data() + i;
    default: return nullptr;
  }
}

// Runs the ranks' plans, every channel, to completion; messages travel on queues per
// (from, to, connection), as on the real connections. Returns "" or what went wrong.
std::string run(std::vector<RankState>& ranks) {
  std::map<std::tuple<int, int, int>, std::deque<Msg>> q;
  for (auto& r : ranks) r.step.assign(r.plan.channels.size(), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int me = 0; me < static_cast<int>(ranks.size()); ++me) {
      RankState& r = ranks[me];
      for (size_t ch = 0; ch < r.plan.channels.size(); ++ch) {
        const auto& steps = r.plan.channels[ch].steps;
        while (r.step[ch] < steps.size()) {
          const Step& s = steps[r.step[ch]];
          size_t n = s.bytes / sizeof(double);
          Msg in;
          if (stepRecvs(s.op)) {
            auto& from = q[{s.recvPeer, me, s.conn}];
            if (from.empty()) break;
            in = std::move(from.front());
            from.pop_front();
            if (in.size() != n) return "message size mismatch at rank " + std::to_string(me);
          }
          Msg out(n);
          const double* src = s.src.buf == Buf::kNone ? nullptr : at(r, s.src);
          double* dst = s.dst.buf == Buf::kNone ? nullptr : at(r, s.dst);
          for (size_t i = 0; i < n; ++i) {
            switch (s.op) {
              case StepOp::kSend: out[i] = src[i]; break;
              case StepOp::kRecv: dst[i] = in[i]; break;
              case StepOp::kRecvReduceSend: out[i] = in[i] + src[i]; break;
              case StepOp::kRecvReduceCopy: dst[i] = in[i] + src[i]; break;
              case StepOp::kRecvReduceCopySend: out[i] = dst[i] = in[i] + src[i]; break;
              case StepOp::kRecvCopySend: out[i] = dst[i] = in[i]; break;
              case StepOp::kCopy: dst[i] = src[i]; break;
              case StepOp::kLocalReduce: dst[i] += src[i]; break;
            }
          }
          if (stepSends(s.op)) q[{me, s.sendPeer, s.conn}].push_back(std::move(out));
          ++r.step[ch];
          progress = true;
        }
      }
    }
  }
  for (size_t me = 0; me < ranks.size(); ++me)
    for (size_t ch = 0; ch < ranks[me].plan.channels.size(); ++ch)
      if (ranks[me].step[ch] < ranks[me].plan.channels[ch].steps.size())
        return "rank " + std::to_string(me) + " channel " + std::to_string(ch) +
               " waits forever at step " + std::to_string(ranks[me].step[ch]);
  for (const auto& [k, v] : q)
    if (!v.empty()) return "unreceived messages from " + std::to_string(std::get<0>(k));
  return "";
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
const size_t kCounts[] = {0, 1, 5, 1000, 40000, 300000};  // the last spans two channels
constexpr size_t kChunk = 4096;  // bytes per step: many slices for the larger counts

TEST(HierPlan, AllReduceEveryLayout) {
  for (const auto& hostOf : kLayouts)
    for (size_t count : kCounts) {
      int n = static_cast<int>(hostOf.size());
      std::vector<RankState> ranks(n);
      for (int r = 0; r < n; ++r) {
        ranks[r].plan = hierarchicalAllReduce(layoutOf(hostOf, r), count, sizeof(double), kChunk);
        ranks[r].send.resize(count);
        ranks[r].recv.assign(count, -1);
        ranks[r].scratch.resize(ranks[r].plan.scratchBytes / sizeof(double));
        for (size_t i = 0; i < count; ++i) ranks[r].send[i] = input(r, i);
      }
      for (int r = 0; r < n; ++r) ASSERT_FALSE(channelsShareAConnection(ranks[r].plan));
      ASSERT_EQ(run(ranks), "") << "layout of " << n << " ranks, count " << count;
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) {
          double want = 0;
          for (int q = 0; q < n; ++q) want += input(q, i);
          ASSERT_EQ(ranks[r].recv[i], want) << "rank " << r << " element " << i << " of " << count;
        }
    }
}

TEST(HierPlan, ReduceScatterAndAllGatherEveryLayout) {
  for (const auto& hostOf : kLayouts) {
    for (size_t count : kCounts) {
      int n = static_cast<int>(hostOf.size());
      std::vector<RankState> rs(n), ag(n);
      for (int r = 0; r < n; ++r) {
        HostLayout l = layoutOf(hostOf, r);
        rs[r].plan = hierarchicalReduceScatter(l, count, sizeof(double), kChunk);
        rs[r].send.resize(count * n);
        for (size_t i = 0; i < count * n; ++i) rs[r].send[i] = input(r, i);
        rs[r].recv.assign(count, -1);
        rs[r].scratch.resize(rs[r].plan.scratchBytes / sizeof(double));
        ag[r].plan = hierarchicalAllGather(l, count, sizeof(double), kChunk);
        ag[r].send.resize(count);
        for (size_t i = 0; i < count; ++i) ag[r].send[i] = input(r, i);
        ag[r].recv.assign(count * n, -1);
        ag[r].scratch.resize(ag[r].plan.scratchBytes / sizeof(double));
      }
      ASSERT_EQ(run(rs), "") << "reduce-scatter, " << n << " ranks, count " << count;
      ASSERT_EQ(run(ag), "") << "all-gather, " << n << " ranks, count " << count;
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) {
          double want = 0;
          for (int q = 0; q < n; ++q) want += input(q, r * count + i);
          ASSERT_EQ(rs[r].recv[i], want) << "reduce-scatter rank " << r << " element " << i << ", " << n << " ranks";
          for (int q = 0; q < n; ++q)
            ASSERT_EQ(ag[r].recv[q * count + i], input(q, i)) << "all-gather rank " << r << " block " << q << ", " << n << " ranks";
        }
    }
  }
}

// Broadcast and reduce from every root: non-roots' unused buffers are never read or written.
TEST(HierPlan, BroadcastAndReduceEveryLayoutAndRoot) {
  for (const auto& hostOf : kLayouts)
    for (size_t count : kCounts) {
      int n = static_cast<int>(hostOf.size());
      for (int root = 0; root < n; ++root) {
        std::vector<RankState> bc(n), rd(n);
        for (int r = 0; r < n; ++r) {
          HostLayout l = layoutOf(hostOf, r);
          bc[r].plan = hierarchicalBroadcast(l, root, count, sizeof(double), kChunk);
          bc[r].send.assign(count, -7);
          bc[r].recv.assign(count, -1);
          bc[r].scratch.resize(bc[r].plan.scratchBytes / sizeof(double));
          rd[r].plan = hierarchicalReduce(l, root, count, sizeof(double), kChunk);
          rd[r].send.resize(count);
          rd[r].recv.assign(count, -1);
          rd[r].scratch.resize(rd[r].plan.scratchBytes / sizeof(double));
          for (size_t i = 0; i < count; ++i) {
            if (r == root) bc[r].send[i] = input(r, i);
            rd[r].send[i] = input(r, i);
          }
          ASSERT_FALSE(channelsShareAConnection(bc[r].plan));
          ASSERT_FALSE(channelsShareAConnection(rd[r].plan));
        }
        ASSERT_EQ(run(bc), "") << "broadcast, " << n << " ranks, root " << root << ", count " << count;
        ASSERT_EQ(run(rd), "") << "reduce, " << n << " ranks, root " << root << ", count " << count;
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(bc[r].recv[i], input(root, i)) << "broadcast rank " << r << " root " << root << " of " << n;
            double want = 0;
            for (int q = 0; q < n; ++q) want += input(q, i);
            ASSERT_EQ(rd[r].recv[i], r == root ? want : -1)
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
  size_t crossing = 0;
  for (int r = 0; r < 4; ++r) {
    Plan p = hierarchicalAllReduce(layoutOf(hostOf, r), count, sizeof(double), 1 << 20);
    for (const ChannelPlan& ch : p.channels)
      for (const Step& s : ch.steps)
        if (stepSends(s.op) && hostOf[s.sendPeer] != hostOf[r]) crossing += s.bytes;
  }
  EXPECT_EQ(crossing, 2 * bytes);  // 2 hosts x 2(N-1)/N x bytes
}

}  // namespace
}  // namespace loom
