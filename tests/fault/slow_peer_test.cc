// The liveness time-out (LOOM_SOCKET_TIMEOUT: TCP keepalive and TCP_USER_TIMEOUT) must
// find a silent host, never a busy process: a peer that stops reading for longer than the
// time-out (its socket buffers full, the sender probing a zero window) and a connection
// left idle for longer are still alive, because the peer's kernel answers. Two ranks as
// processes over TCP, with the time-out shortened to 2 s and 6 s pauses.
#include <gtest/gtest.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "core/core_util.h"
#include "fault/fault_util.h"

namespace loomtest {
namespace {

using namespace fault;

constexpr int kRanks = 2;
constexpr int kPauseMs = 6000;  // three times LOOM_SOCKET_TIMEOUT

std::string pausingRank(const ncclUniqueId& id, int rank) {
  ncclComm_t comm = nullptr;
  RANK_CHECK(ncclCommInitRank(&comm, kRanks, id, rank) == ncclSuccess, "init: %s",
             ncclGetLastError(nullptr));
  std::vector<float> v(16u << 20);  // 64 MiB: far more than the sockets buffer
  for (int step = 0; step < 3; ++step) {
    // Step 1: rank 1 arrives late, so rank 0 blocks with its data unread.
    // Step 2: both pause, so every connection sits idle through the keepalive probes.
    if ((step == 1 && rank == 1) || step == 2) sleepMs(kPauseMs);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((rank + 1) * (i % 97) + step);
    ncclResult_t rc = ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat32, ncclSum, comm, nullptr);
    RANK_CHECK(rc == ncclSuccess, "step %d: %s", step, ncclGetLastError(comm));
    for (size_t i = 0; i < v.size(); i += 4099)
      RANK_CHECK(v[i] == static_cast<float>(3 * (i % 97) + 2 * step), "step %d: [%zu] = %g", step, i, v[i]);
  }
  RANK_CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
  return "";
}

TEST(FaultSlowPeer, BusyOrIdlePeerOutlivesTheSocketTimeout) {
  EnvGuard timeout("LOOM_SOCKET_TIMEOUT", "2");
  EnvGuard tcp("NCCL_SHM_DISABLE", "1");
  LateId id;  // made after the forks
  std::vector<Child> kids(kRanks);
  for (int r = 0; r < kRanks; ++r) kids[r] = forkChild([&, r] { return pausingRank(id, r); });
  ASSERT_EQ(id.make(), ncclSuccess);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(waitChild(kids[r], 90), "") << "rank " << r;
}

}  // namespace
}  // namespace loomtest
