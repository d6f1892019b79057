// Where a communicator's System comes from: live discovery, merged with NCCL_TOPO_FILE /
// LOOM_TOPO_FILE when set (the file wins where both speak), written to
// NCCL_TOPO_DUMP_FILE / LOOM_TOPO_DUMP_FILE when set.
#pragma once

#include <string>

#include "topo/discover.h"
#include "topo/system.h"

namespace loom::topo {

// The local host. Errors in a user-supplied topology file are reported (kInvalidArgument,
// naming the file and the element); discovery itself never fails.
System loadLocalSystem(const DetectOptions& detect = {});

// A topology file on its own, without discovery (loom-topo --topo-file, tests).
System loadSystemFile(const std::string& path);

// Writes Loom's view of `sys` in NCCL's format; throws kSystemError naming the path.
void dumpSystem(const System& sys, const std::string& path);

}  // namespace loom::topo
