// The binary interface of NCCL network plugins (libnccl-net*.so), versions 6 to 11, as
// NCCL 2.28 loads them: a plugin exports a struct object `ncclNetPlugin_v<N>` of function
// pointers. Typed here from NCCL's published interface description (ext-net); member
// order, types and sizes are the ABI, so each struct's size and the offsets that moved
// between versions are checked below. Plain C layout: Loom's test plugins include it too.
//
// What changed per version: v7 device handles on connect/accept, getDeviceMr,
// irecvConsumed; v8 regMr takes size_t, props.regIsGlobal; v9 isend/irecv take size_t,
// makeVDevice, props.forceFlush/vProps/maxP2pBytes/maxCollBytes; v10 init takes a
// profiler callback, connect a comm config, isend/irecv profiler handles; v11 init makes
// a per-communicator context (listen/connect take it), finalize, setNetAttr,
// props.maxMultiRequestSize. test() and iflush() report int sizes in every version.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::netabi {

// ncclResult_t (a 4-byte enum in the C ABI).
using Result = int;
enum : int {
  kOk = 0,
  kCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

constexpr int kHandleMaxSize = 128;  // NCCL_NET_HANDLE_MAXSIZE
constexpr int kPtrHost = 1;          // NCCL_PTR_HOST
constexpr int kPtrCuda = 2;          // NCCL_PTR_CUDA
constexpr int kPtrDmaBuf = 4;        // NCCL_PTR_DMABUF
constexpr int kMaxRequests = 32;     // NCCL_NET_MAX_REQUESTS: outstanding per comm
constexpr int kMaxDevsPerNic = 4;    // NCCL_NET_MAX_DEVS_PER_NIC
// What NCCL hands plugins of the int-size versions (v6-v8) at most per message.
constexpr size_t kLegacyMaxBytes = size_t(1) << 30;

// ncclDebugLogLevel values and the logger plugins print through.
enum : int { kLogNone = 0, kLogVersion = 1, kLogWarn = 2, kLogInfo = 3, kLogAbort = 4, kLogTrace = 5 };
typedef void (*Logger)(int level, unsigned long flags, const char* file, int line,
                       const char* fmt, ...);
typedef Result (*ProfilerCallback)(void** eHandle, int type, void* phandle, int64_t pluginId,
                                   void* extData);

// ncclNetDeviceHandle_v7_t .. _v11_t (device offload; Loom offers none: host type).
struct DeviceHandle {
  int netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
};

struct VDeviceProps {  // ncclNetVDeviceProps_v9_t .. _v11_t
  int ndevs;
  int devs[kMaxDevsPerNic];
};

struct CommConfig {  // ncclNetCommConfig_v10_t / _v11_t
  int trafficClass;  // -1: undefined
};

struct NetAttrSide {
  int32_t maxConcurrentPeers, minConcurrentPeers, maxFlowsPerPeer, minFlowsPerPeer;
};
struct NetAttr {  // ncclNetAttr_v11_t
  NetAttrSide sendCommAttr, recvCommAttr;
  uint32_t op, algo, proto;
};

struct PropsV6 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed;  // Mbps
  int port;
  float latency;  // us
  int maxComms;
  int maxRecvs;
};

struct PropsV7 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
};

struct PropsV8 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
};

struct PropsV9 {  // also v10's
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  VDeviceProps vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
};
using PropsV10 = PropsV9;

struct PropsV11 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  VDeviceProps vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
};

// Members every version has in the same place and form, after the version's own.
#define LOOM_NETABI_TAIL_V6                                                           \
  Result (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, \
                        int fd, void** mhandle);                                      \
  Result (*deregMr)(void* comm, void* mhandle)

struct NetV6 {
  const char* name;
  Result (*init)(Logger log);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropsV6* props);
  Result (*listen)(int dev, void* handle, void** listenComm);
  Result (*connect)(int dev, void* handle, void** sendComm);
  Result (*accept)(void* listenComm, void** recvComm);
  Result (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
  LOOM_NETABI_TAIL_V6;
  Result (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  Result (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                  void** request);
  Result (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                   void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* sendComm);
  Result (*closeRecv)(void* recvComm);
  Result (*closeListen)(void* listenComm);
};

// v7 and v8 differ only in regMr's size type and the props struct.
template <class Props, class RegSize>
struct NetV7Like {
  const char* name;
  Result (*init)(Logger log);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, Props* props);
  Result (*listen)(int dev, void* handle, void** listenComm);
  Result (*connect)(int dev, void* handle, void** sendComm, DeviceHandle** sendDevComm);
  Result (*accept)(void* listenComm, void** recvComm, DeviceHandle** recvDevComm);
  Result (*regMr)(void* comm, void* data, RegSize size, int type, void** mhandle);
  LOOM_NETABI_TAIL_V6;
  Result (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  Result (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                  void** request);
  Result (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                   void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* sendComm);
  Result (*closeRecv)(void* recvComm);
  Result (*closeListen)(void* listenComm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptrMhandle);
  Result (*irecvConsumed)(void* recvComm, int n, void* request);
};
using NetV7 = NetV7Like<PropsV7, int>;
using NetV8 = NetV7Like<PropsV8, size_t>;

struct NetV9 {
  const char* name;
  Result (*init)(Logger log);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropsV9* props);
  Result (*listen)(int dev, void* handle, void** listenComm);
  Result (*connect)(int dev, void* handle, void** sendComm, DeviceHandle** sendDevComm);
  Result (*accept)(void* listenComm, void** recvComm, DeviceHandle** recvDevComm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  LOOM_NETABI_TAIL_V6;
  Result (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                  void** request);
  Result (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                  void** mhandles, void** request);
  Result (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                   void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* sendComm);
  Result (*closeRecv)(void* recvComm);
  Result (*closeListen)(void* listenComm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptrMhandle);
  Result (*irecvConsumed)(void* recvComm, int n, void* request);
  Result (*makeVDevice)(int* d, VDeviceProps* props);
};

struct NetV10 {
  const char* name;
  Result (*init)(Logger log, ProfilerCallback prof);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropsV10* props);
  Result (*listen)(int dev, void* handle, void** listenComm);
  Result (*connect)(int dev, CommConfig* config, void* handle, void** sendComm,
                    DeviceHandle** sendDevComm);
  Result (*accept)(void* listenComm, void** recvComm, DeviceHandle** recvDevComm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  LOOM_NETABI_TAIL_V6;
  Result (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                  void* phandle, void** request);
  Result (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                  void** mhandles, void** phandles, void** request);
  Result (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                   void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* sendComm);
  Result (*closeRecv)(void* recvComm);
  Result (*closeListen)(void* listenComm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptrMhandle);
  Result (*irecvConsumed)(void* recvComm, int n, void* request);
  Result (*makeVDevice)(int* d, VDeviceProps* props);
};

struct NetV11 {
  const char* name;
  Result (*init)(void** ctx, uint64_t commId, CommConfig* config, Logger log,
                 ProfilerCallback prof);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropsV11* props);
  Result (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  Result (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                    DeviceHandle** sendDevComm);
  Result (*accept)(void* listenComm, void** recvComm, DeviceHandle** recvDevComm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  LOOM_NETABI_TAIL_V6;
  Result (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                  void* phandle, void** request);
  Result (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                  void** mhandles, void** phandles, void** request);
  Result (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                   void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* sendComm);
  Result (*closeRecv)(void* recvComm);
  Result (*closeListen)(void* listenComm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptrMhandle);
  Result (*irecvConsumed)(void* recvComm, int n, void* request);
  Result (*makeVDevice)(int* d, VDeviceProps* props);
  Result (*finalize)(void* ctx);
  Result (*setNetAttr)(void* ctx, NetAttr* attr);
};

#undef LOOM_NETABI_TAIL_V6

// The ABI on LP64 (every member of a net struct is pointer-sized).
static_assert(sizeof(DeviceHandle) == 32 && sizeof(VDeviceProps) == 20 && sizeof(NetAttr) == 44);
static_assert(sizeof(PropsV6) == 48 && offsetof(PropsV6, maxRecvs) == 44);
static_assert(sizeof(PropsV7) == 56 && offsetof(PropsV7, netDeviceVersion) == 52);
static_assert(sizeof(PropsV8) == 64 && offsetof(PropsV8, netDeviceVersion) == 56);
static_assert(sizeof(PropsV9) == 104 && offsetof(PropsV9, vProps) == 64 &&
              offsetof(PropsV9, maxP2pBytes) == 88);
static_assert(sizeof(PropsV11) == 112 && offsetof(PropsV11, maxMultiRequestSize) == 104);
static_assert(sizeof(NetV6) == 17 * 8 && offsetof(NetV6, closeListen) == 16 * 8);
static_assert(sizeof(NetV7) == 19 * 8 && sizeof(NetV8) == 19 * 8);
static_assert(sizeof(NetV9) == 20 * 8 && sizeof(NetV10) == 20 * 8);
static_assert(sizeof(NetV11) == 22 * 8 && offsetof(NetV11, setNetAttr) == 21 * 8);
static_assert(offsetof(NetV11, test) == 13 * 8 && offsetof(NetV6, test) == 13 * 8);

}  // namespace loom::netabi
