// The connection FIFO: the one protocol every transport speaks and every executor runs.
//
// A directed connection carries a stream of "steps". Step s lives in slot s % depth of the
// receiver-visible buffer. The sender fills the slot, records its size, then publishes
// tail = s + 1; the receiver consumes it and publishes head = s + 1.
// Invariant: the sender may write slot s only once head > s - depth (the receiver has
// released step s - depth), so it never overwrites unread data.
//
// The control block is plain data touched only through atomic_ref (host) or volatile +
// fences (device), so the same layout works in shared memory between processes, in
// host-pinned memory seen by a GPU, and in local memory fed by a network proxy.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace loom {

constexpr int kMaxFifoDepth = 16;

struct FifoSlotInfo {
  uint64_t bytes;   // payload size of the step in this slot
  uint64_t remote;  // 0: payload is in the slot; else the sender's address (single-copy path)
};

struct alignas(128) FifoCtrl {
  alignas(128) uint64_t tail;  // steps published by the sender
  alignas(128) uint64_t head;  // steps released by the receiver
  alignas(128) FifoSlotInfo info[kMaxFifoDepth];
  alignas(128) uint32_t senderPid;
  uint32_t receiverPid;
  uint32_t closed;  // set by either side on teardown/abort
};

inline uint64_t loadAcquire(const uint64_t& v) {
  return std::atomic_ref<const uint64_t>(v).load(std::memory_order_acquire);
}
inline void storeRelease(uint64_t& v, uint64_t x) {
  std::atomic_ref<uint64_t>(v).store(x, std::memory_order_release);
}

// One side's view of a connection FIFO. `step` counts this side's own progress.
struct FifoEnd {
  FifoCtrl* ctrl = nullptr;
  char* slots = nullptr;  // depth * slotBytes
  size_t slotBytes = 0;
  int depth = 0;
  uint64_t step = 0;

  char* slot(uint64_t s) const { return slots + (s % depth) * slotBytes; }

  // Sender side.
  bool canSend() const { return loadAcquire(ctrl->head) + depth > step; }
  char* sendSlot() const { return slot(step); }
  void post(uint64_t bytes, uint64_t remote = 0) {
    FifoSlotInfo& i = ctrl->info[step % depth];
    i.bytes = bytes;
    i.remote = remote;
    storeRelease(ctrl->tail, ++step);
  }
  // True once the receiver has released every step this side posted.
  bool drained() const { return loadAcquire(ctrl->head) >= step; }

  // Receiver side.
  bool canRecv() const { return loadAcquire(ctrl->tail) > step; }
  const char* recvSlot() const { return slot(step); }
  const FifoSlotInfo& recvInfo() const { return ctrl->info[step % depth]; }
  void release() { storeRelease(ctrl->head, ++step); }
};

}  // namespace loom
