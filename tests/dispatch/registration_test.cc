// Registration, symmetric memory windows, NCCL's device API and ncclMemAlloc where stock
// NCCL serves a communicator's device memory (api/registration.cc, api/device_api.cc,
// api/mem_alloc.cc): stock NCCL's handles come back and go back to it; where Loom serves
// device memory, windows and the device API are refused saying why. Built twice, as
// fallback_routing_test.cc (see there): the stand-in stock NCCL and the machine's real one.
#include <cstring>
#include <thread>

#include "base/mem_kind.h"
#include "dispatch/nccl_extra_abi.h"
#include "dispatch/routing_fixture.h"

namespace {

using namespace routing;

[[maybe_unused]] bool sameTeam(ncclTeam_t a, ncclTeam_t b) {
  return a.nRanks == b.nRanks && a.rank == b.rank && a.stride == b.stride;
}

#ifdef LOOM_STAND_IN_NCCL_PATH

const auto kStream0 = reinterpret_cast<cudaStream_t>(0x5200);
const auto kStream1 = reinterpret_cast<cudaStream_t>(0x5201);

TEST_F(StandInStock, DeviceBuffersAreRegisteredWithStockAndHostBuffersStayWithLoom) {
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  float* d0 = deviceFloats(64, 0, 1);
  std::vector<float> host(64, 1);
  void* h = nullptr;
  void* hh = nullptr;
  ASSERT_EQ(ncclCommRegister(c[0], d0, 256, &h), ncclSuccess) << ncclGetLastError(c[0]);
  ASSERT_EQ(ncclCommRegister(c[0], host.data(), 256, &hh), ncclSuccess);
  std::string calls = log_.str();
  EXPECT_EQ(countOf(calls, "CommRegister "), 1u) << calls;
  char want[64];
  snprintf(want, sizeof want, "buff=%p size=256", static_cast<void*>(d0));
  EXPECT_TRUE(has(calls, want)) << calls;
  EXPECT_NE(h, static_cast<void*>(d0)) << "stock NCCL's handle, not Loom's";
  EXPECT_EQ(hh, static_cast<void*>(host.data())) << "Loom's own no-op handle";
  ASSERT_EQ(ncclCommDeregister(c[0], hh), ncclSuccess);
  EXPECT_EQ(countOf(log_.str(), "CommDeregister"), 0u) << log_.str();
  ASSERT_EQ(ncclCommDeregister(c[0], h), ncclSuccess) << ncclGetLastError(c[0]);
  EXPECT_EQ(countOf(log_.str(), "CommDeregister rank=0"), 1u) << log_.str();
  // A handle this communicator did not give out (or gave back already) is refused, as
  // NCCL refuses it; NULL is a no-op.
  EXPECT_EQ(ncclCommDeregister(c[0], h), ncclInvalidUsage);
  EXPECT_TRUE(has(ncclGetLastError(c[0]), "was not registered on this communicator"))
      << ncclGetLastError(c[0]);
  EXPECT_EQ(ncclCommDeregister(c[0], hh), ncclInvalidUsage);
  EXPECT_EQ(ncclCommDeregister(c[0], nullptr), ncclSuccess);
  EXPECT_EQ(countOf(log_.str(), "CommDeregister"), 1u) << log_.str();
}

// Stock NCCL gives NULL for a registration or a window where it has none to give (its
// registration off, no symmetric memory): NULL comes back, and giving it back is a no-op.
TEST_F(StandInStock, NullHandlesFromStockAreNoOps) {
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  float* d0 = deviceFloats(64, 0, 1);
  float* d1 = deviceFloats(64, 1, 1);
  log_.nullHandles(1);
  void* h = &h;
  ASSERT_EQ(ncclCommRegister(c[0], d0, 256, &h), ncclSuccess) << ncclGetLastError(c[0]);
  EXPECT_EQ(h, nullptr);
  EXPECT_EQ(ncclCommDeregister(c[0], h), ncclSuccess) << ncclGetLastError(c[0]);
  ncclWindow_t w0 = nullptr, w1 = nullptr;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclCommWindowRegister(c[0], d0, 256, &w0, NCCL_WIN_COLL_SYMMETRIC), ncclSuccess);
  ASSERT_EQ(ncclCommWindowRegister(c[1], d1, 256, &w1, NCCL_WIN_COLL_SYMMETRIC), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  log_.nullHandles(0);
  EXPECT_EQ(w0, nullptr);
  EXPECT_EQ(w1, nullptr);
  void* p = &p;
  EXPECT_EQ(ncclWinGetUserPtr(c[0], w0, &p), ncclSuccess) << ncclGetLastError(c[0]);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(ncclCommWindowDeregister(c[0], w0), ncclSuccess) << ncclGetLastError(c[0]);
  EXPECT_EQ(ncclGetPeerDevicePointer(w0, 0, 1, &p), ncclInvalidArgument);
  EXPECT_EQ(countOf(log_.str(), "Deregister"), 0u) << log_.str();
}

TEST_F(StandInStock, WindowsAreStocksAndShowEachRanksBuffer) {
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  float* d0 = deviceFloats(64, 0, 1);
  float* d1 = deviceFloats(64, 1, 10);
  ncclWindow_t w0 = nullptr, w1 = nullptr;
  // One thread registering both ranks: inside a group, as NCCL wants it, the windows are
  // made at the group's end.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclCommWindowRegister(c[0], d0, 256, &w0, NCCL_WIN_COLL_SYMMETRIC), ncclSuccess)
      << ncclGetLastError(c[0]);
  ASSERT_EQ(ncclCommWindowRegister(c[1], d1, 256, &w1, NCCL_WIN_COLL_SYMMETRIC), ncclSuccess);
  EXPECT_EQ(w0, nullptr) << "set at the group's end";
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_NE(w0, nullptr);
  ASSERT_NE(w1, nullptr);
  // Both reached stock NCCL inside one stock group (the stand-in's registration is
  // collective: one thread registering its ranks one after another outside a group would
  // wait for the other rank).
  std::string calls = log_.str();
  EXPECT_TRUE(has(calls, "GroupStart\nCommWindowRegister rank=0 size=256 flags=1 round=0 group=1\n"
                         "CommWindowRegister rank=1 size=256 flags=1 round=0 group=1\nGroupEnd"))
      << calls;
  EXPECT_EQ(ncclCommWindowRegister(c[0], nullptr, 0, &w0, NCCL_WIN_DEFAULT), ncclInvalidArgument);

  // What a window is, asked of stock NCCL: rank 0's window shows rank 1's buffer.
  void* p = nullptr;
  ASSERT_EQ(ncclGetPeerDevicePointer(w0, 16, 1, &p), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(p, reinterpret_cast<char*>(d1) + 16);
  ASSERT_EQ(ncclWinGetUserPtr(c[0], w0, &p), ncclSuccess) << ncclGetLastError(c[0]);
  EXPECT_EQ(p, static_cast<void*>(d0));
  EXPECT_EQ(ncclWinGetUserPtr(c[1], w0, &p), ncclInvalidArgument);
  EXPECT_TRUE(has(ncclGetLastError(c[1]), "is not a window of this communicator"))
      << ncclGetLastError(c[1]);
  EXPECT_EQ(ncclGetLsaMultimemDevicePointer(w0, 0, &p), ncclInvalidUsage);
  EXPECT_TRUE(has(ncclGetLastError(nullptr), "stand-in: no multimem")) << ncclGetLastError(nullptr);
  int notAWindow = 0;
  EXPECT_EQ(ncclGetPeerDevicePointer(reinterpret_cast<ncclWindow_t>(&notAWindow), 0, 1, &p),
            ncclInvalidUsage);
  EXPECT_TRUE(has(ncclGetLastError(nullptr), "is not stock NCCL's")) << ncclGetLastError(nullptr);

  // Collectives on the windows' buffers are stock NCCL's too.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(d0, d0, 64, ncclFloat, ncclSum, c[0], nullptr), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(d1, d1, 64, ncclFloat, ncclSum, c[1], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(d0[i], 11 + 2 * (i % 7)) << i;

  EXPECT_EQ(ncclCommWindowDeregister(c[1], w0), ncclInvalidArgument);
  EXPECT_TRUE(has(ncclGetLastError(c[1]), "is not a window of this communicator"))
      << ncclGetLastError(c[1]);
  ASSERT_EQ(ncclCommWindowDeregister(c[0], w0), ncclSuccess) << ncclGetLastError(c[0]);
  ASSERT_EQ(ncclCommWindowDeregister(c[1], w1), ncclSuccess) << ncclGetLastError(c[1]);
  EXPECT_EQ(countOf(log_.str(), "CommWindowDeregister"), 2u) << log_.str();
  EXPECT_EQ(ncclCommWindowDeregister(c[0], w0), ncclInvalidArgument);
  EXPECT_EQ(ncclGetPeerDevicePointer(w0, 0, 1, &p), ncclInvalidUsage) << "deregistered";
}

// NCCL 2.30's one-sided calls are stock NCCL's with its windows: a put lands in the peer's
// window buffer and its signal is waited for.
TEST_F(StandInStock, PutsAndSignalsGoThroughStocksWindows) {
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  float* win[2] = {deviceFloats(64, 0, 0), deviceFloats(64, 1, 0)};
  float* src = deviceFloats(8, 0, 40);
  ncclWindow_t w[2] = {nullptr, nullptr};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(ncclCommWindowRegister(c[r], win[r], 256, &w[r], NCCL_WIN_COLL_SYMMETRIC), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  log_.clear();
  // Rank 0 puts 8 floats at byte 32 of rank 1's window and signals; rank 1 waits for it.
  ASSERT_EQ(ncclPutSignal(src, 8, ncclFloat, 1, w[0], 32, 0, 0, 0, c[0], kStream0), ncclSuccess)
      << ncclGetLastError(c[0]);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(win[1][8 + i], 40 + i % 7) << i;
  struct {
    int opCnt, peer, sigIdx, ctx;
  } desc[2] = {{1, 0, 0, 0}, {1, 0, 3, 0}};
  ASSERT_EQ(ncclSignal(1, 3, 0, 0, c[0], kStream0), ncclSuccess) << ncclGetLastError(c[0]);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclWaitSignal(2, reinterpret_cast<ncclWaitSignalDesc*>(desc), c[1], kStream1),
            ncclSuccess) << ncclGetLastError(c[1]);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  std::string calls = log_.str();
  for (const char* call : {"PutSignal rank=0 peer=1 bytes=32 offset=32 sigIdx=0",
                           "Signal rank=0 peer=1 sigIdx=3", "GroupStart\nWaitSignal rank=1 n=2\nGroupEnd"})
    EXPECT_TRUE(has(calls, call)) << call << "\n" << calls;
  // Stock NCCL's own failure comes back (no signal left to wait for); bad arguments never
  // reach it.
  EXPECT_EQ(ncclWaitSignal(1, reinterpret_cast<ncclWaitSignalDesc*>(desc), c[1], kStream1),
            ncclInvalidUsage);
  EXPECT_TRUE(has(ncclGetLastError(c[1]), "signals not arrived")) << ncclGetLastError(c[1]);
  EXPECT_EQ(ncclPutSignal(src, 8, ncclFloat, 1, w[1], 0, 0, 0, 0, c[0], kStream0), ncclInvalidArgument);
  EXPECT_TRUE(has(ncclGetLastError(c[0]), "is not a window of this communicator"));
  EXPECT_EQ(ncclSignal(2, 0, 0, 0, c[0], kStream0), ncclInvalidArgument);
  EXPECT_EQ(ncclWaitSignal(1, nullptr, c[1], kStream1), ncclInvalidArgument);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(ncclCommWindowDeregister(c[r], w[r]), ncclSuccess);
}

// NCCL 2.30's calls about a communicator's GPU memory are stock NCCL's where it serves the
// communicator; elsewhere refused saying who serves it.
TEST_F(StandInStock, MemoryStatisticsAndSuspensionAreStocks) {
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  uint64_t v = 0;
  ASSERT_EQ(ncclCommMemStats(c[1], 3, &v), ncclSuccess) << ncclGetLastError(c[1]);
  EXPECT_EQ(v, 8192u) << "the stand-in's figure for its rank 1";
  ASSERT_EQ(ncclCommSuspend(c[1], 1), ncclSuccess) << ncclGetLastError(c[1]);
  ASSERT_EQ(ncclCommMemStats(c[1], 1, &v), ncclSuccess);
  EXPECT_EQ(v, 1u) << "suspended";
  ASSERT_EQ(ncclCommResume(c[1]), ncclSuccess);
  ASSERT_EQ(ncclCommMemStats(c[1], 1, &v), ncclSuccess);
  EXPECT_EQ(v, 0u);
  EXPECT_EQ(ncclCommMemStats(c[1], 9, &v), ncclInvalidArgument);
  EXPECT_TRUE(has(ncclGetLastError(c[1]), "stand-in: no such statistic")) << ncclGetLastError(c[1]);
  EXPECT_TRUE(has(log_.str(), "CommSuspend rank=1 flags=1\nCommResume rank=1")) << log_.str();
  {
    ScopedFallback off("off");
    Comms loomServed({0});
    ASSERT_EQ(loomServed.rc, ncclSuccess) << loomServed.error;
    EXPECT_EQ(ncclCommSuspend(loomServed[0], 1), ncclInvalidUsage);
    EXPECT_TRUE(has(ncclGetLastError(loomServed[0]), "LOOM_NCCL_FALLBACK=off"))
        << ncclGetLastError(loomServed[0]);
  }
}

// Each thread registers its own rank's window, outside any group: the calls wait for each
// other, as stock NCCL's collective registration does.
TEST_F(StandInStock, WindowsOutsideAGroupAreMadeByEveryRanksThread) {
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  float* d[2] = {deviceFloats(64, 0, 1), deviceFloats(64, 1, 1)};
  ncclWindow_t w[2] = {nullptr, nullptr};
  ncclResult_t rc[2] = {ncclInternalError, ncclInternalError};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      rc[r] = ncclCommWindowRegister(c[r], d[r], 256, &w[r], NCCL_WIN_COLL_SYMMETRIC);
    });
  for (auto& t : ranks) t.join();
  ASSERT_EQ(rc[0], ncclSuccess) << ncclGetLastError(c[0]);
  ASSERT_EQ(rc[1], ncclSuccess) << ncclGetLastError(c[1]);
  void* p = nullptr;
  ASSERT_EQ(ncclGetPeerDevicePointer(w[1], 8, 0, &p), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(p, reinterpret_cast<char*>(d[0]) + 8);
  EXPECT_EQ(countOf(log_.str(), "group=0"), 2u) << log_.str();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(ncclCommWindowDeregister(c[r], w[r]), ncclSuccess);
}

TEST_F(StandInStock, DeviceApiRunsOnStocksCommunicator) {
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  alignas(64) int dev0[64] = {}, dev1[64] = {};
  int* devs[2] = {dev0, dev1};
  // Requirements made afresh for each rank and gone before the group ends (NCCL copies
  // them when the call is made): the device communicators are created at the group's end.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int i = 0; i < 2; ++i) {
    alignas(64) int mine[64] = {};
    mine[0] = 100 + i;
    ASSERT_EQ(ncclDevCommCreate(c[i], reinterpret_cast<ncclDevCommRequirements_t*>(mine),
                                reinterpret_cast<ncclDevComm_t*>(devs[i])),
              ncclSuccess)
        << ncclGetLastError(c[i]);
    memset(mine, 0xff, sizeof mine);
  }
  EXPECT_EQ(dev0[1], 0) << "made at the group's end";
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  // Filled by stock NCCL with its own communicators' ranks and the requirements as given.
  EXPECT_EQ(dev0[0], 0);
  EXPECT_EQ(dev0[1], 2);
  EXPECT_EQ(dev0[2], 100);
  EXPECT_EQ(dev1[0], 1);
  EXPECT_EQ(dev1[1], 2);
  EXPECT_EQ(dev1[2], 101);
  EXPECT_TRUE(sameTeam(ncclTeamWorld(c[1]), {2, 1, 1}));
  EXPECT_TRUE(sameTeam(ncclTeamLsa(c[0]), {2, 0, 1}));
  EXPECT_TRUE(sameTeam(ncclTeamRail(c[0]), {1, 0, 1}));
  EXPECT_EQ(ncclTeamRankToWorld(c[0], {2, 0, 3}, 1), 3);
  EXPECT_EQ(ncclTeamRankToLsa(c[0], {2, 0, 2}, 1), 2);
  alignas(64) char handle[256] = {}, req[256] = {};
  EXPECT_EQ(ncclGinBarrierCreateRequirement(c[0], {2, 0, 1}, 4,
                                            reinterpret_cast<ncclGinBarrierHandle_t*>(handle),
                                            reinterpret_cast<ncclDevResourceRequirements_t*>(req)),
            ncclSuccess);
  EXPECT_EQ(ncclLsaBarrierCreateRequirement({2, 0, 1}, 5,
                                            reinterpret_cast<ncclLsaBarrierHandle_t*>(handle),
                                            reinterpret_cast<ncclDevResourceRequirements_t*>(req)),
            ncclSuccess);
  EXPECT_EQ(ncclLLA2ACalcSlots(64, 16), 128);
  EXPECT_EQ(ncclLLA2ACreateRequirement(2, 128, reinterpret_cast<ncclLLA2AHandle_t*>(handle),
                                       reinterpret_cast<ncclDevResourceRequirements_t*>(req)),
            ncclSuccess);
  EXPECT_EQ(ncclDevCommDestroy(c[0], reinterpret_cast<ncclDevComm_t*>(dev0)), ncclSuccess);
  std::string calls = log_.str();
  for (const char* call : {"DevCommCreate rank=0 group=1", "DevCommCreate rank=1 group=1",
                           "GinBarrierCreateRequirement rank=0 n=4",
                           "LsaBarrierCreateRequirement nRanks=2 n=5",
                           "LLA2ACreateRequirement nBlocks=2 nSlots=128", "DevCommDestroy rank=0"})
    EXPECT_TRUE(has(calls, call)) << call << "\n" << calls;
  EXPECT_EQ(ncclDevCommCreate(c[0], nullptr, reinterpret_cast<ncclDevComm_t*>(dev0)),
            ncclInvalidArgument);
}

TEST_F(StandInStock, WindowsAndTheDeviceApiAreRefusedWhereLoomServesDeviceMemory) {
  ScopedFallback off("off");
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  float* d0 = deviceFloats(64, 0, 1);
  ncclWindow_t w = nullptr;
  EXPECT_EQ(ncclCommWindowRegister(c[0], d0, 256, &w, NCCL_WIN_DEFAULT), ncclInvalidUsage);
  std::string msg = ncclGetLastError(c[0]);
  EXPECT_TRUE(has(msg, "symmetric memory windows are stock NCCL's")) << msg;
  EXPECT_TRUE(has(msg, "LOOM_NCCL_FALLBACK=off")) << msg;
  alignas(64) char reqs[256] = {}, devComm[256] = {};
  EXPECT_EQ(ncclDevCommCreate(c[0], reinterpret_cast<ncclDevCommRequirements_t*>(reqs),
                              reinterpret_cast<ncclDevComm_t*>(devComm)),
            ncclInvalidUsage);
  EXPECT_TRUE(has(ncclGetLastError(c[0]), "device-side API (nccl_device.h) is stock NCCL's"))
      << ncclGetLastError(c[0]);
  EXPECT_TRUE(sameTeam(ncclTeamWorld(c[0]), {0, 0, 1})) << "the empty team";
  EXPECT_TRUE(has(ncclGetLastError(c[0]), "ncclTeamWorld")) << ncclGetLastError(c[0]);
  EXPECT_EQ(ncclLLA2ACalcSlots(64, 16), -1);
  EXPECT_TRUE(has(ncclGetLastError(nullptr), "LOOM_NCCL_FALLBACK=off")) << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclSignal(1, 0, 0, 0, c[0], nullptr), ncclInvalidUsage);
  EXPECT_TRUE(has(ncclGetLastError(c[0]), "one-sided calls go through symmetric memory windows"))
      << ncclGetLastError(c[0]);
  // Registration stays a no-op: Loom's collectives need none.
  void* h = nullptr;
  ASSERT_EQ(ncclCommRegister(c[0], d0, 256, &h), ncclSuccess);
  EXPECT_EQ(h, static_cast<void*>(d0));
  ASSERT_EQ(ncclCommDeregister(c[0], h), ncclSuccess);
  std::string calls = log_.str();
  for (const char* call : {"CommRegister", "CommWindowRegister", "DevCommCreate", "MemAlloc", "Signal"})
    EXPECT_FALSE(has(calls, call)) << call << "\n" << calls;
}

// ncclMemAlloc: stock NCCL's memory (cuMem, what its windows need) unless the fallback is
// off or a communicator whose device memory Loom serves is on the device; cuMemAlloc where
// stock NCCL's allocation fails.
TEST_F(StandInStock, MemAllocTakesStocksMemoryUnlessLoomServesTheDevice) {
  hooks_.setCurrentDevice(2);
  auto alloc = [&](const char* why, bool byStock) {
    SCOPED_TRACE(why);
    log_.clear();
    void* p = nullptr;
    ASSERT_EQ(ncclMemAlloc(&p, 1000), ncclSuccess) << ncclGetLastError(nullptr);
    loom::MemInfo info = loom::classifyPointer(p);
    EXPECT_EQ(info.kind, loom::MemKind::kDevice);
    EXPECT_EQ(info.device, 2);
    EXPECT_EQ(has(log_.str(), "MemAlloc size=1000 device=2"), byStock) << log_.str();
    ASSERT_EQ(ncclMemFree(p), ncclSuccess) << ncclGetLastError(nullptr);
    EXPECT_EQ(has(log_.str(), "MemFree"), byStock) << log_.str();
  };
  alloc("auto, no communicator", true);
  {
    ScopedFallback off("off");
    alloc("off", false);
  }
  {
    std::unique_ptr<Comms> loomServed;
    {
      ScopedFallback off("off");
      loomServed = std::make_unique<Comms>(std::vector<int>{2});
      ASSERT_EQ(loomServed->rc, ncclSuccess) << loomServed->error;
    }
    alloc("auto, a communicator on device 2 that Loom serves", false);
    Comms other({1});
    ASSERT_EQ(other.rc, ncclSuccess) << other.error;
    loomServed.reset();
    alloc("auto, that communicator destroyed", true);
  }
  log_.failMemAlloc(1);
  alloc("stock's allocation fails", false);
  EXPECT_TRUE(has(log_.str(), "MemAlloc size=1000 failed")) << log_.str();
  log_.failMemAlloc(0);
  hooks_.setCurrentDevice(0);
}

#else  // the machine's real stock NCCL, which finds no GPU here

TEST_F(RealStock, MemAllocFallsBackToLoomWhereStockCannotAllocate) {
  hooks_.setCurrentDevice(1);
  void* p = nullptr;
  ASSERT_EQ(ncclMemAlloc(&p, 4096), ncclSuccess) << ncclGetLastError(nullptr);
  loom::MemInfo info = loom::classifyPointer(p);
  EXPECT_EQ(info.kind, loom::MemKind::kDevice);
  EXPECT_EQ(info.device, 1);
  EXPECT_EQ(ncclMemFree(p), ncclSuccess) << ncclGetLastError(nullptr);
  hooks_.setCurrentDevice(0);
}

TEST_F(RealStock, WindowsSayWhyStockServesNothing) {
  Comms c({0, 1});
  ASSERT_EQ(c.rc, ncclSuccess) << c.error;
  float* d0 = deviceFloats(64, 0, 1);
  ncclWindow_t w = nullptr;
  EXPECT_EQ(ncclCommWindowRegister(c[0], d0, 256, &w, NCCL_WIN_COLL_SYMMETRIC), ncclInvalidUsage);
  std::string msg = ncclGetLastError(c[0]);
  EXPECT_TRUE(has(msg, "symmetric memory windows are stock NCCL's")) << msg;
  EXPECT_TRUE(has(msg, "could not create its communicator")) << msg;
  alignas(64) char reqs[256] = {}, devComm[256] = {};
  EXPECT_EQ(ncclDevCommCreate(c[1], reinterpret_cast<ncclDevCommRequirements_t*>(reqs),
                              reinterpret_cast<ncclDevComm_t*>(devComm)),
            ncclInvalidUsage);
  EXPECT_TRUE(has(ncclGetLastError(c[1]), "could not create its communicator"))
      << ncclGetLastError(c[1]);
}

#endif

}  // namespace
