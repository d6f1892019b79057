// The staged path's records (engine/staged.h), shared by its launcher and its proxies:
// what one launch holds, the process-wide pool that owns them, and the host functions the
// streams run.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "base/cuda_driver.h"
#include "base/error.h"
#include "engine/op.h"
#include "engine/staged.h"

namespace loom {

// One staged launch: the host operations it runs and the pinned memory they run on. Owned
// by a process-wide pool and never freed: a stream may still reach a record's host
// functions after its communicator is gone.
struct StagedRecord {
  std::vector<Op> hostOps;         // the launch's operations, rebound to the staging
  char* block = nullptr;           // pinned: the flag, then each operation's staging
  size_t capacity = 0;
  cuda::CuDevicePtr flagDev = 0;   // the flag's address for the stream's wait
  struct Event {
    cuda::CuEvent ev;
    int device;
  };
  std::vector<Event> events;       // joins the streams of a group
  std::atomic<int> gate{0};        // 1: the stream has copied the inputs (arrive ran)
  std::atomic<int> arrivals{0};    // proxies that have not reached the record yet
  std::atomic<int> holds{0};       // its proxies and its stream; 0: back to the pool
  std::atomic<bool> done{false};   // the flag is set
  std::atomic<bool> cancelled{false};  // its stream work could not all be queued
  // Captured into a CUDA graph: its work reaches the proxies at each replay (arrive pushes
  // it), and the graph holds it until the graph and its executables are destroyed.
  bool captured = false;
  std::vector<StagedProxy*> proxies;

  uint32_t* flag() { return reinterpret_cast<uint32_t*>(block); }
};

namespace staged {

constexpr size_t kFlagBytes = 64;  // the flag's line at the start of a record's block
constexpr size_t kAlign = 256;     // each staging buffer's alignment

// Proxies sleep on one process-wide condition; host functions, pushes and completions wake
// them. waitFor wakes at least every few milliseconds (abort flags do not notify).
std::mutex& wakeMutex();
std::condition_variable& wakeCondition();
void wakeAll();
template <typename Pred>
void waitFor(Pred ready) {
  std::unique_lock<std::mutex> lock(wakeMutex());
  while (!ready()) wakeCondition().wait_for(lock, std::chrono::milliseconds(5));
}

StagedRecord* takeRecord();
void dropHold(StagedRecord* r);  // the last hold returns the record to the pool

// Pinned blocks are never freed either. cuMemFreeHost waits for every stream of the
// context (seen on an H100, driver 580), and with ranks as threads sharing a device one
// rank's stream is held until another rank's next call arrives: a call that freed a block
// on its way would deadlock them. A record that outgrows its block leaves it here, and a
// record that needs one takes the smallest that fits. nullptr: none does.
struct PinnedBlock {
  char* host = nullptr;
  size_t bytes = 0;
  cuda::CuDevicePtr dev = 0;
};
PinnedBlock takeBlock(size_t atLeast);
void leaveBlock(const PinnedBlock& b);

// A collective of ranks that share a CUDA context (threads of one process on one GPU),
// met on the host: every launch adds its operations, and the launch that completes the
// meeting leads it, either moving the data itself on its stream (copies between the ranks'
// device buffers, which one context reaches alike) or sending every rank to the host engine.
struct LocalPart {
  const Op* op;          // alive while its launch waits in the meeting
  cuda::CuEvent ready;   // recorded on the op's stream: its inputs are there
};
struct LocalMeeting {
  enum State { kGathering, kDirect, kOnHost, kFailed };
  std::vector<LocalPart> parts;
  // Set last (release), after `done`, `leaderRec`, `code` and `error`; read without the lock.
  std::atomic<State> state{kGathering};
  cuda::CuEvent done = nullptr;    // kDirect, or kFailed after the leader queued work
  StagedRecord* leaderRec = nullptr;  // owns `done`; back to the pool when all have left
  size_t ranks = 0;                // ranks whose launches joined
  size_t expected = 0;             // ranks of the communicator
  int present = 0;                 // launches that joined and have not left
  Code code = Code::kSuccess;      // kFailed: the error
  std::string error;
};
// How a launch joins a meeting: to wait for its outcome (the one completing it leads), to
// send every rank to the host engine (a rank that cannot meet: its calls on the host), or
// to fail it (the launch failed before it could join).
enum class Join { kWait, kOnHost, kFail };
// Adds a launch's `parts`, of `ranks` ranks, to the meeting of (commHash, seq); true when
// that makes `expected` ranks with kWait and the meeting still gathering (the caller leads).
bool joinMeeting(uint64_t commHash, uint64_t seq, size_t expected, size_t ranks,
                 std::span<const LocalPart> parts, Join how, LocalMeeting** meeting,
                 const Error* failure = nullptr);
// Sets the meeting's state (the leader) and wakes its other launches.
void settleMeeting(LocalMeeting* m, LocalMeeting::State state, const Error* failure = nullptr);
// A launch gives up waiting (abort, revoke, timeout): the meeting fails, unless every rank
// has joined (its leader is at work and settles it soon: false, wait on).
bool abandonMeeting(LocalMeeting* m, const Error& why);
// The launch is done with the meeting; it is freed once every rank has joined and left
// (a late rank still finds how it ended).
void leaveMeeting(uint64_t commHash, uint64_t seq);

// Host functions, run by CUDA on its own thread: they flip words and return.
void arrive(void* rec);           // the inputs are staged: hand the record to its proxies
void release(void* rec);          // the outputs are copied back: the staging is free
void releaseCaptured(void* rec);  // a captured record's graph is gone

// Queues `ops` (device memory) on their streams (staged_launch.cc).
void launch(const cuda::Driver& drv, std::span<const Op> ops);

}  // namespace staged
}  // namespace loom
