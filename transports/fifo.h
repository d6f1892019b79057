// The connection FIFO as host code sees it: the layout and wait/post of kernels/fifo_sync.h
// over host atomics. Transports fill in where the control block and the slots live; the
// CPU executor and the network proxy drive it.
#pragma once

#include "kernels/fifo_sync.h"

namespace loom {

using FifoEnd = FifoEndT<HostAtomics>;

}  // namespace loom
