// Direct collectives' data movement (engine/direct_moves.h).
#include "engine/direct_moves.h"

#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "engine/communicator.h"
#include "engine/cuda_kernels.h"

namespace loom::staged {

namespace {
BoolKnob kLocalDirect("LOOM_LOCAL_DIRECT", "", true,
                      "collectives of ranks on one GPU (threads sharing its context, or "
                      "processes through CUDA IPC) move data directly between the ranks' device "
                      "buffers; 0: through pinned host memory and the host engine (the staged "
                      "path). The ranks of a communicator need not agree: any rank's 0 sends "
                      "its collectives to the host engine on every rank");
}  // namespace

bool localDirect() {
  return kLocalDirect.get();
}

bool canGoDirect(const Op& o, const cuda::Kernels* kern) {
  if (o.isP2p() || o.deviceScalar) return false;
  if (o.coll == Collective::kAllGather || o.coll == Collective::kBroadcast) return true;
  if (o.coll != Collective::kAllReduce && o.coll != Collective::kReduce &&
      o.coll != Collective::kReduceScatter)
    return false;
  return kern != nullptr;
}

void queueDirect(const cuda::Driver& drv, const cuda::Kernels* kern, const Op& o,
                 std::span<const DirectRank> byRank, void* stream, bool* queued) {
  const cuda::StreamApi& st = drv.streams;
  const int n = static_cast<int>(byRank.size());
  const int rank = o.comm.core ? o.comm.core->rank() : -1;  // for messages
  size_t launched = 0;  // kernels launched: from the first success on, a failure is late
  const size_t b = o.bytes();
  auto copy = [&](void* dst, const void* src) {
    if (b == 0 || dst == src) return;
    *queued = true;
    if (cuda::CuResult r = st.memcpyAsync(reinterpret_cast<cuda::CuDevicePtr>(dst),
                                          reinterpret_cast<cuda::CuDevicePtr>(src), b, stream);
        r != cuda::kCudaSuccess)
      LOOM_THROW(kUnhandledCudaError, "rank %d: %s on device buffers: cuMemcpyAsync (device to "
                 "device) failed: %s", rank,
                 collectiveName(o.coll), drv.errorText(r).c_str());
  };
  auto at = [](const void* p, size_t off) { return static_cast<const char*>(p) + off; };
  auto failed = [&](int rc, const char* fn) {
    if (launched == 0 && !*queued) {
      // Nothing written yet: a module that loads but cannot run here (a GPU it was not
      // built for, an old driver) is given up for good, and this call goes to the host.
      cuda::disableKernels(strprintf("%s failed (CUDA runtime error %d)", fn, rc));
      throw KernelsUnusable();
    }
    LOOM_THROW(kUnhandledCudaError, "rank %d: %s on device buffers: %s failed (CUDA runtime "
               "error %d)", rank, collectiveName(o.coll), fn, rc);
  };
  // outs = the reduction over every rank of its send buffer at byte `off`, rank `first`'s
  // first, in one pass (the module's loomCudaReduceMulti, same bits as the chain below);
  // false where it cannot (too many ranks or outputs).
  auto multi = [&](const std::vector<void*>& outs, int first, size_t off) {
    if (o.count == 0) return true;
    if (!kern || static_cast<size_t>(n) > LOOM_CUDA_MULTI_MAX || outs.size() > LOOM_CUDA_MULTI_MAX)
      return false;
    loomCudaMulti m{};
    m.nin = n;
    m.nout = static_cast<int>(outs.size());
    int i = 0;
    auto add = [&](const DirectRank& q) {
      m.in[i] = at(q.send, off);
      m.inScalar[i++] = q.scalarBits;
    };
    add(byRank[static_cast<size_t>(first)]);
    for (int r = 0; r < n; ++r)
      if (r != first) add(byRank[static_cast<size_t>(r)]);
    for (size_t j = 0; j < outs.size(); ++j) m.out[j] = outs[j];
    const int rc = kern->reduceMulti(o.dtype, static_cast<int>(o.red.kind),
                                     byRank[static_cast<size_t>(first)].scalarBits, &m, o.count,
                                     static_cast<loomCudaStream_t>(stream));
    if (rc != 0) failed(rc, "loomCudaReduceMulti");
    ++launched;
    *queued = true;
    return true;
  };
  // dst = the reduction over every rank of its send buffer at byte `off`, rank `first`'s
  // contribution read first (dst may be that buffer), each rank's own pre, then the post.
  auto reduceInto = [&](void* dst, int first, size_t off) {
    if (o.count == 0) return;
    LOOM_CHECK_USAGE(kern != nullptr, "rank %d: %s on device buffers: no CUDA kernels module",
                     rank, collectiveName(o.coll));
    auto launch = [&](int fn, const DirectRank& by, const void* a, const void* bb) {
      int rc = kern->reduce(fn, o.dtype, static_cast<int>(o.red.kind), by.scalarBits, dst, a, bb,
                            o.count, static_cast<loomCudaStream_t>(stream));
      if (rc != 0) failed(rc, "loomCudaReduce");
      ++launched;
      *queued = true;
    };
    const DirectRank& f = byRank[static_cast<size_t>(first)];
    std::vector<const DirectRank*> rest;
    for (const DirectRank& q : byRank)
      if (&q != &f) rest.push_back(&q);
    size_t i = 0;
    if (o.red.hasPre() || rest.empty()) {
      if (o.red.hasPre() || dst != at(f.send, off))
        launch(LOOM_CUDA_FN_PRE, f, at(f.send, off), nullptr);
    } else {
      launch(LOOM_CUDA_FN_REDUCE2, f, at(f.send, off), at(rest[0]->send, off));
      i = 1;
    }
    for (; i < rest.size(); ++i)
      launch(o.red.hasPre() ? LOOM_CUDA_FN_REDUCE : LOOM_CUDA_FN_REDUCE2, *rest[i], dst,
             at(rest[i]->send, off));
    if (o.red.hasPost()) launch(LOOM_CUDA_FN_POST, f, dst, nullptr);
  };
  switch (o.coll) {
    case Collective::kBroadcast: {
      const void* src = byRank[static_cast<size_t>(o.root)].send;
      for (const DirectRank& q : byRank) copy(q.recv, src);
      break;
    }
    case Collective::kAllGather:
      for (const DirectRank& q : byRank)
        for (int from = 0; from < n; ++from)
          copy(static_cast<char*>(q.recv) + b * static_cast<size_t>(from),
               byRank[static_cast<size_t>(from)].send);
      break;
    case Collective::kAllReduce: {
      std::vector<void*> outs;
      for (const DirectRank& q : byRank) outs.push_back(q.recv);
      if (multi(outs, 0, 0)) break;
      reduceInto(byRank[0].recv, 0, 0);
      for (const DirectRank& q : byRank) copy(q.recv, byRank[0].recv);
      break;
    }
    case Collective::kReduce: {
      void* out = byRank[static_cast<size_t>(o.root)].recv;
      if (!multi({out}, o.root, 0)) reduceInto(out, o.root, 0);
      break;
    }
    case Collective::kReduceScatter:
      for (int r = 0; r < n; ++r) {
        void* out = byRank[static_cast<size_t>(r)].recv;
        if (!multi({out}, r, b * static_cast<size_t>(r))) reduceInto(out, r, b * static_cast<size_t>(r));
      }
      break;
    default:
      LOOM_THROW(kInternalError, "%s has no direct form", collectiveName(o.coll));
  }
}

}  // namespace loom::staged
