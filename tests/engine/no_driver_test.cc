// Without a usable CUDA driver every buffer is host memory and the library keeps working.
// Built once per way of having no driver (see CMakeLists.txt): a driver library that does
// not exist, the stand-in with a failing cuInit, and the CUDA toolkit's link stub (whose
// cuInit fails too). The knob is read once per process, so each is its own executable.
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "api/buffers.h"
#include "base/cuda_driver.h"
#include "base/mem_kind.h"
#include "core/rank_harness.h"
#ifdef LOOM_TEST_STAND_IN_FAILS_INIT
#include "stand_in_hooks.h"
#endif

namespace loomtest {
namespace {

constexpr int kCudaErrorNoDevice = 100;

#ifdef LOOM_TEST_STAND_IN_FAILS_INIT
StandInHooks gHooks;
#endif

// Runs before every test and before Loom's first call, which reads the knob.
class NoDriverEnvironment : public testing::Environment {
 public:
  void SetUp() override {
    setenv("LOOM_CUDA_DRIVER_LIBRARY", LOOM_TEST_DRIVER_LIBRARY, 1);
#ifdef LOOM_TEST_STAND_IN_FAILS_INIT
    // Loaded before Loom loads it (the same library then), to make its cuInit fail.
    ASSERT_EQ(gHooks.open(LOOM_TEST_DRIVER_LIBRARY, RTLD_NOW), "");
    gHooks.setInitResult(kCudaErrorNoDevice);
    gHooks.setCurrentDevice(0);
#endif
  }
};
testing::Environment* const kEnvironment =
    testing::AddGlobalTestEnvironment(new NoDriverEnvironment);

// With the stand-in, the buffer is also registered as device memory: a Loom that asked the
// driver anyway would refuse it, and one that believed it would not be here to check.
void* claimAsDevice(void* p, size_t bytes) {
#ifdef LOOM_TEST_STAND_IN_FAILS_INIT
  gHooks.addDeviceRange(p, bytes, 0);
#endif
  return p;
}

TEST(NO_DRIVER_SUITE, EveryBufferIsHost) {
  EXPECT_EQ(loom::cuda::driver(), nullptr);
  std::string why = loom::cuda::driverAbsenceReason();
  EXPECT_NE(why.find(LOOM_TEST_DRIVER_LIBRARY), std::string::npos) << why;
#ifdef LOOM_TEST_EXPECT_INIT_FAILURE
  EXPECT_NE(why.find("cuInit(0)"), std::string::npos) << why;
#endif
  EXPECT_EQ(loom::cuda::currentDevice(), -1);
  std::vector<float> buf(1024);
  loom::MemInfo info = loom::classifyPointer(claimAsDevice(buf.data(), buf.size() * 4));
  EXPECT_EQ(info.kind, loom::MemKind::kHost);
  EXPECT_EQ(info.device, -1);
  // Without a driver the check never looks at the communicator.
  EXPECT_EQ(loom::api::checkBuffers(nullptr, "test", {{"sendbuff", buf.data(), buf.size()}}),
            loom::MemKind::kHost);
}

TEST(NO_DRIVER_SUITE, HostOnlyCommunicatorsGiveExactResults) {
  constexpr size_t kN = 50000;
  std::vector<std::vector<double>> bufs(2, std::vector<double>(kN));
  for (auto& b : bufs) claimAsDevice(b.data(), kN * sizeof(double));
  auto failures = runRanks(Mode::kThreads, 2, [&](int rank, int nranks, ncclComm_t comm) {
    int device = -2;
    RANK_NCCL(ncclCommCuDevice(comm, &device));
    RANK_CHECK(device == -1, "cudaDev %d on a machine without a driver", device);
    std::vector<double>& b = bufs[rank];
    for (size_t i = 0; i < kN; ++i) b[i] = (rank + 1) * 0.5 * static_cast<double>(i % 101);
    RANK_NCCL(ncclAllReduce(b.data(), b.data(), kN, ncclDouble, ncclSum, comm, nullptr));
    for (size_t i = 0; i < kN; ++i)
      RANK_CHECK(b[i] == 1.5 * static_cast<double>(i % 101), "[%zu] = %g", i, b[i]);
    std::vector<double> all(kN * nranks, -1.0);
    RANK_NCCL(ncclAllGather(b.data(), all.data(), kN, ncclDouble, comm, nullptr));
    for (size_t i = 0; i < all.size(); ++i)
      RANK_CHECK(all[i] == b[i % kN], "gathered [%zu] = %g", i, all[i]);
    return std::string();
  });
  EXPECT_TRUE(failures.empty()) << joinFailures(failures);
}

}  // namespace
}  // namespace loomtest
