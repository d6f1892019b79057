// The device executor's kernel runs each channel on a block of threads: thread 0 polls and
// publishes, every thread keeps its own interpreter and FIFO ends, and each pass over a
// piece spreads the bytes over the threads its own way (an element each for arithmetic, 16
// bytes each for copies). Here the same interpreter runs that way on host threads, "lanes",
// with the kernel's barriers: a pass that read what another lane wrote without a barrier
// between gives wrong results here, and ThreadSanitizer (scripts/sanitize.sh) names it
// whatever the timing. The first run on a GPU found such a race (docs/gpu_check.md).
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "interp_harness.h"

namespace loom {
namespace {

using namespace interptest;

thread_local unsigned tLane = 0;

// DeviceAtomics' rules on host threads: lane 0 alone publishes; each lane's own counters are
// its own copies.
struct LaneAtomics {
  static bool publishes() { return tLane == 0; }
  static uint64_t load(const uint64_t& v) { return __atomic_load_n(&v, __ATOMIC_ACQUIRE); }
  static void store(uint64_t& v, uint64_t x) {
    if (publishes()) __atomic_store_n(&v, x, __ATOMIC_RELEASE);
  }
  static uint64_t loadOwn(const uint64_t& v) { return v; }
  static void storeOwn(uint64_t& v, uint64_t x) { v = x; }
  static uint64_t loadLine(const uint64_t& v) { return __atomic_load_n(&v, __ATOMIC_ACQUIRE); }
  static void storeLine(uint64_t& v, uint64_t x) { __atomic_store_n(&v, x, __ATOMIC_RELEASE); }
};
using LaneFifo = FifoEndT<LaneAtomics>;

constexpr unsigned kLanes = 4;

// What a block shares: its barrier, a word for anyLane, and its LL staging.
struct Block {
  std::barrier<> bar{kLanes};
  std::atomic<int> any{0};
  std::atomic<int> go{0};
  std::vector<char> stage[2];
  explicit Block(size_t stageBytes) {
    stage[0].resize(stageBytes + 64);
    stage[1].resize(stageBytes + 64);
  }
};

// DeviceOps' work split on host lanes: element-wise passes take every kLanes-th element,
// copies every kLanes-th 16-byte pack (then the tail bytes).
struct LaneOps {
  static constexpr size_t kBlockBytes = size_t(1) << 30;
  const Reducer* red;
  Block* block;

  size_t eltSize() const { return red->eltSize; }
  bool hasPre() const { return red->hasPre(); }
  unsigned lane() const { return tLane; }
  unsigned lanes() const { return kLanes; }
  bool stopRequested() const { return false; }
  bool anyLane(bool v) const {
    if (v) block->any.store(1, std::memory_order_relaxed);
    block->bar.arrive_and_wait();
    const bool any = block->any.load(std::memory_order_relaxed) != 0;
    block->bar.arrive_and_wait();  // everyone has read it
    if (tLane == 0) block->any.store(0, std::memory_order_relaxed);
    block->bar.arrive_and_wait();
    return any;
  }
  template <typename F>
  void elements(size_t n, F f) const {
    for (size_t i = tLane; i < n; i += kLanes) f(i * red->eltSize);
  }
  void reduce(void* d, const void* in, const void* local, size_t n) const {
    elements(n, [&](size_t o) {
      red->reduce(static_cast<char*>(d) + o, static_cast<const char*>(in) + o, static_cast<const char*>(local) + o, 1);
    });
  }
  void reduce2(void* d, const void* a, const void* b, size_t n) const {
    elements(n, [&](size_t o) {
      red->reduce2(static_cast<char*>(d) + o, static_cast<const char*>(a) + o, static_cast<const char*>(b) + o, 1);
    });
  }
  void pre(void* d, const void* s, size_t n) const {
    elements(n, [&](size_t o) { red->pre(static_cast<char*>(d) + o, static_cast<const char*>(s) + o, 1); });
  }
  void post(void* d, const void* s, size_t n) const {
    elements(n, [&](size_t o) { red->post(static_cast<char*>(d) + o, static_cast<const char*>(s) + o, 1); });
  }
  void copy(void* d, const void* s, size_t bytes) const {
    if (d == s) return;
    const size_t packs = bytes / 16;
    for (size_t i = tLane; i < packs; i += kLanes)
      std::memcpy(static_cast<char*>(d) + i * 16, static_cast<const char*>(s) + i * 16, 16);
    for (size_t i = packs * 16 + tLane; i < bytes; i += kLanes)
      static_cast<char*>(d)[i] = static_cast<const char*>(s)[i];
  }
  void copyOut(void* d, const void* s, size_t bytes) const { copy(d, s, bytes); }
  void sync() const { block->bar.arrive_and_wait(); }
  void fence() const { block->bar.arrive_and_wait(); }
  const void* received(LaneFifo& f, StepPiece& p) const {
    EXPECT_EQ(f.recvInfo().bytes, p.bytes);
    return f.recvSlot();
  }
};

// One lane's view of its rank's FIFO ends (its own copies), as DeviceEnv is one thread's.
struct LaneEnv {
  int rank = 0;
  std::map<std::pair<int, int>, LaneFifo> sends, recvs;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  void* scratch = nullptr;
  Block* block = nullptr;
  bool ll = false;

  bool llRecv(int, int) const { return ll; }
  bool llSend(int, int) const { return ll; }
  void* llStage(int which, size_t) const { return block->stage[which].data(); }
  LaneFifo* recvFifo(int peer, int conn) { return &recvs.at({peer, conn}); }
  LaneFifo* sendFifo(int peer, int conn) { return &sends.at({peer, conn}); }
  const char* ptr(BufRef r, size_t off) const { return bufAt(r, off, sendbuf, recvbuf, scratch); }
};

LaneFifo laneCopy(const FifoEnd& e) {
  LaneFifo f;
  f.ctrl = e.ctrl;
  f.slots = e.slots;
  f.slotBytes = e.slotBytes;
  f.depth = e.depth;
  f.step = e.step;
  f.headAt = e.headAt;
  return f;
}

// Every rank's plan, each channel a block of kLanes threads running the kernel's loop.
// False if a channel was still waiting after 20 s.
bool runLanes(const std::vector<Plan>& plans, size_t count, const Reducer& red, std::vector<TableEnv>& envs,
              size_t slotBytes, int depth, bool ll) {
  const int n = static_cast<int>(plans.size());
  const Conns conns = connectFifos(plans, envs, slotBytes, depth);
  const auto flat = flatten(plans);
  std::vector<std::unique_ptr<Block>> blocks;
  std::atomic<bool> stuck{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    for (size_t c = 0; c < plans[r].channels.size(); ++c) {
      blocks.push_back(std::make_unique<Block>(llCapacity(slotBytes)));
      Block* b = blocks.back().get();
      for (unsigned lane = 0; lane < kLanes; ++lane)
        threads.emplace_back([&, r, c, b, lane] {
          tLane = lane;
          LaneEnv env;
          env.rank = r;
          env.sendbuf = envs[r].sendbuf;
          env.recvbuf = envs[r].recvbuf;
          env.scratch = envs[r].scratch;
          env.block = b;
          env.ll = ll;
          for (auto& [k, e] : envs[r].sends) env.sends[k] = laneCopy(*e);
          for (auto& [k, e] : envs[r].recvs) env.recvs[k] = laneCopy(*e);
          LaneOps ops{&red, b};
          ChannelInterp<LaneAtomics, LaneEnv> in(flat[r]->plan(), c, count, red.eltSize, ll);
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
          while (!in.done()) {
            if (lane == 0) {  // as thread 0 of a block: poll, then tell the others
              int go = 1;
              while (!in.ready(env))
                if (stuck.load() || std::chrono::steady_clock::now() > deadline) {
                  stuck.store(true);
                  go = 0;
                  break;
                } else {
                  std::this_thread::yield();
                }
              b->go.store(go, std::memory_order_relaxed);
            }
            b->bar.arrive_and_wait();
            if (!b->go.load(std::memory_order_relaxed)) return;
            const bool ok = in.run(env, ops, red.hasPost());
            b->bar.arrive_and_wait();
            if (!ok) {
              if (lane == 0) ADD_FAILURE() << "rank " << r << " channel " << c << ": a piece of another size";
              stuck.store(true);
              return;
            }
          }
        });
    }
  for (auto& t : threads) t.join();
  return !stuck.load();
}

class InterpLanes : public testing::TestWithParam<bool> {};

// Every algorithm of 5 collectives on 1, 2, 3 and 5 ranks (and two hosts), several types and
// reductions: exactly the single-threaded interpreter's bytes.
TEST_P(InterpLanes, BlocksOfLanesGiveTheSingleThreadedInterpretersBytes) {
  const bool ll = GetParam();
  // LOOM_TEST_SMALL=1 (the sanitizer runs): 2 and 3 ranks, one size, two types.
  const bool small = getenv("LOOM_TEST_SMALL") && *getenv("LOOM_TEST_SMALL") == '1';
  const std::vector<std::vector<int>> layouts =
      small ? std::vector<std::vector<int>>{{0, 0}, {0, 0, 0}}
            : std::vector<std::vector<int>>{{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0, 0}, {0, 0, 1, 1}};
  const size_t slot = 4096;
  const int depth = 4;
  struct TypeOp {
    int dtype, op;
  };
  const TypeOp kinds[] = {{7 /* float32 */, 0 /* sum */}, {0 /* int8 */, 0}, {6 /* float16 */, 4 /* avg */},
                          {9 /* bfloat16 */, 2 /* max */}, {8 /* float64 */, 1 /* prod */}};
  size_t runs = 0;
  for (const auto& hostOf : layouts) {
    JobContexts j = job(hostOf, ll ? llCapacity(slot) : slot, depth);
    const int n = j.nranks();
    for (Collective coll : kColls)
      for (size_t count : {size_t{7}, size_t{3001}})
        for (int a = 0; a < kAlgoCount; ++a)
          for (const TypeOp& k : kinds) {
            if (count < 3001 && k.dtype != 7) continue;  // the types on one size (CI's time)
            if (small && (count < 3001 || (k.dtype != 7 && k.dtype != 0))) continue;
            const Algorithm algo = static_cast<Algorithm>(a);
            const Reducer red = Reducer::make(k.dtype, k.op, n);
            const int root = n - 1;
            CollRequest req{coll, count, red.eltSize, root};
            if (!canServe(algo, req, j[0])) continue;
            Selection sel = selectionFor(req, j[0], algo);
            sel.channels = 2;
            const size_t inCount = coll == Collective::kReduceScatter ? count * n : count;
            const size_t outCount = coll == Collective::kAllGather ? count * n : count;
            std::vector<Plan> plans;
            std::vector<std::vector<unsigned char>> in(n), want(n), got(n), scratch(n);
            std::vector<TableEnv> hostEnvs(n), laneEnvs(n);
            for (int r = 0; r < n; ++r) {
              plans.push_back(buildPlan(req, j[r], sel));
              in[r].resize(inCount * red.eltSize);
              // Small bytes: every type holds them as finite values or small integers.
              for (size_t i = 0; i < in[r].size(); ++i)
                in[r][i] = static_cast<unsigned char>((i * 7 + r * 3) % 13) & (red.eltSize == 1 ? 0xff : 0x3f);
              want[r].assign(outCount * red.eltSize, 0xee);
              got[r] = want[r];
              scratch[r].assign(plans[r].scratchBytes + 64, 0);
              hostEnvs[r].rank = laneEnvs[r].rank = r;
              hostEnvs[r].sendbuf = laneEnvs[r].sendbuf = in[r].data();
              hostEnvs[r].recvbuf = want[r].data();
              laneEnvs[r].recvbuf = got[r].data();
              hostEnvs[r].scratch = scratch[r].data();
            }
            std::vector<std::vector<unsigned char>> scratch2 = scratch;
            for (int r = 0; r < n; ++r) laneEnvs[r].scratch = scratch2[r].data();
            const std::string where = std::string(collectiveName(coll)) + "/" + algorithmName(algo) + " dtype " +
                                      std::to_string(k.dtype) + " op " + std::to_string(k.op) + " count " +
                                      std::to_string(count) + " on " + std::to_string(n) + " ranks";
            ASSERT_TRUE(runInterp(plans, count, red, hostEnvs, slot, depth, false)) << where;
            ASSERT_TRUE(runLanes(plans, count, red, laneEnvs, slot, depth, ll)) << where << ": a channel never finished";
            for (int r = 0; r < n; ++r) ASSERT_TRUE(got[r] == want[r]) << where << ": rank " << r;
            ++runs;
          }
  }
  EXPECT_GT(runs, small ? 20u : 150u);
}

INSTANTIATE_TEST_SUITE_P(Protocols, InterpLanes, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool>& info) { return info.param ? "LL" : "Simple"; });

}  // namespace
}  // namespace loom
