// The fallback decision as a pure function of every rank's description: what each mode
// decides, and the reasons it gives.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "dispatch/fallback.h"

namespace {

using loom::dispatch::decideFallback;
using loom::dispatch::FallbackMode;
using loom::dispatch::RankFallbackInfo;

RankFallbackInfo rank(FallbackMode mode, int dev, int version = 22809, uint64_t host = 7,
                      int uuidTag = -1) {
  RankFallbackInfo i;
  i.mode = static_cast<uint8_t>(mode);
  i.cudaDev = dev;
  i.stockVersion = version;
  i.hostHash = host;
  if (uuidTag >= 0) {
    i.hasUuid = 1;
    i.uuid[0] = static_cast<uint8_t>(uuidTag);
  }
  return i;
}

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

constexpr auto kAuto = FallbackMode::kAuto;
constexpr auto kOff = FallbackMode::kOff;
constexpr auto kForce = FallbackMode::kForce;

TEST(FallbackDecision, AutoUsesStockWhenEveryRankHasItAndAGpuOfItsOwn) {
  auto d = decideFallback({rank(kAuto, 0), rank(kAuto, 1), rank(kAuto, 0, 22809, 8)});
  EXPECT_TRUE(d.useStock);
  EXPECT_FALSE(d.fail);
  EXPECT_TRUE(has(d.why, "stock NCCL 22809")) << d.why;
}

TEST(FallbackDecision, OffNeverUsesStock) {
  auto d = decideFallback({rank(kOff, 0), rank(kOff, 1)});
  EXPECT_FALSE(d.useStock);
  EXPECT_FALSE(d.fail);
  EXPECT_TRUE(has(d.why, "LOOM_NCCL_FALLBACK=off")) << d.why;
}

TEST(FallbackDecision, EachMissingPieceIsNamedAndFailsOnlyUnderForce) {
  struct Case {
    std::vector<RankFallbackInfo> (*ranks)(FallbackMode);
    const char* reason;
  };
  const Case cases[] = {
      {[](FallbackMode m) { return std::vector{rank(m, 0), rank(m, -1)}; },
       "rank 1 has no CUDA device"},
      {[](FallbackMode m) { return std::vector{rank(m, 0, 0), rank(m, 1)}; },
       "rank 0 found no usable stock NCCL"},
      {[](FallbackMode m) { return std::vector{rank(m, 0), rank(m, 1, 22703)}; },
       "rank 0 has stock NCCL 22809 but rank 1 has 22703"},
      {[](FallbackMode m) { return std::vector{rank(m, 0), rank(m, 1), rank(m, 1)}; },
       "ranks 1 and 2 share CUDA device 1"},
      // Same ordinal on two hosts: two GPUs. Same UUID under different ordinals (as
      // CUDA_VISIBLE_DEVICES can make it): one GPU.
      {[](FallbackMode m) {
         return std::vector{rank(m, 0, 22809, 1, 5), rank(m, 1, 22809, 1, 5)};
       },
       "ranks 0 and 1 share CUDA device 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.reason);
    auto a = decideFallback(c.ranks(kAuto));
    EXPECT_FALSE(a.useStock);
    EXPECT_FALSE(a.fail);
    EXPECT_TRUE(has(a.why, c.reason)) << a.why;
    EXPECT_TRUE(has(a.why, "LOOM_NCCL_FALLBACK=auto")) << a.why;
    auto f = decideFallback(c.ranks(kForce));
    EXPECT_FALSE(f.useStock);
    EXPECT_TRUE(f.fail);
    EXPECT_TRUE(has(f.why, c.reason)) << f.why;
  }
  // Two hosts, each with its device 0, and distinct UUIDs: no duplicate.
  EXPECT_TRUE(decideFallback({rank(kAuto, 0, 22809, 1, 1), rank(kAuto, 0, 22809, 2, 2)}).useStock);
  EXPECT_TRUE(decideFallback({rank(kAuto, 0, 22809, 1), rank(kAuto, 0, 22809, 2)}).useStock);
}

TEST(FallbackDecision, AMalformedKnobOnAnyRankFailsEveryRank) {
  auto bad = rank(kAuto, 1);
  bad.mode = loom::dispatch::kInvalidMode;
  auto d = decideFallback({rank(kAuto, 0), bad});
  EXPECT_FALSE(d.useStock);
  EXPECT_TRUE(d.fail);
  EXPECT_TRUE(d.badKnob);
  EXPECT_TRUE(has(d.why, "rank 1 has a malformed LOOM_NCCL_FALLBACK")) << d.why;
}

TEST(FallbackDecision, RanksThatDisagreeOnTheModeNeverUseStock) {
  auto d = decideFallback({rank(kAuto, 0), rank(kAuto, 1), rank(kOff, 2)});
  EXPECT_FALSE(d.useStock);
  EXPECT_FALSE(d.fail);
  EXPECT_TRUE(has(d.why, "rank 0: auto, rank 2: off")) << d.why;
  auto f = decideFallback({rank(kAuto, 0), rank(kForce, 1)});
  EXPECT_FALSE(f.useStock);
  EXPECT_TRUE(f.fail);  // a rank that asked for force must not silently get Loom
}

}  // namespace

namespace {

using loom::dispatch::gpuSharingWarning;

// Ranks 0 and 2 share GPU 5 (same UUID) from two processes, rank 1 has its own, rank 3 has
// none: the warning names the sharers once, from the lowest of them, unless MPS runs.
TEST(GpuSharing, ProcessesSharingAGpuWithoutMpsAreWarnedOnceFromTheLowestRank) {
  const std::vector<RankFallbackInfo> ranks = {rank(kAuto, 5, 22809, 7, 1), rank(kAuto, 1, 22809, 7, 2),
                                               rank(kAuto, 5, 22809, 7, 1), rank(kAuto, -1)};
  const std::vector<int> pids = {100, 101, 102, 103};
  const std::string w = gpuSharingWarning(ranks, pids, 0, false);
  EXPECT_TRUE(has(w, "rank 0 (pid 100) shares CUDA device 5 with rank(s) 2 (pid 102)")) << w;
  EXPECT_TRUE(has(w, "nvidia-cuda-mps-control -d")) << w;
  EXPECT_EQ(gpuSharingWarning(ranks, pids, 2, false), "");  // rank 0 said it
  EXPECT_EQ(gpuSharingWarning(ranks, pids, 1, false), "");  // a GPU of its own
  EXPECT_EQ(gpuSharingWarning(ranks, pids, 3, false), "");  // no GPU
  EXPECT_EQ(gpuSharingWarning(ranks, pids, 0, true), "");   // MPS runs
}

// Threads of one process share a context: no time slicing, no warning. Without UUIDs the
// device index on the same host decides.
TEST(GpuSharing, ThreadsOfOneProcessAndOtherHostsAreNotWarned) {
  const std::vector<RankFallbackInfo> threads = {rank(kAuto, 0), rank(kAuto, 0), rank(kAuto, 0)};
  EXPECT_EQ(gpuSharingWarning(threads, {7, 7, 7}, 0, false), "");
  const std::vector<RankFallbackInfo> hosts = {rank(kAuto, 0, 22809, 7), rank(kAuto, 0, 22809, 8)};
  EXPECT_EQ(gpuSharingWarning(hosts, {7, 8}, 0, false), "");
  const std::vector<RankFallbackInfo> mixed = {rank(kAuto, 0), rank(kAuto, 0), rank(kAuto, 0)};
  EXPECT_TRUE(has(gpuSharingWarning(mixed, {7, 7, 9}, 0, false), "rank(s) 1 (pid 7), 2 (pid 9)"));
}

}  // namespace
