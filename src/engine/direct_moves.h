// The data movement of a direct collective: ranks on one GPU whose device buffers one CUDA
// context reaches (rank threads sharing the context, or rank processes whose buffers the
// leader mapped through CUDA IPC), moved by one leader on one stream: copies for an
// all-gather or a broadcast, the CUDA kernels module's reductions (engine/cuda_kernels.h)
// for an all-reduce, a reduce or a reduce-scatter. Nothing here waits for anything: the
// caller orders the stream after every rank's inputs and every rank's stream after it.
#pragma once

#include <cstdint>
#include <span>

#include "base/cuda_driver.h"
#include "engine/cuda_kernels.h"
#include "engine/op.h"

namespace loom::staged {

// One rank's part, as the leader reaches it.
struct DirectRank {
  const void* send;
  void* recv;
  uint64_t scalarBits;  // the rank's own Reducer::scalarBits (a pre-multiplied sum's scalar)
};

// What the ranks of a direct collective must agree on (plain data: rank processes post it
// on their board).
struct DirectShape {
  int32_t coll, dtype, redKind, root;
  uint64_t count, eltSize;
  static DirectShape of(const Op& o) {
    return {static_cast<int32_t>(o.coll), o.dtype, static_cast<int32_t>(o.red.kind), o.root,
            o.count, o.eltSize};
  }
  bool operator==(const DirectShape&) const = default;
};

// The CUDA kernels module failed its first launch, before anything was queued: it is given
// up for the process (cuda::disableKernels), and the call goes to the host engine.
struct KernelsUnusable {};

// LOOM_LOCAL_DIRECT (default 1): whether collectives of ranks on one GPU may go direct;
// 0 sends them through the host engine (the staged path), as where they cannot. Read from
// the environment: each communicator reads it once, at init (Communicator::localDirect).
bool localDirect();

// Whether collective `o` can go direct with kernels module `kern` (cuda::kernels(), fetched
// once by the caller: another thread may give it up meanwhile): a copy, or a reduction with
// a module and no device scalar.
bool canGoDirect(const Op& o, const cuda::Kernels* kern);

// Queues `o` (its collective, count, type, root and reduction; rank r's buffers in
// byRank[r]) on `stream`, whose device must be current, with module `kern` (may be null
// for copies). *queued turns true with the first
// work queued (a later failure leaves that work on the stream). Throws loom::Error, or
// KernelsUnusable.
void queueDirect(const cuda::Driver& drv, const cuda::Kernels* kern, const Op& o,
                 std::span<const DirectRank> byRank, void* stream, bool* queued);

}  // namespace loom::staged
