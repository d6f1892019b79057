// Job-wide diagnosis while a job runs: each rank answers status queries (bootstrap.h) with
// its place in the communicator (flight recorder: last queued, started and completed
// operation, what the one in flight waits on), and a rank whose operation times out asks
// every other rank before failing, so its error names the rank holding the job up and the
// operation it is stuck in, not just the neighbour it was waiting on.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

class Communicator;

// A status reply's fixed part (little-endian, as the x86/ARM hosts Loom runs on), followed
// by the same as one line of JSON for tools (loom-status).
struct StatusWire {
  uint32_t magic;  // kStatusMagic
  int32_t rank;
  uint64_t lastQueued, lastStarted, lastCompleted;
  uint64_t currentSeq;   // the first operation not completed (0: none queued)
  int32_t currentColl;   // its Collective, -1 none
  int32_t waitingOn;     // the peer it waits on, -1 none or not known
  uint8_t waitingSend;   // 1: waits to send, 0: to receive
  uint8_t currentState;  // OpState
  uint8_t pad[6];
  double currentAgeSec;  // since it started (or was queued)
  double idleSec;        // since the last operation completed (or the communicator began)
  double recentWaitUs;   // mean time the last (up to 64) operations waited for their peers
};
static_assert(sizeof(StatusWire) == 80, "loom-status unpacks this layout");
constexpr uint32_t kStatusMagic = 0x4c535431;  // "LST1"

// Status detail asking for the whole process's RAS report (api/ras_server.h): the API layer,
// which knows every communicator of the process, installs the function that makes it.
constexpr uint64_t kProcessReportDetail = 3;
void setProcessReportSource(std::string (*source)());

// What this rank answers: StatusWire, then for detail 1 the JSON line with every rank's
// address (what loom-status asks rank 0), for detail 2 the JSON line alone (other ranks).
std::string statusPayload(Communicator& c, uint64_t detail);

// Rank 0 logs where loom-status can reach the job and, when LOOM_DUMP_DIR is set, writes
// <dir>/loom-<comm>.status (mode 0600: the address and the status key) for loom-status.
void publishStatusAddress(Communicator& c);
// Rank 0 removes that file when the communicator goes.
void unpublishStatusAddress(Communicator& c);

// Asks the other ranks where they are and says who holds the job up, e.g.
// "rank 1 does not answer (pid 4242 on this host is stopped): ranks 0, 2, 3 wait for it in
// AllReduce #7". Bounded by about one second; "" when nothing useful was learnt.
std::string describeStall(Communicator& c, int waitedPeer);

}  // namespace loom
