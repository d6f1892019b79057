// Shared pieces of the multi-rank core suites: the (mode x nranks x transport) parameter
// matrix and its fixture, environment guards, hashing and small socket helpers.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/rank_harness.h"

namespace loomtest {

enum class Transport { kShm, kSocket };
inline const char* transportName(Transport t) { return t == Transport::kShm ? "shm" : "socket"; }

struct CoreParam {
  Mode mode;
  int nranks;
  Transport transport;
};

inline std::string coreParamName(const testing::TestParamInfo<CoreParam>& info) {
  return std::string(modeName(info.param.mode)) + "_" + std::to_string(info.param.nranks) + "_" +
         transportName(info.param.transport);
}

// Every mode x {1, 2, 3, 4, 8} ranks x transport.
inline std::vector<CoreParam> fullMatrix() {
  std::vector<CoreParam> v;
  for (Mode m : {Mode::kThreads, Mode::kProcesses})
    for (int n : {1, 2, 3, 4, 8})
      for (Transport t : {Transport::kShm, Transport::kSocket}) v.push_back({m, n, t});
  return v;
}

// For checks whose interest is breadth of API, not of rank counts: fewer cases.
inline std::vector<CoreParam> reducedMatrix() {
  std::vector<CoreParam> v;
  for (Mode m : {Mode::kThreads, Mode::kProcesses})
    for (int n : {1, 3, 4})
      for (Transport t : {Transport::kShm, Transport::kSocket}) v.push_back({m, n, t});
  v.push_back({Mode::kThreads, 8, Transport::kShm});
  v.push_back({Mode::kProcesses, 8, Transport::kSocket});
  return v;
}

// Sets (or, with nullptr, unsets) an environment variable for one scope.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~EnvGuard() {
    if (old_) setenv(name_.c_str(), old_->c_str(), 1);
    else unsetenv(name_.c_str());
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Runs each parameterized case on its transport: NCCL_SHM_DISABLE=1 forces TCP between
// ranks of one host.
class CoreTest : public testing::TestWithParam<CoreParam> {
 protected:
  void SetUp() override {
    if (GetParam().transport == Transport::kSocket) shmOff_.emplace("NCCL_SHM_DISABLE", "1");
  }
  Transport transport() const { return GetParam().transport; }
  Mode mode() const { return GetParam().mode; }
  int nranks() const { return GetParam().nranks; }

  void run(const RankFn& fn, int timeoutSec = 120) {
    auto f = runRanks(mode(), nranks(), fn, timeoutSec);
    EXPECT_TRUE(f.empty()) << joinFailures(f);
  }

 private:
  std::optional<EnvGuard> shmOff_;
  // A deadlock becomes a failure naming the stuck operation (after 60 s without progress)
  // rather than the harness aborting the whole binary at its 120 s limit.
  EnvGuard stallLimit_{"LOOM_TIMEOUT", "60"};
};

inline uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// All-gathers one 64-bit value per rank over `comm` and checks every rank's equals ours.
inline std::string expectSameOnAllRanks(ncclComm_t comm, int rank, int nranks, uint64_t value,
                                        const char* what) {
  std::vector<uint64_t> all(nranks, 0);
  RANK_NCCL(ncclAllGather(&value, all.data(), 1, ncclUint64, comm, nullptr));
  RANK_CHECK(all[rank] == value, "%s: own slot holds %#llx, not %#llx", what,
             static_cast<unsigned long long>(all[rank]), static_cast<unsigned long long>(value));
  for (int r = 0; r < nranks; ++r)
    RANK_CHECK(all[r] == value, "%s differs: rank %d has %#llx, rank %d has %#llx", what, r,
               static_cast<unsigned long long>(all[r]), rank,
               static_cast<unsigned long long>(value));
  return "";
}

// Polls ncclCommGetAsyncError until comm's state is no longer ncclInProgress, for at most
// `seconds`; the state (ncclInternalError if the poll itself failed).
inline ncclResult_t settle(ncclComm_t comm, double seconds = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return state;
}

// n non-blocking ranks of one communicator, all made by this thread (each init returns at
// once), settled; failures are the caller's test's (check HasFailure()).
inline std::vector<ncclComm_t> nonBlockingRanks(int n) {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::vector<ncclComm_t> comms(n, nullptr);
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(ncclCommInitRankConfig(&comms[r], n, id, r, &config), ncclInProgress)
        << ncclGetLastError(nullptr);
  for (ncclComm_t c : comms) EXPECT_EQ(settle(c), ncclSuccess) << ncclGetLastError(c);
  return comms;
}

// One thread's all-reduce over the ranks it drives, in one group: every rank j of `comms`
// (global rank ranks[j]; null ones skipped) contributes ranks[j] + 1 in each element, and
// expect[j] is the sum it must get.
inline std::string allReduceInGroup(const std::vector<ncclComm_t>& comms,
                                    const std::vector<int>& ranks, const std::vector<int>& expect) {
  constexpr size_t kCount = 70001;
  std::vector<std::vector<int32_t>> in(comms.size()), out(comms.size());
  RANK_NCCL(ncclGroupStart());
  for (size_t j = 0; j < comms.size(); ++j) {
    if (!comms[j]) continue;
    in[j].assign(kCount, ranks[j] + 1);
    out[j].assign(kCount, -1);
    RANK_NCCL(ncclAllReduce(in[j].data(), out[j].data(), kCount, ncclInt32, ncclSum, comms[j], nullptr));
  }
  RANK_NCCL(ncclGroupEnd());
  for (size_t j = 0; j < comms.size(); ++j)
    for (size_t i = 0; comms[j] && i < kCount; ++i)
      RANK_CHECK(out[j][i] == expect[j], "rank %d: [%zu] = %d, want %d", ranks[j], i,
                 out[j][i], expect[j]);
  return "";
}

// A TCP port on `host` (127.0.0.1 or ::1) that was free a moment ago; 0 if none.
inline int freePort(const char* host = "127.0.0.1") {
  bool v6 = strchr(host, ':') != nullptr;
  int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_storage ss{};
  socklen_t len;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    inet_pton(AF_INET6, host, &a->sin6_addr);
    len = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    inet_pton(AF_INET, host, &a->sin_addr);
    len = sizeof(*a);
  }
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0)
    port = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                    : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  close(fd);
  return port;
}

inline bool haveIpv6Loopback() { return freePort("::1") != 0; }

}  // namespace loomtest
