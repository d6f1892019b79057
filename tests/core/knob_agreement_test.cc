// Knobs every rank must set alike (NCCL_ALGO, NCCL_PROTO, the FIFO shape, the executor, ...):
// a rank launched with another value fails the init on every rank, naming the knob, two
// ranks and their values, instead of running other plans than its peers (a wait until
// LOOM_TIMEOUT, or FIFOs of different sizes). Values that differ only in how they are
// written agree. Ranks are processes: threads of one process share one environment.
#include <nccl.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "base/log.h"
#include "algo/select.h"
#include "api/comm.h"
#include "core/core_util.h"

namespace loomtest {
namespace {

using Settings = std::vector<std::pair<const char*, const char*>>;

// Each rank process sets its own variables, inits, and hands `body` the init's result, its
// message and the communicator (when made); body's "" is success.
using InitBody = std::function<std::string(int rank, ncclResult_t r, const std::string& msg,
                                           ncclComm_t comm)>;
// With `configure`, each rank inits with the config it fills (ncclCommInitRankConfig).
using Configure = std::function<void(int rank, ncclConfig_t* config)>;
std::vector<std::string> initEach(const std::vector<Settings>& perRank, const InitBody& body,
                                  const Configure& configure = nullptr, Mode mode = Mode::kProcesses) {
  LateId late;
  return runEach(
      mode, static_cast<int>(perRank.size()),
      [&](int rank, int n) {
        ncclUniqueId id;
        RANK_TRY(late.wait(&id));
        for (const auto& [name, value] : perRank[rank]) setenv(name, value, 1);
        ncclComm_t comm = nullptr;
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        if (configure) configure(rank, &config);
        const ncclResult_t r = configure ? ncclCommInitRankConfig(&comm, n, id, rank, &config)
                                         : ncclCommInitRank(&comm, n, id, rank);
        return body(rank, r, ncclGetLastError(nullptr), comm);
      },
      120, [&] { return makeId(late); });
}

// Every rank's init must fail with ncclInvalidUsage and a message containing `want`, but
// rank `own`, if any, with ncclInvalidArgument and `ownWant` (its own malformed value).
void expectInitFails(const std::vector<Settings>& perRank, const std::string& want,
                     int own = -1, const std::string& ownWant = "", const Configure& configure = nullptr) {
  auto t0 = std::chrono::steady_clock::now();
  auto f = initEach(perRank, [&](int rank, ncclResult_t r, const std::string& msg, ncclComm_t) {
    const ncclResult_t code = rank == own ? ncclInvalidArgument : ncclInvalidUsage;
    const std::string& text = rank == own ? ownWant : want;
    RANK_CHECK(r == code, "init returned %d (%s), expected %d: %s", r, ncclGetErrorString(r),
               code, msg.c_str());
    RANK_CHECK(msg.find(text) != std::string::npos, "message '%s' lacks '%s'", msg.c_str(),
               text.c_str());
    return std::string();
  }, configure);
  EXPECT_TRUE(f.empty()) << joinFailures(f);
  // At init, not after a time-out of any kind.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

TEST(CoreKnobAgreement, AnAlgorithmSetOnOneRankFailsTheInitOnEveryRank) {
  EnvGuard a("NCCL_ALGO", nullptr), b("LOOM_ALGO", nullptr), t("LOOM_TIMEOUT", "60");
  // Before, rank 2 planned trees while the others planned rings: each waited on the others
  // until LOOM_TIMEOUT.
  expectInitFails({{}, {}, {{"NCCL_ALGO", "tree"}}},
                  "NCCL_ALGO differs between ranks: rank 0 has \"\" (default), rank 2 has "
                  "\"tree\" (env NCCL_ALGO); 1 of 3 ranks differ from rank 0");
}

TEST(CoreKnobAgreement, AChannelBoundSetOnOneRankFailsTheInitOnEveryRank) {
  EnvGuard a("NCCL_MAX_NCHANNELS", nullptr), b("LOOM_MAX_NCHANNELS", nullptr), t("LOOM_TIMEOUT", "60");
  // A rank that ran its plans on fewer channels than its peers would wait on channels
  // they never fill.
  expectInitFails({{}, {{"NCCL_MAX_NCHANNELS", "1"}}, {}},
                  "NCCL_MAX_NCHANNELS differs between ranks: rank 0 has \"-2\" (default), rank 1 has "
                  "\"1\" (env NCCL_MAX_NCHANNELS); 1 of 3 ranks differ from rank 0");
}

TEST(CoreKnobAgreement, AFifoShapeSetOnSomeRanksFailsTheInitOnEveryRank) {
  EnvGuard d("LOOM_FIFO_DEPTH", nullptr), s("LOOM_SLOT_BYTES", nullptr);
  // Before, the ranks failed on a shared-memory segment "holding N bytes but M expected".
  expectInitFails({{{"LOOM_FIFO_DEPTH", "4"}}, {}, {}},
                  "LOOM_FIFO_DEPTH differs between ranks: rank 0 has \"4\" (env LOOM_FIFO_DEPTH), "
                  "rank 1 has \"8\" (default); 2 of 3 ranks differ from rank 0");
}

TEST(CoreKnobAgreement, AnInterpreterProtocolSetOnOneRankFailsTheInitOnEveryRank) {
  EnvGuard e("LOOM_EXECUTOR", "interp"), p("LOOM_INTERP_PROTO", nullptr);
  // Before, the first collective failed with "sent 131072 bytes where 131008 were expected;
  // do all ranks call the same collective with the same count and datatype?"
  expectInitFails({{}, {{"LOOM_INTERP_PROTO", "LL"}}},
                  "LOOM_INTERP_PROTO differs between ranks: rank 0 has \"simple\" (default), "
                  "rank 1 has \"LL\" (env LOOM_INTERP_PROTO)");
}

// A malformed value: its rank fails with its own words (ncclInvalidArgument), the others
// learn which knob and value (before, they waited for it until the bootstrap time-out when
// the FIFO shape was malformed, or heard "unknown algorithm" from nobody).
TEST(CoreKnobAgreement, AMalformedValueIsNamedToEveryRank) {
  EnvGuard d("LOOM_FIFO_DEPTH", nullptr), a("NCCL_ALGO", nullptr), b("LOOM_BOOTSTRAP_TIMEOUT", "60");
  expectInitFails({{}, {{"LOOM_FIFO_DEPTH", "abc"}}},
                  "LOOM_FIFO_DEPTH differs between ranks: rank 0 has \"8\" (default), rank 1 has "
                  "\"abc\" (env LOOM_FIFO_DEPTH)",
                  1, "LOOM_FIFO_DEPTH=abc is not an integer");
  expectInitFails({{{"NCCL_ALGO", "bogus"}}, {}, {}},
                  "NCCL_ALGO differs between ranks: rank 0 has \"bogus\" (env NCCL_ALGO), rank 1 "
                  "has \"\" (default); 2 of 3 ranks differ from rank 0",
                  0, "NCCL_ALGO");
}

// The same values written differently, knobs that do not apply on any rank
// (LOOM_INTERP_PROTO without LOOM_EXECUTOR=interp, LOOM_DEVICE_LL_BYTES without the device
// executor) and knobs of each rank's own (LOOM_TIMEOUT) agree: the init succeeds and an
// all-reduce is exact.
TEST(CoreKnobAgreement, TheSameValuesWrittenDifferentlyAgree) {
  EnvGuard g1("NCCL_PROTO", nullptr), g2("LOOM_SLOT_BYTES", nullptr), g3("NCCL_ALGO", nullptr),
      g4("LOOM_INTERP_PROTO", nullptr), g5("LOOM_TIMEOUT", nullptr), g6("LOOM_EXECUTOR", nullptr),
      g7("LOOM_DEVICE_LL_BYTES", nullptr);
  const std::vector<Settings> env = {
      {{"NCCL_PROTO", "Simple"}, {"LOOM_SLOT_BYTES", "1M"}, {"NCCL_ALGO", "ring,tree"},
       {"LOOM_INTERP_PROTO", "ll"}, {"LOOM_TIMEOUT", "100"}, {"LOOM_DEVICE_LL_BYTES", "0"}},
      {{"NCCL_PROTO", " simple "}, {"LOOM_SLOT_BYTES", "1048576"}, {"NCCL_ALGO", "Tree, RING"},
       {"LOOM_EXECUTOR", "CPU"}, {"LOOM_TIMEOUT", "200"}}};
  auto f = initEach(env, [](int rank, ncclResult_t r, const std::string& msg, ncclComm_t comm) {
    RANK_CHECK(r == ncclSuccess, "init: %s", msg.c_str());
    std::vector<float> in(3 << 20, static_cast<float>(rank + 1)), out(in.size(), 0);
    RANK_NCCL(ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat, ncclSum, comm, nullptr));
    for (size_t i = 0; i < out.size(); ++i)
      RANK_CHECK(out[i] == 3.0f, "element %zu is %g, expected 3", i, out[i]);
    RANK_NCCL(ncclCommDestroy(comm));
    return std::string();
  });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

// ncclConfig_t's minCTAs / maxCTAs bound the channels as NCCL_MIN_CTAS / NCCL_MAX_CTAS do,
// which override them (as in NCCL), and are job-wide like them: set on one rank only, every
// rank's init fails naming the field.
TEST(CoreKnobAgreement, ConfigCtaBoundsAsTheKnobs) {
  EnvGuard a("NCCL_MIN_CTAS", nullptr), b("NCCL_MAX_CTAS", nullptr), c("NCCL_ALGO", nullptr),
      t("LOOM_TIMEOUT", "60");
  struct Case {
    int minCtas, maxCtas;
    const char* envMax;
    int wantMin, wantMax;
    bool wantMaxFromConfig;
    int wantTreeChannels;
  };
  // A host tree runs 2 channels at 8 MiB on 4 ranks unbounded (Select.ChannelBoundsAsNccl).
  for (const Case& k : {Case{NCCL_CONFIG_UNDEF_INT, 1, nullptr, 1, 1, true, 1},
                        Case{3, 5, nullptr, 3, 5, true, 2},
                        Case{NCCL_CONFIG_UNDEF_INT, 1, "2", 1, 2, false, 2},
                        Case{NCCL_CONFIG_UNDEF_INT, 100, nullptr, 1, 64, true, 2}}) {
    SCOPED_TRACE(std::to_string(k.minCtas) + "/" + std::to_string(k.maxCtas) + " env " +
                 (k.envMax ? k.envMax : "-"));
    // (Ranks as threads share the environment: set here, for the case only.)
    EnvGuard algo("NCCL_ALGO", "tree"), envMax("NCCL_MAX_CTAS", k.envMax);
    auto f = initEach(
        std::vector<Settings>(4),
        [&](int rank, ncclResult_t r, const std::string& msg, ncclComm_t comm) {
          RANK_CHECK(r == ncclSuccess, "init: %s", msg.c_str());
          const loom::PlanContext& ctx = comm->core->planContext();
          RANK_CHECK(ctx.minChannels == k.wantMin && ctx.maxChannels == k.wantMax && ctx.maxCtas == k.wantMax &&
                         ctx.maxCtasFromConfig == k.wantMaxFromConfig,
                     "channels %d..%d, CTA maximum %d (from the config: %d)", ctx.minChannels, ctx.maxChannels,
                     ctx.maxCtas, ctx.maxCtasFromConfig);
          const loom::Selection s = loom::select({loom::Collective::kAllReduce, (size_t{8} << 20) / 4, 4, 0}, ctx);
          RANK_CHECK(s.channels == k.wantTreeChannels, "the tree runs %d channels", s.channels);
          std::vector<float> in(2 << 20, static_cast<float>(rank + 1)), out(in.size(), 0);
          RANK_NCCL(ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat, ncclSum, comm, nullptr));
          for (size_t i = 0; i < out.size(); ++i) RANK_CHECK(out[i] == 10.0f, "element %zu is %g", i, out[i]);
          RANK_NCCL(ncclCommDestroy(comm));
          return std::string();
        },
        [&](int, ncclConfig_t* config) {
          config->minCTAs = k.minCtas;
          config->maxCTAs = k.maxCtas;
        },
        Mode::kThreads);
    EXPECT_TRUE(f.empty()) << joinFailures(f);
  }
  expectInitFails({{}, {}, {}},
                  "ncclConfig_t maxCTAs differs between ranks: rank 0 has \"0\" (default), rank 1 has \"2\" "
                  "(ncclConfig_t maxCTAs); 1 of 3 ranks differ from rank 0",
                  -1, "", [](int rank, ncclConfig_t* config) {
                    if (rank == 1) config->maxCTAs = 2;
                  });
  // The environment's bound stands for the config's everywhere: nothing differs. Nor does a
  // bound one rank sets in the environment and another in its config.
  const auto agree = [](int, ncclResult_t r, const std::string& msg, ncclComm_t comm) {
    RANK_CHECK(r == ncclSuccess, "init: %s", msg.c_str());
    RANK_CHECK(comm->core->planContext().maxChannels == 4, "at most %d channels",
               comm->core->planContext().maxChannels);
    RANK_NCCL(ncclCommDestroy(comm));
    return std::string();
  };
  auto f = initEach(std::vector<Settings>(2, Settings{{"NCCL_MAX_CTAS", "4"}}), agree,
                    [](int rank, ncclConfig_t* config) { config->maxCTAs = rank + 1; });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
  f = initEach({Settings{{"NCCL_MAX_CTAS", "4"}}, Settings{}}, agree,
               [](int rank, ncclConfig_t* config) { config->maxCTAs = rank == 1 ? 4 : NCCL_CONFIG_UNDEF_INT; });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

// As NCCL checks them: a set bound below 1, or a minimum over the maximum, is an invalid
// argument; a config from headers older than NCCL 2.17 has no such fields to read.
TEST(CoreKnobAgreement, InvalidConfigCtaBoundsAreRefused) {
  struct Case {
    int version, minCtas, maxCtas;
    const char* want;  // null: accepted
  };
  for (const Case& k : {Case{NCCL_VERSION_CODE, 0, NCCL_CONFIG_UNDEF_INT, "config->minCTAs=0 must be positive"},
                        Case{NCCL_VERSION_CODE, NCCL_CONFIG_UNDEF_INT, -3, "config->maxCTAs=-3 must be positive"},
                        Case{NCCL_VERSION_CODE, 4, 2, "config->minCTAs=4 is larger than config->maxCTAs=2"},
                        Case{NCCL_VERSION(2, 16, 0), 0, -3, nullptr}}) {
    SCOPED_TRACE(std::to_string(k.minCtas) + "/" + std::to_string(k.maxCtas));
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.version = k.version;
    config.minCTAs = k.minCtas;
    config.maxCTAs = k.maxCtas;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
    if (!k.want) {
      ASSERT_EQ(r, ncclSuccess) << ncclGetLastError(nullptr);
      EXPECT_EQ(comm->core->planContext().maxChannels, 64);
      EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
      continue;
    }
    EXPECT_EQ(r, ncclInvalidArgument);
    EXPECT_EQ(comm, nullptr);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find(k.want), std::string::npos) << ncclGetLastError(nullptr);
  }
}

}  // namespace
}  // namespace loomtest
