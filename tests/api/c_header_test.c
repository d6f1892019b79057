/* Loom's public headers used from C (built as C11 with -Wall -Wextra -Wpedantic
 * -Wstrict-prototypes -Werror, with and without the CUDA headers), linked to libloom:
 * the initializers, the version and the extension functions must work from plain C. */
#include <nccl.h>
#include <loom/loom.h>

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define EXPECT(cond)                                                  \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                     \
    }                                                                 \
  } while (0)

int main(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  cudaStream_t stream = 0;
  int version = 0;
  unsigned compiled = 0, available = 0;

  EXPECT(config.size == sizeof(ncclConfig_t));
  EXPECT(config.magic == 0xcafebeefu);
  EXPECT(config.version == NCCL_VERSION_CODE);
  EXPECT(config.blocking == NCCL_CONFIG_UNDEF_INT);
  EXPECT(config.netName == NCCL_CONFIG_UNDEF_PTR);
  EXPECT(config.nvlinkCentricSched == NCCL_CONFIG_UNDEF_INT);
  EXPECT(sim.size == sizeof(ncclSimInfo_t) && sim.magic == 0x74685283u);
  EXPECT(sim.estimatedTime == NCCL_UNDEF_FLOAT);
  EXPECT(sizeof(ncclUniqueId) == 128);
  EXPECT(sizeof(ncclRedOp_t) == sizeof(int));
  EXPECT(stream == NULL);

  EXPECT(ncclGetVersion(&version) == ncclSuccess);
  EXPECT(version == NCCL_VERSION_CODE && version == 22809);
  EXPECT(ncclGetVersion(NULL) == ncclInvalidArgument);
  EXPECT(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0);
  EXPECT(strcmp(ncclGetErrorString(ncclNumResults), "unknown result code") == 0);

  EXPECT(strcmp(loomGetVersionString(), LOOM_VERSION_STRING) == 0);
  EXPECT(loomGetFeatures(&compiled, &available) == ncclSuccess);
  EXPECT((compiled & loomFeatureHostMemory) && (available & loomFeatureHostMemory));
  EXPECT(loomGetFeatures(NULL, NULL) == ncclInvalidArgument);

  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("C API OK: NCCL %d, Loom %s, features compiled 0x%x available 0x%x\n", version,
         loomGetVersionString(), compiled, available);
  return 0;
}
