// The step primitive: what every plan step does with one FIFO slot's worth of data, written
// once for the CPU executor and for a CUDA kernel (nvcc compiles this header: the plan
// interpreter's kernel, kernels/cuda/interp_kernel.cuh, runs it in a block of threads).
//
//   wait   the receive FIFO has a step (canRecv) and the send FIFO a free slot (canSend)
//   value  v = a R pre(b), or the single source (pre()'d unless it is a partial result)
//   write  out <- v (the send slot), dst <- post(v) or v: up to two destinations
//   post   release the received slot, publish the sent one
//
// The arithmetic and the copies are an Ops policy, so the same control flow runs SIMD host
// loops (kernels/cpu_step_ops.h) or a block of CUDA threads:
//   Ops::kBlockBytes                   with two destinations, work in blocks this size so
//                                      the second write reads the first from cache
//   size_t eltSize() const
//   bool hasPre() const
//   void reduce(dst, in, local, n)     dst = in R pre(local)
//   void reduce2(dst, a, b, n)         dst = a R b (both already pre()'d)
//   void pre(dst, src, n), post(dst, src, n)
//   void copy(dst, src, bytes)         into a FIFO slot or a buffer read again later
//   void copyOut(dst, src, bytes)      into final data (may use streaming stores)
//   void sync()                        between passes of one piece: a pass may read what
//                                      another lane wrote in the pass before (a barrier of
//                                      a block of threads; nothing for one host thread)
//   void fence()                       before a post: the writes are visible to the peer
//   const void* received(FifoEnd&, StepPiece&)   the payload of the received step (the
//                                      slot, or where Ops fetched the sender's memory:
//                                      dst itself when the step has no second source)
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kernels/fifo_sync.h"
#include "kernels/hd.h"

namespace loom {

struct StepPiece {
  const void* a = nullptr;  // first source: the received payload (or dst, for a local reduce)
  const void* b = nullptr;  // second source: this rank's data
  void* out = nullptr;      // the send slot; null when nothing is sent or the peer reads
                            // `remote` instead
  void* dst = nullptr;      // this rank's destination, or null
  size_t bytes = 0;
  bool bPartial = false;    // b already went through pre()
  bool postDst = false;     // dst is final: write post(v)
  uint64_t remote = 0;      // posted instead of data: where the peer reads v in our memory
};

// The value and the writes of one piece, in blocks when it has two destinations.
template <class Ops>
LOOM_HD void computePiece(const StepPiece& p, Ops& ops) {
  const size_t n = p.bytes;
  const size_t block = p.out && p.dst && Ops::kBlockBytes < n ? Ops::kBlockBytes : n;
  const size_t elt = ops.eltSize();
  for (size_t off = 0; off < n || off == 0; off += block) {
    const size_t m = n - off < block ? n - off : block;
    const size_t e = m / elt;
    const char* a = p.a ? static_cast<const char*>(p.a) + off : nullptr;
    const char* b = p.b ? static_cast<const char*>(p.b) + off : nullptr;
    char* out = p.out ? static_cast<char*>(p.out) + off : nullptr;
    char* dst = p.dst ? static_cast<char*>(p.dst) + off : nullptr;
    char* first = out ? out : dst;
    const char* v;
    if (a && b) {
      if (p.bPartial) ops.reduce2(first, a, b, e);
      else ops.reduce(first, a, b, e);
      v = first;
    } else if (b && !p.bPartial && ops.hasPre()) {
      ops.pre(first, b, e);
      v = first;
    } else {
      v = a ? a : b;
    }
    const char* held = v;  // dst holds v already when v is dst (a payload fetched into it)
    bool written = v == first;  // v was written by this piece's first pass
    if (out && out != v) {
      ops.copy(out, v, m);
      v = out;  // the second destination reads it back from cache
      written = true;
    }
    if (dst && (p.postDst || dst != held)) {
      if (written) ops.sync();  // the second pass reads what every lane wrote in the first
      if (p.postDst) ops.post(dst, v, e);
      else ops.copyOut(dst, v, m);
    }
    if (n == 0) break;
  }
}

// One piece of a step: false (nothing done) until both FIFOs are ready. recv / send are
// null for a step without that side; `p` holds the buffers and flags, and gets the payload
// and the send slot here.
template <class Atomics>
LOOM_HD bool stepReady(const FifoEndT<Atomics>* recv, const FifoEndT<Atomics>* send) {
  return (!recv || recv->canRecv()) && (!send || send->canSend());
}

// The piece once stepReady(recv, send) held (a caller that polled readiness itself).
template <class Atomics, class Ops>
LOOM_HD void runReadyPiece(FifoEndT<Atomics>* recv, FifoEndT<Atomics>* send, StepPiece& p,
                           Ops& ops) {
  if (recv) p.a = ops.received(*recv, p);
  if (send && !p.remote) p.out = send->sendSlot();
  computePiece(p, ops);
  ops.fence();
  if (recv) recv->release();
  if (send) send->post(p.bytes, p.remote);
}

template <class Atomics, class Ops>
LOOM_HD bool runStepPiece(FifoEndT<Atomics>* recv, FifoEndT<Atomics>* send, StepPiece& p,
                          Ops& ops) {
  if (!stepReady(recv, send)) return false;
  runReadyPiece(recv, send, p, ops);
  return true;
}

}  // namespace loom
