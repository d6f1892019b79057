// Classifies a call's buffers before anything touches them. Device memory is served by stock
// NCCL (the fallback's shadow communicator) or Loom's own device paths (engine/staged.h);
// where neither serves the communicator it is refused with a message naming the call and
// the buffer, instead of reaching a host memcpy (which would kill the process with SIGSEGV).
#pragma once

#include <nccl.h>

#include <cstddef>
#include <initializer_list>

#include "base/mem_kind.h"

namespace loom::api {

struct NamedBuffer {
  const char* name;  // as the NCCL prototype names it: "sendbuff", "recvbuff (root)", ...
  const void* ptr;
  size_t count;      // a null pointer or a zero count is not looked at
};

// The slow path of checkBuffers, taken only when a CUDA driver is loaded.
MemKind checkBuffersWithDriver(ncclComm_t comm, const char* fn,
                               std::initializer_list<NamedBuffer> bufs);

// Returns the kind of the call's buffers. Throws kInvalidArgument when the buffers mix
// kinds or sit on a device other than the communicator's, and kInvalidUsage for device
// buffers on a communicator whose device memory nobody serves.
inline MemKind checkBuffers(ncclComm_t comm, const char* fn,
                            std::initializer_list<NamedBuffer> bufs) {
  if (__builtin_expect(cuda::driver() == nullptr, 1)) return MemKind::kHost;
  return checkBuffersWithDriver(comm, fn, bufs);
}

}  // namespace loom::api
