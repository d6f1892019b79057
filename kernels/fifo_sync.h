// The connection FIFO: the one protocol every transport speaks and every executor runs,
// written once for host threads and CUDA kernels. Only the atomics differ, and they are a
// policy: HostAtomics (compiler builtins with acquire/release order) for CPU executors,
// proxies and transports; DeviceAtomics (volatile accesses + system-scope fences) for a
// kernel whose FIFO lives in memory that CPUs or peer GPUs also touch.
//
// A directed connection carries a stream of "steps". Step s lives in slot s % depth of the
// receiver-visible buffer. The sender fills the slot, records its size, then publishes
// tail = s + 1; the receiver consumes it and publishes head = s + 1.
// Invariant: the sender may write slot s only once head > s - depth (the receiver has
// released step s - depth), so it never overwrites unread data.
//
// The control block is plain data touched only through the policy, so the same layout
// works in shared memory between processes, in host-pinned memory seen by a GPU, and in
// local memory fed by a network proxy.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kernels/hd.h"

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

// Host threads (and processes sharing the memory).
struct HostAtomics {
  // Whether this thread writes what is shared (slot sizes, counters): on the host, the one
  // thread that drives the end.
  static bool publishes() { return true; }
  static uint64_t load(const uint64_t& v) { return __atomic_load_n(&v, __ATOMIC_ACQUIRE); }
  static void store(uint64_t& v, uint64_t x) { __atomic_store_n(&v, x, __ATOMIC_RELEASE); }
  // A FIFO end's own counter: written by the thread that drives the end, read also by one
  // that probes it (a liveness check while the executor runs); no ordering needed.
  static uint64_t loadOwn(const uint64_t& v) { return __atomic_load_n(&v, __ATOMIC_RELAXED); }
  static void storeOwn(uint64_t& v, uint64_t x) { __atomic_store_n(&v, x, __ATOMIC_RELAXED); }
  // LL lines (kernels/ll.h): data and flag in one word; every lane writes its own.
  static uint64_t loadLine(const uint64_t& v) { return __atomic_load_n(&v, __ATOMIC_ACQUIRE); }
  static void storeLine(uint64_t& v, uint64_t x) { __atomic_store_n(&v, x, __ATOMIC_RELEASE); }
};

#if defined(__CUDACC__)
// The threads of a CUDA block that run a piece together (each with its own copy of the
// FIFO end): the fences order the block's accesses to the slots against the counters for
// every observer (CPUs, peer GPUs, the NIC). Thread 0 alone publishes a counter, after the
// barrier that ends the piece's writes (Ops::fence); every thread advances its own copy.
struct DeviceAtomics {
  __device__ static bool publishes() { return threadIdx.x == 0; }
  __device__ static uint64_t load(const uint64_t& v) {
    uint64_t x = *reinterpret_cast<const volatile uint64_t*>(&v);
    __threadfence_system();
    return x;
  }
  __device__ static void store(uint64_t& v, uint64_t x) {
    if (!publishes()) return;
    __threadfence_system();
    *reinterpret_cast<volatile uint64_t*>(&v) = x;
  }
  // Per-thread copies of a FIFO end's own counter.
  __device__ static uint64_t loadOwn(const uint64_t& v) { return v; }
  __device__ static void storeOwn(uint64_t& v, uint64_t x) { v = x; }
  // LL lines (kernels/ll.h): data and flag in one 8-byte word, so no fence; every thread
  // writes and reads its own lines.
  __device__ static uint64_t loadLine(const uint64_t& v) {
    return *reinterpret_cast<const volatile uint64_t*>(&v);
  }
  __device__ static void storeLine(uint64_t& v, uint64_t x) {
    *reinterpret_cast<volatile uint64_t*>(&v) = x;
  }
};
#endif

// One side's view of a connection FIFO. `step` counts this side's own progress.
// `headAt`, when set, is where the head counter lives instead of ctrl->head: a device
// connection keeps tail, slot info and slots in the receiver's memory (the sender writes
// them across the link) and the head in the sender's (the receiver writes it), so that each
// side polls only its own memory.
template <class Atomics>
struct FifoEndT {
  FifoCtrl* ctrl = nullptr;
  char* slots = nullptr;  // depth * slotBytes
  size_t slotBytes = 0;
  int depth = 0;
  uint64_t step = 0;
  uint64_t* headAt = nullptr;

  LOOM_HD char* slot(uint64_t s) const { return slots + (s % depth) * slotBytes; }
  LOOM_HD uint64_t& head() const { return headAt ? *headAt : ctrl->head; }

  // Sender side.
  LOOM_HD bool canSend() const { return Atomics::load(head()) + depth > Atomics::loadOwn(step); }
  LOOM_HD char* sendSlot() const { return slot(step); }
  LOOM_HD void post(uint64_t bytes, uint64_t remote = 0) {
    if (Atomics::publishes()) {  // one writer (the one that publishes the tail after it)
      FifoSlotInfo& i = ctrl->info[step % depth];
      i.bytes = bytes;
      i.remote = remote;
    }
    Atomics::storeOwn(step, step + 1);
    Atomics::store(ctrl->tail, step);
  }
  // True once the receiver has released every step this side posted.
  LOOM_HD bool drained() const { return Atomics::load(head()) >= Atomics::loadOwn(step); }

  // Receiver side.
  LOOM_HD bool canRecv() const { return Atomics::load(ctrl->tail) > Atomics::loadOwn(step); }
  LOOM_HD const char* recvSlot() const { return slot(step); }
  LOOM_HD const FifoSlotInfo& recvInfo() const { return ctrl->info[step % depth]; }
  LOOM_HD void release() {
    Atomics::storeOwn(step, step + 1);
    Atomics::store(head(), step);
  }
};

}  // namespace loom
