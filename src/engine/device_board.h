// Direct collectives of ranks that are processes on one GPU (issue 11 items 4 and 5): their
// launches meet on a board in shared memory, and one of them, the leader, moves the data
// between every rank's device buffers on its own stream, having mapped them with CUDA IPC.
//
// Each collective of such a communicator takes a meeting number (the same on every rank:
// device collectives are issued in one order). For meeting n every rank, on its calling
// thread:
//   1. records its interprocess "ready" event on its stream (its inputs are there) and
//      exports its buffers (cuIpcGetMemHandle of the allocation, and the offset);
//   2. posts that, or that it cannot take part (a group of several operations, a buffer
//      CUDA cannot export, LOOM_LOCAL_DIRECT=0, no kernels module for a reduction), and
//      joins; the rank completing the meeting leads it: where every rank can, it maps the
//      others' buffers and events (cached), makes its stream wait for every "ready" event,
//      queues the copies or reductions (engine/direct_moves.h), records its "done" event;
//      else it sends the meeting to the host engine;
//   3. waits, on the host, until the meeting is settled, then makes its stream wait for the
//      leader's "done" event. A rank that cannot take part posts so and goes on at once.
// Nothing on a GPU waits for the host; a call waits on the host only for the other ranks
// to issue the same collective (as a host call does). A meeting sent to the host engine
// goes, on every rank, through the staged path (engine/staged.h).
//
// Failure: an abort or revoke, LOOM_TIMEOUT, or a peer process that exits while a rank waits
// breaks the board: every waiting and later call on it fails with that error (an event
// already queued on a stream is not recalled: a leader that dies after queueing is not seen).
// Once every rank has joined a meeting only a dead peer ends a wait: the leader may be
// writing into the waiting rank's buffers.
//
// Peers' allocations stay mapped (cuIpcOpenMemHandle) while the communicator lives, up to
// 128; then, and at destroy, the device is synchronized and every mapping closed.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/cuda_driver.h"
#include "base/shm.h"
#include "engine/op.h"

namespace loom {

class Bootstrap;

class DeviceBoard {
 public:
  // Collective over the bootstrap (every rank of the communicator calls it): rank 0 creates
  // the shared segment and every rank maps it. `device`: this rank's CUDA device. nullptr on
  // every rank when some rank could not map it (another IPC namespace, another user).
  static std::unique_ptr<DeviceBoard> create(Bootstrap& bs, int device);
  ~DeviceBoard();
  DeviceBoard(const DeviceBoard&) = delete;
  DeviceBoard& operator=(const DeviceBoard&) = delete;

  // Meeting `seq` for collective `op` (device buffers, this rank's part): true when it went
  // direct (the work is queued and op.stream waits for it), false when every rank runs it
  // through the host engine. Throws loom::Error (the board broken, a driver failure, the
  // leader's error).
  bool meet(const cuda::Driver& drv, const Op& op, uint64_t seq);
  // This rank cannot take part in meeting `seq` (posted without waiting): it goes to the host
  // engine on every rank.
  void skip(const Op& op, uint64_t seq);

  struct Shared;  // the segment's layout (device_board.cc)

 private:
  DeviceBoard(ShmSegment seg, int rank, int nranks, int device);
  struct Post;
  // Writes this rank's buffers' IPC handles and offsets into `out`; false with `why` when
  // CUDA cannot share one.
  bool exportBuffers(const cuda::Driver& drv, const Op& op, Post* out, std::string* why);
  void ensureEvents(const cuda::Driver& drv);
  void waitFree(const Op& op, uint64_t seq);  // until meeting seq's record is free
  void postCannot(uint64_t seq);
  // Joins meeting `seq` with this rank's post (written by the caller); true when this rank
  // completed it (and leads).
  bool join(uint64_t seq);
  // The leader: direct where every rank can, else to the host; settles the meeting.
  void lead(const cuda::Driver& drv, const Op& op, uint64_t seq);
  void settle(uint64_t seq, uint32_t state, int code, const std::string& error,
              bool doneRecorded = false);
  // Until `ready()`; throws when the board breaks, the call is interrupted (abort, revoke),
  // LOOM_TIMEOUT passes or a peer process is gone (all of which break the board).
  // `mayGiveUp()` false: only a dead peer ends the wait.
  template <typename Ready, typename MayGiveUp>
  void waitUntil(const Op& op, const char* what, Ready ready, MayGiveUp mayGiveUp);
  [[noreturn]] void breakBoard(int code, const std::string& why);
  void checkBroken(const Op& op) const;
  cuda::CuDevicePtr mapped(const cuda::Driver& drv, const cuda::CuIpcHandle& h);
  void closeMaps(const cuda::Driver& drv);  // after the device's queued work; device current
  cuda::CuEvent openedEvent(const cuda::Driver& drv, int rank, bool done);

  ShmSegment seg_;
  Shared* sh_;
  int rank_, nranks_, device_;
  std::mutex mu_;  // one meeting of this rank at a time; guards the caches below
  cuda::CuEvent ready_ = nullptr, done_ = nullptr;  // this rank's, interprocess
  std::map<std::string, cuda::CuDevicePtr> maps_;  // opened memory, by handle bytes
  std::vector<cuda::CuEvent> peerReady_, peerDone_;  // opened events, by rank
  bool warnedNoExport_ = false;
};

}  // namespace loom
