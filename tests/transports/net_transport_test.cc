// The generic net transport through the public API: NCCL_NET names a backend (any case),
// pairs that shm does not serve then go through the FIFO<->network pump with exact
// results, the INIT line says "net/<backend>", an unknown name is ncclInvalidArgument
// naming what exists, ranks that disagree about NCCL_NET are told so, and a peer killed
// mid-collective fails the others promptly instead of hanging them. The same over UCX
// (NCCL_NET=UCX) on each transport it runs here.
#include <nccl.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "transports/net/ib_backend.h"
#include "transports/net/ib_devices.h"
#include "transports/net/ucx_api.h"
#include "transports/transport_test_util.h"

namespace loomtest {
namespace {

using NetTransport = TransportLogTest;

// Ranks posing as hosts of their own (LOOM_HOSTID) never share memory.
std::function<void(int)> ownHosts() {
  return [](int rank) { setenv("LOOM_HOSTID", ("nethost" + std::to_string(rank)).c_str(), 1); };
}

TEST_F(NetTransport, NcclNetCarriesEveryPairBetweenHosts) {
  EnvGuard net("NCCL_NET", "Socket");
  auto f = runRanks(Mode::kProcesses, 4, exercise, processRanks(ownHosts()));
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  expectRingTransports(4, [](int, int) { return "net/Socket"; });
}

// NCCL_NET=UCX: every collective exact between 4 hosts over each UCX transport alone, as
// processes and as threads; the INIT lines say net/UCX.
TEST_F(NetTransport, UcxCarriesEveryPairOverEachTransport) {
  if (!loom::ucxBuiltIn()) GTEST_SKIP() << loom::ucxUnavailable();
  EnvGuard net("NCCL_NET", "ucx");
  EnvGuard dev("UCX_NET_DEVICES", "lo");
  for (const char* tls : {"tcp", "posix", "posix,cma"}) {
    EnvGuard t("UCX_TLS", tls);
    clearLogs();
    auto f = runRanks(Mode::kProcesses, 4, exercise, processRanks(ownHosts()));
    ASSERT_TRUE(f.empty()) << "UCX_TLS=" << tls << ": " << joinFailures(f);
    expectRingTransports(4, [](int, int) { return "net/UCX"; });
  }
  {  // RMA put (NCCL_NET=UCX_RMA) where UCX puts natively (cma: process_vm_writev).
    EnvGuard rma("NCCL_NET", "ucx_rma");
    EnvGuard t("UCX_TLS", "posix,cma");
    clearLogs();
    auto f = runRanks(Mode::kProcesses, 4, exercise, processRanks(ownHosts()));
    ASSERT_TRUE(f.empty()) << "UCX_RMA, UCX_TLS=posix,cma: " << joinFailures(f);
    expectRingTransports(4, [](int, int) { return "net/UCX_RMA"; });
  }
  EnvGuard t("UCX_TLS", "tcp");
  EnvGuard shmOff("NCCL_SHM_DISABLE", "1");
  auto f = runRanks(Mode::kThreads, 3, exercise, 60);
  ASSERT_TRUE(f.empty()) << "ranks as threads: " << joinFailures(f);
}

// Threads of this process named `name` (/proc/self/task/*/comm).
int threadsNamed(const std::string& name) {
  int n = 0;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream f(t.path() / "comm");
    std::string comm;
    std::getline(f, comm);
    n += comm == name;
  }
  return n;
}

// The network pump runs on the communicator's proxy thread: one per communicator with net
// connections, none without.
TEST_F(NetTransport, ProxyThreadDrivesTheNetworkPump) {
  for (bool net : {true, false}) {
    EnvGuard n("NCCL_NET", net ? "Socket" : nullptr);
    clearLogs();
    auto f = runRanks(
        Mode::kProcesses, 3,
        [net](int rank, int nranks, ncclComm_t comm) {
          std::string e = exercise(rank, nranks, comm);
          if (!e.empty()) return e;
          int proxies = threadsNamed("loom-proxy");
          if (proxies != (net ? 1 : 0))
            return "rank " + std::to_string(rank) + ": " + std::to_string(proxies) +
                   " loom-proxy threads with NCCL_NET " + (net ? "set" : "unset");
          return std::string();
        },
        processRanks(ownHosts()));
    ASSERT_TRUE(f.empty()) << joinFailures(f);
    expectRingTransports(3, [net](int, int) { return net ? "net/Socket" : "socket"; });
  }
}

// NCCL compares NCCL_NET without case; ranks that are threads go through it as well.
TEST_F(NetTransport, NameInAnyCaseAndRanksAsThreads) {
  EnvGuard net("NCCL_NET", "sOcKeT");
  EnvGuard shmOff("NCCL_SHM_DISABLE", "1");
  for (const char* streams : {"1", "3"}) {
    EnvGuard n("LOOM_SOCKET_NSTREAMS", streams);
    clearLogs();
    auto f = runRanks(Mode::kThreads, 3, exercise, 60);
    ASSERT_TRUE(f.empty()) << streams << " streams: " << joinFailures(f);
    expectRingTransports(3, [](int, int) { return "net/Socket"; });
  }
}

// Shared memory still comes first where it can: NCCL_NET is about the network.
TEST_F(NetTransport, ShmStillServesRanksOfOneHost) {
  EnvGuard net("NCCL_NET", "Socket");
  std::vector<std::string> hosts = {"left", "left", "right", "right"};
  auto f = runRanks(Mode::kProcesses, 4, exercise,
                    processRanks([&](int r) { setenv("LOOM_HOSTID", hosts[r].c_str(), 1); }));
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  expectRingTransports(4, [&](int r, int p) { return hosts[r] == hosts[p] ? "shm" : "net/Socket"; });
}

// A UCX that cannot be loaded fails the init, naming the library tried and dlerror.
TEST_F(NetTransport, UcxThatDoesNotLoadFailsInitNamingWhy) {
  if (!loom::ucxBuiltIn()) GTEST_SKIP() << loom::ucxUnavailable();
  if (loom::ucxProbed()) GTEST_SKIP() << "this process loaded UCX already (CTest runs it alone)";
  EnvGuard net("NCCL_NET", "UCX");
  EnvGuard lib("LOOM_UCX_LIBRARY", "/nonexistent/libucp.so.0");
  auto f = runRanks(Mode::kProcesses, 2, [](int, int, ncclComm_t) { return std::string(); },
                    processRanks(ownHosts()));
  ASSERT_EQ(f.size(), 2u) << "init succeeded without UCX: " << joinFailures(f);
  for (const auto& e : f) {
    EXPECT_NE(e.find("NCCL_NET=UCX: UCX is not loadable"), std::string::npos) << e;
    EXPECT_NE(e.find("/nonexistent/libucp.so.0"), std::string::npos) << e;
  }
}

// UCX with no usable device fails the init naming the settings that left none.
TEST_F(NetTransport, UcxWithoutADeviceFailsInitNamingTheSettings) {
  if (!loom::ucxBuiltIn()) GTEST_SKIP() << loom::ucxUnavailable();
  EnvGuard net("NCCL_NET", "UCX");
  EnvGuard tls("UCX_TLS", "tcp");
  EnvGuard dev("UCX_NET_DEVICES", "nosuch0");
  auto f = runRanks(Mode::kProcesses, 2, [](int, int, ncclComm_t) { return std::string(); },
                    processRanks(ownHosts()));
  ASSERT_EQ(f.size(), 2u) << "init succeeded with no UCX device: " << joinFailures(f);
  for (const auto& e : f) {
    EXPECT_NE(e.find("ucp_init failed"), std::string::npos) << e;
    EXPECT_NE(e.find("UCX_NET_DEVICES=nosuch0"), std::string::npos) << e;
  }
}

TEST_F(NetTransport, UnknownBackendIsInvalidArgumentNamingWhatExists) {
  EnvGuard net("NCCL_NET", "NoSuchNet");
  auto f = runRanks(Mode::kThreads, 2, [](int, int, ncclComm_t) { return std::string(); }, 60);
  ASSERT_EQ(f.size(), 2u) << "init succeeded with NCCL_NET=NoSuchNet";
  for (const auto& e : f) {
    EXPECT_NE(e.find("invalid argument"), std::string::npos) << e;
    EXPECT_NE(e.find("NCCL_NET=NoSuchNet"), std::string::npos) << e;
    EXPECT_NE(e.find("Socket"), std::string::npos) << "does not name the backends there are: " << e;
  }
}

// Ranks that picked different networks, one of them none: a handle one backend cannot read
// (before: "malformed TCP net handle" on one rank, "connection closed" on the other).
// On several hosts every rank's init fails at the peer exchange, with one message naming
// rank 0's network and the first rank's that differs; ranks of one host with shared memory
// off are compared per pair, where the receiver finds it and its sender fails with the
// receiver's words.
TEST_F(NetTransport, RanksDisagreeingAboutNcclNetAreTold) {
  struct Case {
    const char* net2;  // rank 2's NCCL_NET (ranks 0 and 1: Socket); nullptr: unset
    const char* says;  // how the message names rank 2's network
  };
  std::vector<Case> cases = {{nullptr, "uses no network backend (no NCCL_NET, no net plugin started"}};
  if (loom::ucxBuiltIn()) cases.push_back({"UCX", "uses UCX"});
  EnvGuard tls("UCX_TLS", "tcp");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.net2 ? c.net2 : "unset");
    // Hosts h0 (ranks 0, 1) and h1 (rank 2).
    auto f = runRanks(Mode::kProcesses, 3, [](int, int, ncclComm_t) { return std::string(); },
                      processRanks([&](int rank) {
                        setenv("LOOM_HOSTID", rank < 2 ? "h0" : "h1", 1);
                        setenv("NCCL_NET_PLUGIN", "none", 1);
                        if (rank < 2) setenv("NCCL_NET", "Socket", 1);
                        else if (c.net2) setenv("NCCL_NET", c.net2, 1);
                        else unsetenv("NCCL_NET");
                      }));
    ASSERT_EQ(f.size(), 3u) << "a rank's init succeeded: " << joinFailures(f);
    for (const std::string& e : f) {
      EXPECT_NE(e.find("invalid usage"), std::string::npos) << e;
      EXPECT_NE(e.find("the ranks of this communicator picked different networks: rank 0 ("),
                std::string::npos) << e;
      EXPECT_NE(e.find(") uses Socket, rank 2 ("), std::string::npos) << e;
      EXPECT_NE(e.find(c.says), std::string::npos) << e;
    }
  }
  // One host, shared memory off: rank 0 receives from rank 1 over NCCL_NET's Socket.
  auto f = runRanks(Mode::kProcesses, 2, [](int, int, ncclComm_t) { return std::string(); },
                    processRanks([](int rank) {
                      setenv("LOOM_SHM_DISABLE", "1", 1);
                      setenv("NCCL_NET_PLUGIN", "none", 1);
                      if (rank == 0) setenv("NCCL_NET", "Socket", 1);
                      else unsetenv("NCCL_NET");
                    }));
  ASSERT_EQ(f.size(), 2u) << joinFailures(f);
  for (const std::string& e : f) {
    EXPECT_NE(e.find("invalid usage"), std::string::npos) << e;
    EXPECT_NE(e.find("through the network backend Socket, but rank 1 uses no network backend"),
              std::string::npos) << e;
  }
  EXPECT_NE(joinFailures(f).find("rank 1: rank 0 failed to set up its end of connection #0 from "
                                 "this rank: rank 0 receives from rank 1 ("),
            std::string::npos) << joinFailures(f);
}

TEST_F(NetTransport, KilledPeerFailsTheOthersPromptly) {
  EnvGuard net("NCCL_NET", "Socket");
  killedPeerFailsTheOthers("Socket", processRanks(ownHosts()));
}

TEST_F(NetTransport, KilledPeerFailsTheOthersPromptlyOverUcx) {
  if (!loom::ucxBuiltIn()) GTEST_SKIP() << loom::ucxUnavailable();
  EnvGuard net("NCCL_NET", "UCX");
  EnvGuard dev("UCX_NET_DEVICES", "lo");
  for (const char* tls : {"tcp", "posix"}) {
    EnvGuard t("UCX_TLS", tls);
    killedPeerFailsTheOthers("UCX", processRanks(ownHosts()));
    if (HasFailure()) FAIL() << "UCX_TLS=" << tls;
  }
  EnvGuard rma("NCCL_NET", "UCX_RMA");
  EnvGuard t("UCX_TLS", "posix,cma");
  killedPeerFailsTheOthers("UCX_RMA", processRanks(ownHosts()));
}

// Verbs where an RDMA port is active (the rxe VM: ctest -L rxe): every collective exact
// between 4 hosts, with NCCL_NET=IB and with NCCL_NET unset (verbs are the default where
// a port is active), with 2 QPs per connection and ranks as threads; NCCL_IB_DISABLE=1
// gives the default back to the socket transport.
TEST_F(NetTransport, IbCarriesEveryPairNamedAndByDefault) {
  std::string why;
  if (!loom::ibIsDefault(&why)) GTEST_SKIP() << "no active RDMA port here (" << why << ")";
  for (const char* net : {"IB", static_cast<const char*>(nullptr)}) {
    EnvGuard n("NCCL_NET", net);
    clearLogs();
    auto f = runRanks(Mode::kProcesses, 4, exercise, processRanks(ownHosts()));
    ASSERT_TRUE(f.empty()) << "NCCL_NET=" << (net ? net : "(unset)") << ": " << joinFailures(f);
    expectRingTransports(4, [](int, int) { return "net/IB"; });
  }
  {
    EnvGuard n("NCCL_NET", "ib");
    EnvGuard q("NCCL_IB_QPS_PER_CONNECTION", "2");
    EnvGuard shmOff("NCCL_SHM_DISABLE", "1");
    auto f = runRanks(Mode::kThreads, 3, exercise, 60);
    ASSERT_TRUE(f.empty()) << "2 QPs, ranks as threads: " << joinFailures(f);
  }
  EnvGuard off("NCCL_IB_DISABLE", "1");
  clearLogs();
  auto f = runRanks(Mode::kProcesses, 2, exercise, processRanks(ownHosts()));
  ASSERT_TRUE(f.empty()) << "NCCL_IB_DISABLE=1: " << joinFailures(f);
  expectRingTransports(2, [](int, int) { return "socket"; });
}

TEST_F(NetTransport, KilledPeerFailsTheOthersPromptlyOverIb) {
  std::string why;
  if (!loom::ibIsDefault(&why)) GTEST_SKIP() << "no active RDMA port here (" << why << ")";
  EnvGuard net("NCCL_NET", "IB");
  killedPeerFailsTheOthers("IB", processRanks(ownHosts()));
}

}  // namespace
}  // namespace loomtest

namespace loomtest {
namespace {

// Rails over verbs where two RDMA ports are active (the rxe VM with LOOM_RXE_PORTS=2):
// on 2 hosts of 2 ranks, local rank 0 receives on rxe0 and local rank 1 on rxe1, both ends
// of each connection on the same port (rxe devices of one VM reach only themselves, so a
// connection across rails could not carry anything), results exact.
TEST_F(NetTransport, IbRailsSpreadLocalRanksOverPorts) {
  std::string why;
  if (!loom::ibIsDefault(&why)) GTEST_SKIP() << "no active RDMA port here (" << why << ")";
  std::vector<loom::IbPort> ports = loom::selectIbPorts(loom::listIbPorts(nullptr), "");
  if (ports.size() < 2) GTEST_SKIP() << "one RDMA port here; rails need two";
  EnvGuard net("NCCL_NET", "IB");
  clearLogs();
  auto f = runRanks(Mode::kProcesses, 4, exercise, processRanks([](int rank) {
    setenv("LOOM_HOSTID", ("railhost" + std::to_string(rank / 2)).c_str(), 1);
  }));
  ASSERT_TRUE(f.empty()) << joinFailures(f);
  expectRails(4, ports[0].device, ports[1].device);
}

}  // namespace
}  // namespace loomtest
