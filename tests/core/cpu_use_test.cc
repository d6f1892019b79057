// Waiting costs little CPU (issue 4: "waiting must not burn both cores"): an idle
// communicator, listener threads included, uses next to none, and a rank blocked in a
// collective on a late peer backs off from spinning to sleeping. Each rank is its own
// process (RUSAGE_SELF counts every thread of it); the limits are generous fractions of
// one core (a waiting rank: half, for loaded CI machines), far below the 100% a
// busy-wait costs.
#include <sys/resource.h>

#include <chrono>
#include <thread>
#include <vector>

#include "core/core_util.h"

namespace loomtest {
namespace {

double cpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

class CpuUse : public testing::TestWithParam<Transport> {};

TEST_P(CpuUse, IdleCommunicatorAndLatePeer) {
  std::optional<EnvGuard> shmOff;
  if (GetParam() == Transport::kSocket) shmOff.emplace("NCCL_SHM_DISABLE", "1");
  auto f = runRanks(Mode::kProcesses, 2, [](int rank, int nranks, ncclComm_t comm) {
    std::vector<float> in(1024, 1.0f), out(1024, 0.0f);
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat, ncclSum, comm, nullptr));
    // Idle: both ranks sleep 1 s holding a live communicator.
    double t0 = cpuSeconds();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    double idle = cpuSeconds() - t0;
    RANK_CHECK(idle < 0.05, "an idle communicator used %.0f ms of CPU in 1 s", idle * 1e3);
    // Late peer: rank 1 arrives 1.5 s after rank 0, which waits inside ncclAllReduce.
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    t0 = cpuSeconds();
    auto w0 = std::chrono::steady_clock::now();
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat, ncclSum, comm, nullptr));
    double busy = cpuSeconds() - t0;
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    RANK_CHECK(out[0] == 2.0f, "wrong result %f", out[0]);
    if (rank == 0) {
      printf("cpu: idle communicator %.1f ms of CPU in 1 s; waiting %.2f s for a late peer "
             "%.1f ms\n", idle * 1e3, wall, busy * 1e3);
      fflush(stdout);
      RANK_CHECK(wall > 1.0 && busy < 0.5 * wall,
                 "waiting %.2f s for a late peer used %.0f ms of CPU (more than half a core)",
                 wall, busy * 1e3);
    }
    return std::string();
  });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

INSTANTIATE_TEST_SUITE_P(Core, CpuUse, testing::Values(Transport::kShm, Transport::kSocket),
                         [](const testing::TestParamInfo<Transport>& i) {
                           return std::string(transportName(i.param));
                         });

}  // namespace
}  // namespace loomtest
