// Knobs every rank must set alike (NCCL_ALGO, NCCL_PROTO, the FIFO shape, the executor, ...):
// a rank launched with another value fails the init on every rank, naming the knob, two
// ranks and their values, instead of running other plans than its peers (a wait until
// LOOM_TIMEOUT, or FIFOs of different sizes). Values that differ only in how they are
// written agree. Ranks are processes: threads of one process share one environment.
#include <nccl.h>

#include <chrono>
#include <string>
#include <vector>

#include "core/core_util.h"

namespace loomtest {
namespace {

using Settings = std::vector<std::pair<const char*, const char*>>;

// Each rank sets its own variables, then inits; returns the init's result and message.
std::string initWith(const ncclUniqueId& id, int rank, int nranks, const Settings& env,
                     ncclComm_t* comm, ncclResult_t* r) {
  for (const auto& [name, value] : env) setenv(name, value, 1);
  *r = ncclCommInitRank(comm, nranks, id, rank);
  return ncclGetLastError(nullptr);
}

// Every rank's init must fail with ncclInvalidUsage and a message containing `want`.
void expectInitFails(int nranks, const std::vector<Settings>& perRank, const std::string& want) {
  LateId late;
  auto t0 = std::chrono::steady_clock::now();
  auto f = runEach(
      Mode::kProcesses, nranks,
      [&](int rank, int n) {
        ncclUniqueId id;
        RANK_TRY(late.wait(&id));
        ncclComm_t comm = nullptr;
        ncclResult_t r;
        std::string msg = initWith(id, rank, n, perRank[rank], &comm, &r);
        RANK_CHECK(r == ncclInvalidUsage, "init returned %d (%s), expected ncclInvalidUsage: %s", r,
                   ncclGetErrorString(r), msg.c_str());
        RANK_CHECK(msg.find(want) != std::string::npos, "message '%s' lacks '%s'", msg.c_str(),
                   want.c_str());
        return std::string();
      },
      120, [&] { return makeId(late); });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
  // At init, not after a time-out of any kind.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

TEST(CoreKnobAgreement, AnAlgorithmSetOnOneRankFailsTheInitOnEveryRank) {
  EnvGuard a("NCCL_ALGO", nullptr), b("LOOM_ALGO", nullptr), t("LOOM_TIMEOUT", "60");
  // Before, rank 2 planned trees while the others planned rings: each waited on the others
  // until LOOM_TIMEOUT.
  expectInitFails(3, {{}, {}, {{"NCCL_ALGO", "tree"}}},
                  "NCCL_ALGO differs between ranks: rank 0 has \"\" (default), rank 2 has "
                  "\"tree\" (env NCCL_ALGO); 1 of 3 ranks differ from rank 0");
}

TEST(CoreKnobAgreement, AFifoShapeSetOnSomeRanksFailsTheInitOnEveryRank) {
  EnvGuard d("LOOM_FIFO_DEPTH", nullptr), s("LOOM_SLOT_BYTES", nullptr);
  // Before, the ranks failed on a shared-memory segment "holding N bytes but M expected".
  expectInitFails(3, {{{"LOOM_FIFO_DEPTH", "4"}}, {}, {}},
                  "LOOM_FIFO_DEPTH differs between ranks: rank 0 has \"4\" (env LOOM_FIFO_DEPTH), "
                  "rank 1 has \"8\" (default); 2 of 3 ranks differ from rank 0");
}

TEST(CoreKnobAgreement, AnInterpreterProtocolSetOnOneRankFailsTheInitOnEveryRank) {
  EnvGuard e("LOOM_EXECUTOR", "interp"), p("LOOM_INTERP_PROTO", nullptr);
  // Before, the first collective failed with "sent 131072 bytes where 131008 were expected;
  // do all ranks call the same collective with the same count and datatype?"
  expectInitFails(2, {{}, {{"LOOM_INTERP_PROTO", "LL"}}},
                  "LOOM_INTERP_PROTO differs between ranks: rank 0 has \"simple\" (default), "
                  "rank 1 has \"LL\" (env LOOM_INTERP_PROTO)");
}

// The same values written differently, and knobs of each rank's own (LOOM_TIMEOUT), agree:
// the init succeeds and an all-reduce is exact.
TEST(CoreKnobAgreement, TheSameValuesWrittenDifferentlyAgree) {
  EnvGuard g1("NCCL_PROTO", nullptr), g2("LOOM_SLOT_BYTES", nullptr), g3("NCCL_ALGO", nullptr),
      g4("LOOM_STAGED_PATH", nullptr), g5("LOOM_TIMEOUT", nullptr);
  const std::vector<Settings> env = {
      {{"NCCL_PROTO", "Simple"}, {"LOOM_SLOT_BYTES", "1M"}, {"NCCL_ALGO", "ring"},
       {"LOOM_STAGED_PATH", "yes"}, {"LOOM_TIMEOUT", "100"}},
      {{"NCCL_PROTO", " simple "}, {"LOOM_SLOT_BYTES", "1048576"}, {"NCCL_ALGO", "RING"},
       {"LOOM_STAGED_PATH", "1"}, {"LOOM_TIMEOUT", "200"}}};
  LateId late;
  auto f = runEach(
      Mode::kProcesses, 2,
      [&](int rank, int n) {
        ncclUniqueId id;
        RANK_TRY(late.wait(&id));
        ncclComm_t comm = nullptr;
        ncclResult_t r;
        std::string msg = initWith(id, rank, n, env[rank], &comm, &r);
        RANK_CHECK(r == ncclSuccess, "init: %s", msg.c_str());
        std::vector<float> in(3 << 20, static_cast<float>(rank + 1)), out(in.size(), 0);
        RANK_NCCL(ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat, ncclSum, comm, nullptr));
        for (size_t i = 0; i < out.size(); ++i)
          RANK_CHECK(out[i] == 3.0f, "element %zu is %g, expected 3", i, out[i]);
        RANK_NCCL(ncclCommDestroy(comm));
        return std::string();
      },
      120, [&] { return makeId(late); });
  EXPECT_TRUE(f.empty()) << joinFailures(f);
}

}  // namespace
}  // namespace loomtest
