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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LOOM_LOOM_H_ */
