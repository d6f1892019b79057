// Loom's diagnosis entry points (loom/loom.h): the flight recorder on demand.
#include <nccl.h>

#include <string>

#include "api/comm.h"
#include "api/guard.h"
#include "base/error.h"
#include "base/log.h"
#include "loom/loom.h"

extern "C" __attribute__((visibility("default"))) ncclResult_t loomDumpState(ncclComm_t comm,
                                                                            const char* dir) {
  return loom::api::guard("loomDumpState", nullptr, [&] {
    LOOM_CHECK_ARG(comm != nullptr, "loomDumpState: comm is NULL");
    loom::api::CallScope hold(comm);  // before its first look: an abort may be freeing it
    loom::api::checkCommForManagement(comm, "loomDumpState");
    std::string where = dir ? dir : loom::FlightRecorder::dumpDir();
    LOOM_CHECK_ARG(!where.empty(),
                   "loomDumpState: no directory (dir is NULL and LOOM_DUMP_DIR is unset)");
    loom::FlightRecorder& rec = comm->core->recorder();
    LOOM_CHECK_USAGE(rec.enabled(),
                     "loomDumpState: the flight recorder is off (LOOM_FLIGHT_RECORDER=0)");
    std::string path = rec.writeDump(where, "loomDumpState");
    LOOM_INFO(loom::kLogInit, "rank %d: flight recorder written to %s", comm->rank, path.c_str());
    return ncclSuccess;
  });
}
