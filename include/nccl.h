/*
 * Loom's nccl.h: the C API of NCCL 2.28.9, declared so that a program compiled against it
 * runs unchanged with either Loom (libloom.so, or the drop-in libnccl.so.2) or NVIDIA's
 * library, and a program compiled against NVIDIA's nccl.h runs unchanged with Loom.
 *
 * Everything that crosses the ABI (function signatures, enum values, struct layouts, the
 * initializer macros, the version) matches NCCL 2.28.9 exactly; tests/api/conformance_test
 * checks it against the toolkit's header at compile time.
 *
 * The one difference: this header does not require CUDA. Where the CUDA runtime headers
 * are on the include path they are included as NVIDIA's header does (so __half,
 * __nv_bfloat16, ... are available to the includer); elsewhere, or when
 * LOOM_NCCL_NO_CUDA_HEADERS is defined, only cudaStream_t is declared, with the very same
 * definition the CUDA runtime uses (a pointer to the incomplete struct CUstream_st), so
 * both spellings name the same type and mangle the same way.
 *
 * Valid C (C99 and later) and C++.
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>

#if !defined(LOOM_NCCL_NO_CUDA_HEADERS) && defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#define LOOM_NCCL_HAVE_CUDA_HEADERS 1
#endif
#endif

#ifdef LOOM_NCCL_HAVE_CUDA_HEADERS
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#if CUDART_VERSION >= 11000
#include <cuda_bf16.h>
#endif
#if defined(__cplusplus) && CUDART_VERSION >= 11080
#include <cuda_fp8.h>
#endif
#else
typedef struct CUstream_st* cudaStream_t;
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 22809
/* Versions up to 2.8 were coded as X*1000+Y*100+Z; from 2.9 on as X*10000+Y*100+Z. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque handles. */
typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* ncclCommWindowRegister flags. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* ncclConfig_t.CTAPolicy values. */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink flags: DEFAULT shrinks the parent as is; ABORT first aborts the parent's
 * outstanding operations (use it when a member has failed). */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* ncclCommRevoke flags (none defined yet; must be 0). */
#define NCCL_REVOKE_DEFAULT 0x00

/* Communicator options. The first three fields identify the struct (size, magic, version)
 * and are set by NCCL_CONFIG_INITIALIZER; a config not initialized with it is rejected.
 * Fields left at NCCL_CONFIG_UNDEF_* take the library default / environment value. */
typedef struct ncclConfig_v22800 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                     \
  {                                                                 \
    sizeof(ncclConfig_t),                    /* size */             \
    0xcafebeef,                              /* magic */            \
    NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */ \
    NCCL_CONFIG_UNDEF_INT,                   /* blocking */         \
    NCCL_CONFIG_UNDEF_INT,                   /* cgaClusterSize */   \
    NCCL_CONFIG_UNDEF_INT,                   /* minCTAs */          \
    NCCL_CONFIG_UNDEF_INT,                   /* maxCTAs */          \
    NCCL_CONFIG_UNDEF_PTR,                   /* netName */          \
    NCCL_CONFIG_UNDEF_INT,                   /* splitShare */       \
    NCCL_CONFIG_UNDEF_INT,                   /* trafficClass */     \
    NCCL_CONFIG_UNDEF_PTR,                   /* commName */         \
    NCCL_CONFIG_UNDEF_INT,                   /* collnetEnable */    \
    NCCL_CONFIG_UNDEF_INT,                   /* CTAPolicy */        \
    NCCL_CONFIG_UNDEF_INT,                   /* shrinkShare */      \
    NCCL_CONFIG_UNDEF_INT,                   /* nvlsCTAs */         \
    NCCL_CONFIG_UNDEF_INT,                   /* nChannelsPerNetPeer */ \
    NCCL_CONFIG_UNDEF_INT,                   /* nvlinkCentricSched */  \
  }

/* Filled in by ncclGroupSimulateEnd. */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER                                   \
  {                                                                 \
    sizeof(ncclSimInfo_t),                   /* size */             \
    0x74685283,                              /* magic */            \
    NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */ \
    NCCL_UNDEF_FLOAT                         /* estimatedTime */    \
  }

/* Every entry point exists twice: ncclX, and pncclX for profiling interposers. */

/* Memory suitable for every optimisation the library offers (registration, windows). The
 * allocation may be rounded up. Loom: page-aligned host memory (see the README). */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t pncclMemAlloc(void** ptr, size_t size);
ncclResult_t ncclMemFree(void* ptr);
ncclResult_t pncclMemFree(void* ptr);

/* *version = NCCL_VERSION_CODE of the library actually loaded. */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t pncclGetVersion(int* version);

/* Created once (by one rank) and handed to every rank before ncclCommInitRank*. */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId);

/* Communicator creation; collective over all nranks callers of the same id(s). */
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
/* ndev communicators of one process; devlist NULL means devices 0..ndev-1. */
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);

/* Finalize flushes outstanding work (non-blocking comms report ncclInProgress until done);
 * Destroy then frees local resources; Abort stops everything and frees at once. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);

/* Stops in-flight operations so that destroy/split/shrink can proceed; revokeFlags must
 * be NCCL_REVOKE_DEFAULT. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* Ranks passing the same color form a new communicator, ordered by key; color
 * NCCL_SPLIT_NOCOLOR yields *newcomm == NULL. config NULL inherits the parent's. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config);

/* A new communicator without the listed ranks (remaining ranks renumbered in order). */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                             ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);

/* Like ncclCommInitRankConfig with nId ids (same ids, same order on every rank). */
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config);

/* Static description of a result code. */
const char* ncclGetErrorString(ncclResult_t result);
const char* pncclGetErrorString(ncclResult_t result);

/* The message of the last error (of comm, or of the calling thread when comm is NULL). */
const char* ncclGetLastError(ncclComm_t comm);
const char* pncclGetLastError(ncclComm_t comm);

/* Re-reads NCCL_DEBUG and friends from the environment. */
__attribute__((deprecated("ncclResetDebugInit is not supported as part of the NCCL API and "
                           "will be removed in the future")))
void ncclResetDebugInit(void);
__attribute__((deprecated("pncclResetDebugInit is not supported as part of the NCCL API and "
                           "will be removed in the future")))
void pncclResetDebugInit(void);

/* Asynchronous error state of comm (ncclInProgress while a non-blocking call runs). */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank);

/* Buffer registration for zero-copy transfers. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle);

/* Collective registration of a memory window (winFlags: NCCL_WIN_*). */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                     int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* ncclRedOp_t must keep the size it always had. The compiler picks an enum's size from its
 * values, so ncclMaxRedOp is defined as the largest positive value that fits in the size an
 * enum with small values gets (measured with the dummy enum), never growing the type. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  /* Number of built-in operators, and the first value handed out by ncclRedOpCreate*. */
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives: Device = read by the collective while
 * it runs; HostImmediate = read before ncclRedOpCreatePreMulSum returns. */
typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

/* A sum that first multiplies each input by *scalar; valid for comm and datatype only. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);
/* Destroys an operator of comm; allowed as soon as the last call using it has returned. */
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/*
 * Collectives and point-to-point. Each rank calls them on its own communicator; they return
 * once the operation is enqueued on `stream`. A call whose buffers are the same memory
 * (sendbuff == recvbuff, or the rank's slot of the larger buffer for
 * all-gather/reduce-scatter/gather/scatter) runs in place.
 */
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream);

/* Deprecated in-place broadcast. */
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream);

/* sendbuff holds nranks*recvcount elements; rank i receives block i of the reduction. */
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);

/* recvbuff holds nranks*sendcount elements; rank i's data lands at offset i*sendcount. */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* Block j of sendbuff goes to rank j; block i of recvbuff comes from rank i. */
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm,
                          cudaStream_t stream);

/* Point-to-point; matching send/recv pairs that must progress together go in one group. */
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/* Groups: calls between Start and End are fused and issued at End (which, for collectives,
 * only guarantees they are enqueued). SimulateEnd reports instead of issuing. */
ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
