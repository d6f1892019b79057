// The step primitive's Ops on host memory: a Reducer's SIMD loops, memcpy, and streaming
// stores for final data of operations too large for the caches.
#pragma once

#include <cstring>

#include "kernels/copy.h"
#include "kernels/reduce.h"

namespace loom {

struct CpuStepOps {
  // 16 KiB: the second write of a block reads the first from L1 (48 KiB and more on
  // current x86 cores).
  static constexpr size_t kBlockBytes = 16 << 10;

  const Reducer* red = nullptr;
  bool stream = false;  // copyOut uses streaming stores

  size_t eltSize() const { return red->eltSize; }
  bool hasPre() const { return red->hasPre(); }
  void reduce(void* d, const void* in, const void* local, size_t n) const {
    red->reduce(d, in, local, n);
  }
  void reduce2(void* d, const void* a, const void* b, size_t n) const { red->reduce2(d, a, b, n); }
  void pre(void* d, const void* s, size_t n) const { red->pre(d, s, n); }
  void post(void* d, const void* s, size_t n) const { red->post(d, s, n); }
  // A zero-byte piece may have no buffers at all (a count-0 call's null pointers).
  void copy(void* d, const void* s, size_t bytes) const {
    if (bytes) memcpy(d, s, bytes);
  }
  void copyOut(void* d, const void* s, size_t bytes) const {
    if (!bytes) return;
    if (stream) copyStreaming(d, s, bytes);
    else memcpy(d, s, bytes);
  }
  // One host thread runs the whole piece.
  unsigned lane() const { return 0; }
  unsigned lanes() const { return 1; }
  bool anyLane(bool v) const { return v; }
  // One lane sees its own writes: nothing to wait for between a piece's passes.
  void sync() const {}
  // A host thread never waits inside a piece (one lane writes an LL header last).
  bool stopRequested() const { return false; }
  // Streaming stores are weakly ordered: they must land before a post.
  void fence() const {
    if (stream) streamFence();
  }
};

}  // namespace loom
