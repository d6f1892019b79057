#include "api/buffers.h"

#include "api/comm.h"
#include "base/error.h"

namespace loom::api {
namespace {

struct Classified {
  const NamedBuffer* buf;
  MemInfo info;
};

}  // namespace

MemKind checkBuffersWithDriver(ncclComm_t comm, const char* fn,
                               std::initializer_list<NamedBuffer> bufs) {
  constexpr size_t kMaxBuffers = 4;  // NCCL calls take at most two
  LOOM_ASSERT(bufs.size() <= kMaxBuffers);
  Classified seen[kMaxBuffers];
  size_t n = 0;
  for (const NamedBuffer& b : bufs) {
    if (b.ptr == nullptr || b.count == 0) continue;
    MemInfo info;
    if (n > 0 && seen[n - 1].buf->ptr == b.ptr) {
      info = seen[n - 1].info;  // in place: one query answers both
    } else {
      try {
        info = classifyPointer(b.ptr);
      } catch (const Error& e) {
        throwError(e.code(), "%s: %s: %s", fn, b.name, e.what());
      }
    }
    seen[n++] = {&b, info};
  }
  for (size_t i = 1; i < n; ++i)
    LOOM_CHECK_ARG(seen[i].info.kind == seen[0].info.kind,
                   "%s: %s at %p is %s memory but %s at %p is %s memory; the buffers of one call "
                   "must all be host memory or all be device memory",
                   fn, seen[0].buf->name, seen[0].buf->ptr, memKindName(seen[0].info.kind),
                   seen[i].buf->name, seen[i].buf->ptr, memKindName(seen[i].info.kind));
  if (n == 0 || seen[0].info.kind == MemKind::kHost) return MemKind::kHost;
  // A host-only communicator, or memory whose device the driver does not say (managed
  // memory may report none), has nothing to mismatch.
  for (size_t i = 0; i < n; ++i)
    LOOM_CHECK_ARG(comm->cudaDev < 0 || seen[i].info.device < 0 ||
                       seen[i].info.device == comm->cudaDev,
                   "%s: %s at %p is memory of CUDA device %d, but the communicator (rank %d) "
                   "uses CUDA device %d",
                   fn, seen[i].buf->name, seen[i].buf->ptr, seen[i].info.device, comm->rank,
                   comm->cudaDev);
  // Served by stock NCCL through the communicator's shadow (LOOM_NCCL_FALLBACK), by Loom's
  // staged path (engine/staged.h), or by its device executor (engine/device_exec.h).
  if (comm->shadow || comm->staged || (comm->core && comm->core->deviceExec())) return MemKind::kDevice;
  LOOM_THROW(kInvalidUsage,
             "%s: %s at %p is CUDA device memory (device %d), which is not supported on this "
             "communicator: device buffers are served by %s. Host buffers (pageable or pinned) "
             "work",
             fn, seen[0].buf->name, seen[0].buf->ptr, seen[0].info.device,
             comm->deviceServer.c_str());
}

}  // namespace loom::api
