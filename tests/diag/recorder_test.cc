// The flight recorder itself (ring, states, totals, dump lines), loomDumpState, SIGUSR1
// dumps, and status queries between live ranks.
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "api/comm.h"
#include "bootstrap/bootstrap.h"
#include "core/core_util.h"
#include "diag/diag_util.h"
#include "engine/flight_recorder.h"
#include "engine/job_status.h"
#include "fault/fault_util.h"
#include "loom/loom.h"

namespace loomtest {
namespace {

using loom::Algorithm;
using loom::Collective;
using loom::FlightRecord;
using loom::FlightRecorder;
using loom::OpState;

std::string readAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

size_t lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

std::string makeDir() {
  char tmpl[] = "/tmp/loom-rec-XXXXXX";
  return mkdtemp(tmpl) ? tmpl : "";
}

TEST(FlightRecorder, KeepsTheLastEntriesWithTheirStatesAndTotals) {
  FlightRecorder rec(0xabcdef, 1, 4, 3);  // rounded up to 4 entries
  EXPECT_EQ(rec.capacity(), 4u);
  int peers[2] = {0, 2};
  for (uint64_t s = 1; s <= 10; ++s) {
    loom::FlightEntry* e = rec.record(s, s % 2 ? Collective::kAllReduce : Collective::kBroadcast,
                                      Algorithm::kRing, 400 * s, 7, 0, 0, peers, 2);
    ASSERT_NE(e, nullptr);
    e->start();
    if (s < 10) rec.complete(e, s);
  }
  FlightRecord r;
  EXPECT_FALSE(rec.read(6, &r));  // overwritten
  ASSERT_TRUE(rec.read(7, &r));
  EXPECT_EQ(r.coll, Collective::kAllReduce);
  EXPECT_EQ(r.bytes, 2800u);
  EXPECT_EQ(r.state, OpState::kCompleted);
  EXPECT_EQ(r.npeers, 2);
  EXPECT_EQ(r.peers[1], 2);
  ASSERT_TRUE(rec.read(10, &r));
  EXPECT_EQ(r.state, OpState::kStarted);
  EXPECT_EQ(rec.lastQueued(), 10u);
  EXPECT_EQ(rec.lastCompleted(), 9u);
  EXPECT_EQ(rec.lastStarted(), 10u);
  // Odd seqs 1..9 are all-reduces: 5 of them, 400*(1+3+5+7+9) bytes, next to no time.
  loom::CollTotals t = rec.totals(Collective::kAllReduce);
  EXPECT_EQ(t.ops, 5u);
  EXPECT_EQ(t.bytes, 400u * 25);
  EXPECT_LT(t.ns, 100000000u);
  EXPECT_EQ(rec.totals(Collective::kBroadcast).ops, 4u);
  std::string d = rec.dump("test");
  EXPECT_EQ(lines(d), 5u) << d;  // header + the 4 entries held
  EXPECT_NE(d.find("\"type\":\"comm\",\"version\":1,\"comm\":\"0000000000abcdef\",\"rank\":1,\"nranks\":4"),
            std::string::npos) << d;
  EXPECT_NE(d.find("\"reason\":\"test\""), std::string::npos);
  EXPECT_NE(d.find("\"last_queued\":10,\"last_started\":10,\"last_completed\":9"), std::string::npos) << d;
  EXPECT_NE(d.find("\"seq\":10,\"coll\":\"Broadcast\",\"algo\":\"Ring\",\"count\":1000,\"bytes\":4000,"
                   "\"dtype\":\"float\",\"op\":\"sum\",\"root\":0,\"peers\":[0,2]"),
            std::string::npos) << d;
  EXPECT_NE(d.find("\"state\":\"started\""), std::string::npos);
  EXPECT_EQ(d.find("\"seq\":6,"), std::string::npos);
  rec.fail(rec.record(11, Collective::kAllGather, Algorithm::kRing, 4, 7, 0, 0, peers, 2), 11);
  EXPECT_EQ(rec.failures(), 1u);
  rec.noteError("first");
  rec.noteError("second");
  EXPECT_EQ(rec.error(), "first");
}

// A group of more operations than the ring holds: each operation's entry is taken over by
// a later one before it runs; completing the earlier ones must not touch the later entries,
// and the completed sequence number still advances one by one.
TEST(FlightRecorder, GroupLongerThanTheRing) {
  FlightRecorder rec(7, 0, 2, 4);
  int peer = 1;
  std::vector<loom::FlightEntry*> entries;
  for (uint64_t s = 1; s <= 8; ++s)
    entries.push_back(rec.record(s, Collective::kAllReduce, Algorithm::kRing, 8, 7, 0, 0, &peer, 1));
  for (uint64_t s = 1; s <= 4; ++s) {
    EXPECT_EQ(FlightRecorder::held(entries[s - 1], s), nullptr);
    rec.complete(entries[s - 1], s);
    EXPECT_EQ(rec.lastCompleted(), s);
  }
  FlightRecord r;
  ASSERT_TRUE(rec.read(5, &r));
  EXPECT_EQ(r.state, OpState::kQueued);  // untouched by #1's completion
  for (uint64_t s = 5; s <= 8; ++s) {
    ASSERT_NE(FlightRecorder::held(entries[s - 1], s), nullptr);
    entries[s - 1]->start();
    rec.complete(entries[s - 1], s);
  }
  ASSERT_TRUE(rec.read(5, &r));
  EXPECT_EQ(r.state, OpState::kCompleted);
  EXPECT_EQ(rec.totals(Collective::kAllReduce).ops, 4u);  // the four whose entries were held
  EXPECT_EQ(rec.lastCompleted(), 8u);
}

// Off: no entries, but the sequence numbers a status query reports still advance.
TEST(FlightRecorder, OffRecordsNothingButSequenceNumbers) {
  FlightRecorder rec(1, 0, 2, 0);
  EXPECT_FALSE(rec.enabled());
  EXPECT_EQ(rec.record(1, Collective::kAllReduce, Algorithm::kRing, 4, 7, 0, 0, nullptr, 0), nullptr);
  EXPECT_EQ(rec.lastQueued(), 1u);
  rec.complete(nullptr, 1);
  EXPECT_EQ(rec.lastCompleted(), 1u);
  EXPECT_EQ(lines(rec.dump("off")), 1u);
}

// Two ranks as threads: run, then dump on demand and ask one rank about the other.
TEST(FlightRecorder, DumpStateAndStatusQueriesOnLiveRanks) {
  loomtest::EnvGuard dirUnset("LOOM_DUMP_DIR", nullptr);
  std::vector<ncclComm_t> comms(2);
  ASSERT_EQ(ncclCommInitAll(comms.data(), 2, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
  for (int it = 0; it < 3; ++it) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat32, ncclSum, comms[0], nullptr);
    ncclAllReduce(b.data(), b.data(), b.size(), ncclFloat32, ncclSum, comms[1], nullptr);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  }
  EXPECT_EQ(a[5], 12.0f);  // 1 + 2, then doubled twice
  std::string dir = makeDir();
  ASSERT_EQ(loomDumpState(comms[1], dir.c_str()), ncclSuccess) << ncclGetLastError(comms[1]);
  char name[64];
  snprintf(name, sizeof(name), "/loom-%016llx-r1.jsonl",
           static_cast<unsigned long long>(comms[1]->core->commHash()));
  std::string d = readAll(dir + name);
  EXPECT_EQ(lines(d), 4u) << d;
  EXPECT_NE(d.find("\"reason\":\"loomDumpState\""), std::string::npos) << d;
  EXPECT_NE(d.find("\"seq\":3,\"coll\":\"AllReduce\""), std::string::npos) << d;
  EXPECT_NE(d.find("\"bytes\":4000"), std::string::npos) << d;
  EXPECT_NE(d.find("\"peers\":[0]"), std::string::npos) << d;
  unlink((dir + name).c_str());
  rmdir(dir.c_str());
  EXPECT_EQ(loomDumpState(comms[0], nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("LOOM_DUMP_DIR is unset"), std::string::npos)
      << ncclGetLastError(nullptr);
  EXPECT_EQ(loomDumpState(nullptr, "/tmp"), ncclInvalidArgument);
  EXPECT_EQ(loomDumpState(comms[0], "/nonexistent/dir"), ncclSystemError);

  // Rank 0 asks rank 1: brief (the fixed record) and full (with JSON and every address).
  std::string brief = comms[0]->core->bootstrap().queryStatus(1, 2.0);
  ASSERT_EQ(brief.size(), sizeof(loom::StatusWire));
  loom::StatusWire w;
  memcpy(&w, brief.data(), sizeof(w));
  EXPECT_EQ(w.magic, loom::kStatusMagic);
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.lastQueued, 3u);
  EXPECT_EQ(w.lastCompleted, 3u);
  EXPECT_EQ(w.currentSeq, 0u);
  std::string full = comms[0]->core->bootstrap().queryStatus(1, 2.0, 1);
  std::string json = full.substr(sizeof(loom::StatusWire));
  EXPECT_NE(json.find("\"rank\":1,\"nranks\":2"), std::string::npos) << json;
  EXPECT_NE(json.find("\"last_completed\":3"), std::string::npos) << json;
  EXPECT_NE(json.find("\"listen\":[\""), std::string::npos) << json;
  // The status key is derived from the job's secret, not the secret itself, and a query
  // signed with the secret instead gets no answer.
  auto key = loom::Bootstrap::statusKey(comms[0]->job);
  EXPECT_NE(memcmp(key.data(), comms[0]->job.secret, key.size()), 0);
  std::string secretHex;
  for (uint8_t b : comms[0]->job.secret) secretHex += loom::strprintf("%02x", b);
  std::string keyHex;
  for (uint8_t b : key) keyHex += loom::strprintf("%02x", b);
  const std::string tool = pythonTool("tools/loom-status/loom-status");
  std::string addr = comms[0]->core->bootstrap().peerAddr(0).str();
  EXPECT_EQ(system((tool + addr + " --timeout 1 --key " + secretHex + " >/dev/null 2>&1").c_str()) >> 8, 1);
  EXPECT_EQ(system((tool + addr + " --timeout 2 --key " + keyHex + " >/dev/null 2>&1").c_str()) >> 8, 0);
  for (ncclComm_t c : comms) ncclCommDestroy(c);
}

// SIGUSR1 dumps every communicator of the process (LOOM_DUMP_DIR set before the first one).
TEST(FlightRecorder, Sigusr1DumpsEveryCommunicator) {
  std::string dir = makeDir();
  loomtest::EnvGuard d("LOOM_DUMP_DIR", dir.c_str());
  fault::Child kid = fault::forkChild([&]() -> std::string {
    std::vector<ncclComm_t> comms(2);
    if (ncclCommInitAll(comms.data(), 2, nullptr) != ncclSuccess) return "init failed";
    std::vector<int> v(10, 1);
    ncclGroupStart();
    for (ncclComm_t c : comms) ncclAllReduce(v.data(), v.data(), 5, ncclInt32, ncclSum, c, nullptr);
    if (ncclGroupEnd() != ncclSuccess) return "all-reduce failed";
    raise(SIGUSR1);
    bool both = fault::waitFor([&] {
      int n = 0;
      for (const std::string& f : fault::dirEntries(dir)) n += f.ends_with(".jsonl");
      return n == 2;
    }, 10000);
    for (ncclComm_t c : comms) ncclCommDestroy(c);
    return both ? "" : "no dumps after SIGUSR1";
  });
  EXPECT_EQ(fault::waitChild(kid, 60), "");
  int dumps = 0;
  for (const std::string& f : fault::dirEntries(dir)) {
    if (f.ends_with(".jsonl")) {
      ++dumps;
      std::string text = readAll(dir + "/" + f);
      EXPECT_NE(text.find("\"reason\":\"SIGUSR1\""), std::string::npos) << text;
      EXPECT_NE(text.find("\"seq\":1,\"coll\":\"AllReduce\""), std::string::npos) << text;
    }
    unlink((dir + "/" + f).c_str());
  }
  rmdir(dir.c_str());
  EXPECT_EQ(dumps, 2);  // and the .status file of rank 0
}

}  // namespace
}  // namespace loomtest
