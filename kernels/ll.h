// The LL ("low latency") protocol of the plan interpreter, written once for host threads
// and CUDA blocks. A slot holds 8-byte lines, each 4 bytes of data and a 4-byte flag
// stored together in one 8-byte write, so a line is complete as soon as its flag is: the
// receiver polls the lines themselves, with no fence between data and a counter on the
// sender's side and no counter to wait for on the receiver's. Line 0 carries the step's
// byte count. Half the slot is payload, so LL carries small messages, where the latency of
// a fence and a second round trip costs more than the bandwidth.
//
// The flag of step s is llFlagFor(s): a slot is reused every `depth` steps, whose flags all
// differ, so a line left from an earlier use never passes for a new one. Slots must start
// zeroed (flag 0, which no step has): memory left from another connection could hold
// lines that pass for this one's.
// `lane` / `lanes` split the lines between the threads of a block (0 / 1 on a host thread).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kernels/hd.h"

namespace loom {

constexpr size_t kLLLineBytes = 8;

LOOM_HD inline uint32_t llFlagFor(uint64_t step) {
  return static_cast<uint32_t>(step % 0xffffffffu) + 1u;  // 1 .. 2^32 - 1: never 0
}
// Payload bytes one slot carries: a multiple of 64, so that a piece never splits an
// element (pieces are cut at this size whatever the data type) and plans cut for it are
// those of a FIFO of that slot size (LOOM_SLOT_BYTES takes multiples of 64).
LOOM_HD inline size_t llCapacity(size_t slotBytes) {
  return slotBytes / kLLLineBytes > 1 ? ((slotBytes / kLLLineBytes - 1) * 4) & ~size_t(63) : 0;
}
LOOM_HD inline uint64_t llLine(uint32_t data, uint32_t flag) {
  return (static_cast<uint64_t>(flag) << 32) | data;
}

// Whether the header line of step `step` has arrived; *bytes is then its byte count.
template <class Atomics>
LOOM_HD bool llArrived(const char* slot, uint64_t step, size_t* bytes) {
  const uint64_t v = Atomics::loadLine(*reinterpret_cast<const uint64_t*>(slot));
  if (static_cast<uint32_t>(v >> 32) != llFlagFor(step)) return false;
  *bytes = static_cast<uint32_t>(v);
  return true;
}

// Writes `bytes` of src (the last line padded with zeros) and the header into the slot.
template <class Atomics>
LOOM_HD void llWrite(char* slot, const void* src, size_t bytes, uint64_t step, unsigned lane,
                     unsigned lanes) {
  const uint32_t flag = llFlagFor(step);
  uint64_t* lines = reinterpret_cast<uint64_t*>(slot);
  const unsigned char* s = static_cast<const unsigned char*>(src);
  const size_t n = (bytes + 3) / 4;
  for (size_t i = lane; i < n; i += lanes) {
    uint32_t d = 0;
    const size_t at = i * 4, take = bytes - at < 4 ? bytes - at : 4;
    for (size_t k = 0; k < take; ++k) d |= static_cast<uint32_t>(s[at + k]) << (8 * k);
    Atomics::storeLine(lines[1 + i], llLine(d, flag));
  }
  if (lane == 0) Atomics::storeLine(lines[0], llLine(static_cast<uint32_t>(bytes), flag));
}

// Reads `bytes` of payload of step `step` into dst, waiting for each line's flag (the
// lines of one step may land in any order: the header may come before them). False when
// stop() said to give up while a line was missing (a sender stopped halfway).
template <class Atomics, class Stop>
LOOM_HD bool llRead(const char* slot, void* dst, size_t bytes, uint64_t step, unsigned lane,
                    unsigned lanes, const Stop& stop) {
  const uint32_t flag = llFlagFor(step);
  const uint64_t* lines = reinterpret_cast<const uint64_t*>(slot);
  unsigned char* d = static_cast<unsigned char*>(dst);
  const size_t n = (bytes + 3) / 4;
  for (size_t i = lane; i < n; i += lanes) {
    uint64_t v;
    for (uint32_t polls = 1;; ++polls) {
      v = Atomics::loadLine(lines[1 + i]);
      if (static_cast<uint32_t>(v >> 32) == flag) break;
      if ((polls & 0xfffffu) == 0 && stop()) return false;
    }
    const size_t at = i * 4, take = bytes - at < 4 ? bytes - at : 4;
    for (size_t k = 0; k < take; ++k) d[at + k] = static_cast<unsigned char>(v >> (8 * k));
  }
  return true;
}

}  // namespace loom
