// The step primitive's Ops on host memory as the engine's host executors use them: the
// CPU's reductions and copies (kernels/cpu_step_ops.h) plus the host's part of a receive,
// checking the size the sender posted and fetching a payload the sender posted by address
// (the single-copy path of transports that read peer memory).
#pragma once

#include <vector>

#include "base/error.h"
#include "kernels/cpu_step_ops.h"
#include "kernels/step_primitive.h"
#include "transports/connection.h"

namespace loom {

struct HostStepOps : CpuStepOps {
  Connection* rc = nullptr;         // the connection the piece receives on (for messages)
  std::vector<char>* tmp = nullptr;  // remote payloads that feed a reduction

  const void* received(FifoEnd& f, StepPiece& p) const {
    const FifoSlotInfo& info = f.recvInfo();
    if (info.bytes != p.bytes)
      LOOM_THROW(kInvalidUsage,
                 "%s sent %llu bytes where %zu were expected; do all ranks call the same "
                 "collective with the same count and datatype?",
                 rc->describe().c_str(), static_cast<unsigned long long>(info.bytes), p.bytes);
    if (!info.remote) return f.recvSlot();
    // Without a second source the payload goes straight to dst (one copy).
    void* to = p.dst && !p.b ? p.dst : nullptr;
    if (!to) {
      if (tmp->size() < p.bytes) tmp->resize(p.bytes);
      to = tmp->data();
    }
    rc->readRemote(to, info.remote, p.bytes);
    return to;
  }
};

}  // namespace loom
