/*
 * Loom's own C extensions to the NCCL API (nccl.h). Everything here is loomCamelCase and
 * exported by both libloom.so and the drop-in libnccl.so.2; a program that wants to know
 * whether it runs on Loom can look up loomGetVersionString with dlsym.
 *
 * Valid C and C++.
 */
#ifndef LOOM_LOOM_H_
#define LOOM_LOOM_H_

#include <nccl.h>

#include "loom/version_gen.h" /* LOOM_VERSION_MAJOR/MINOR/PATCH/STRING */

#ifdef __cplusplus
extern "C" {
#endif

/* Loom's version as "MAJOR.MINOR.PATCH" (LOOM_VERSION_STRING of the library loaded, which
 * may differ from the header's). ncclGetVersion reports the NCCL API version instead. */
const char* loomGetVersionString(void);

/* Optional capabilities, as bits of the masks loomGetFeatures returns. */
typedef enum {
  loomFeatureHostMemory = 1 << 0,   /* collectives on plain host memory */
  loomFeatureCuda = 1 << 1,         /* CUDA device buffers (libcudart) */
  loomFeatureNvml = 1 << 2,         /* GPU topology through NVML (libnvidia-ml) */
  loomFeatureIbverbs = 1 << 3,      /* InfiniBand / RoCE transport (libibverbs) */
  loomFeatureUcx = 1 << 4,          /* UCX transport (libucp) */
  loomFeatureNcclFallback = 1 << 5  /* hand-off to the stock libnccl.so.2 */
} loomFeature_t;

/* *compiled: features this build of Loom contains.
 * *available: features whose runtime library can be loaded on this machine right now
 * (independent of *compiled, so a tool can say "built without X" or "X is missing here").
 * Either pointer may be NULL, not both (ncclInvalidArgument). */
ncclResult_t loomGetFeatures(unsigned* compiled, unsigned* available);

/* Writes the flight recorder of `comm` (its last operations: sequence number, collective,
 * size, type, algorithm, peers, times, state, and the peer a stalled one waits on) as JSON
 * lines to `dir`/loom-<comm>-r<rank>.jsonl, replacing an earlier dump of the same rank.
 * dir NULL: LOOM_DUMP_DIR. Works on a communicator that has failed or been revoked (that is
 * when it is wanted); loom-postmortem merges the dumps of all ranks.
 * ncclInvalidArgument: no such communicator, or no directory (dir NULL, LOOM_DUMP_DIR
 * unset); ncclSystemError: the file cannot be written; ncclInvalidUsage: recorder off
 * (LOOM_FLIGHT_RECORDER=0). */
ncclResult_t loomDumpState(ncclComm_t comm, const char* dir);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LOOM_LOOM_H_ */
