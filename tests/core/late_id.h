// Fork first, then make the unique id. ncclGetUniqueId starts the rendezvous root's thread
// in the calling process; a rank forked while that thread holds a lock (the allocator's,
// stdio's, the logger's) inherits the lock held by a thread that does not exist in the
// child, and blocks on it for good before it reaches the rendezvous. GCC 12's ASan
// allocator is not even fork-safe the way glibc's is. So a test starts (forks) its ranks
// first; then the test process makes the id and publishes it in memory the ranks share.
#pragma once

#include <nccl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>

namespace loomtest {

// A block of memory shared by the test process and every rank it forks afterwards.
template <class T>
class SharedBoard {
 public:
  SharedBoard() {
    void* p = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) abort();
    board_ = new (p) T();
  }
  ~SharedBoard() {
    board_->~T();
    munmap(board_, sizeof(T));
  }
  SharedBoard(const SharedBoard&) = delete;
  SharedBoard& operator=(const SharedBoard&) = delete;
  T* operator->() const { return board_; }
  T& operator*() const { return *board_; }

 private:
  T* board_;
};

// The job's unique id, made by the test process after its ranks have started and read by
// them from shared memory. Works the same for ranks that are threads.
class LateId {
 public:
  // In the test process, once every rank has been forked. On failure the ranks learn why.
  ncclResult_t make() {
    ncclResult_t rc = ncclGetUniqueId(&box_->id);
    if (rc != ncclSuccess) {
      box_->id = ncclUniqueId{};
      snprintf(box_->why, sizeof(box_->why), "ncclGetUniqueId in the test process failed: %s: %s",
               ncclGetErrorString(rc), ncclGetLastError(nullptr));
    }
    box_->state.store(rc == ncclSuccess ? kMade : kFailed);
    return rc;
  }
  // After a failed make(): what failed.
  std::string why() const { return box_->why; }

  // In a rank: "" with the id in *id once make() succeeded, else why there is none.
  std::string wait(ncclUniqueId* id, int timeoutMs = 60000) const {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
    while (box_->state.load() == kPending) {
      if (std::chrono::steady_clock::now() > end)
        return "no unique id from the test process after " + std::to_string(timeoutMs) + " ms";
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (box_->state.load() == kFailed) return box_->why;
    *id = box_->id;
    return "";
  }

  // For ranks whose init reports a missing id anyway: the id, or all zeroes (which
  // ncclCommInitRank rejects as not made by ncclGetUniqueId).
  const ncclUniqueId& get() const {
    ncclUniqueId ignored;
    wait(&ignored);
    return box_->id;
  }
  operator const ncclUniqueId&() const { return get(); }

 private:
  static constexpr int kPending = 0, kMade = 1, kFailed = 2;
  struct Box {
    std::atomic<int> state{kPending};
    ncclUniqueId id{};
    char why[512] = {};
  };
  SharedBoard<Box> box_;
};

// LateId::make() as runEach's afterStart: "" or why there is no id.
inline std::string makeId(LateId& id) { return id.make() == ncclSuccess ? "" : id.why(); }

}  // namespace loomtest
