// The binary interface of NCCL profiler plugins (libnccl-profiler*.so), versions 4 to 6: a
// plugin exports a struct object `ncclProfiler_v<N>` of five members (name, init,
// startEvent, stopEvent, recordEventState, finalize). Typed here from NCCL's published
// interface description (plugins/profiler); member order and types are the ABI. Plain C
// layout: Loom's test plugin includes it too.
//
// What changed per version: v5 adds the API events (GroupApi, CollApi, P2pApi,
// KernelLaunch) that parent the task events, widens the descriptor's type to 64 bits and
// takes the communicator's id second in init; v6 adds copy-engine collective descriptors
// to the union (same prefix, same functions). Versions 1 to 3 are older than NCCL's own
// stand-in layer for them and are not loaded.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "transports/net/plugin_abi.h"

namespace loom::profabi {

using netabi::Logger;
using netabi::Result;
using netabi::kOk;

// Event types: the descriptor's `type` and the bits of the activation mask the plugin sets.
enum : int {
  kGroup = 1 << 0,
  kColl = 1 << 1,
  kP2p = 1 << 2,
  kProxyOp = 1 << 3,
  kProxyStep = 1 << 4,
  kProxyCtrl = 1 << 5,
  kKernelCh = 1 << 6,
  kNetPlugin = 1 << 7,
  kGroupApi = 1 << 8,
  kCollApi = 1 << 9,
  kP2pApi = 1 << 10,
  kKernelLaunch = 1 << 11,
};

// Event states (ncclProfilerEventState_t) Loom records.
enum : int {
  kStateKernelChStop = 22,
  kStateGroupStartApiStop = 23,
  kStateGroupEndApiStart = 24,
};

struct CollFields {  // v4 and v5 alike (v5 adds parentGroup)
  uint64_t seqNumber;
  const char* func;
  const void* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;
  const char* proto;
};

struct P2pFields {
  const char* func;
  void* buff;
  const char* datatype;
  size_t count;
  int peer;
  uint8_t nChannels;
};

struct KernelChFields {
  uint8_t channelId;
  uint64_t pTimer;  // NCCL: the GPU's globaltimer (ns) when the channel began
};

// ncclProfilerEventDescr_v4_t (the members Loom fills; the union is as large as NCCL's).
struct DescrV4 {
  uint8_t type;
  void* parentObj;  // a collective's group, a kernel channel's collective
  int rank;
  union {
    CollFields coll;
    P2pFields p2p;
    KernelChFields kernelCh;
    unsigned char pad[96];
  };
};

// ncclProfilerEventDescr_v5_t / _v6_t: v6's union only adds members.
struct DescrV5 {
  uint64_t type;
  void* parentObj;  // API events: the group API event; tasks: their API event
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;  // 1: the implicit group of a lone call; more: inside ncclGroupStart
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      CollFields c;
      void* parentGroup;  // the legacy (v4) group event
    } coll;
    struct {
      P2pFields p;
      void* parentGroup;
    } p2p;
    KernelChFields kernelCh;
    unsigned char pad[128];  // v6's copy-engine members are within this
  };
};

// ncclProfilerEventStateArgs_v4_t .. _v6_t
union StateArgs {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
};

struct ProfilerV4 {
  const char* name;
  Result (*init)(void** context, int* eActivationMask, const char* commName, uint64_t commHash, int nNodes,
                 int nranks, int rank, Logger logfn);
  Result (*startEvent)(void* context, void** eHandle, DescrV4* eDescr);
  Result (*stopEvent)(void* eHandle);
  Result (*recordEventState)(void* eHandle, int eState, StateArgs* eStateArgs);
  Result (*finalize)(void* context);
};

// v5 and v6 (v6's descriptor is DescrV5 with more union members).
struct ProfilerV5 {
  const char* name;
  Result (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                 int nranks, int rank, Logger logfn);
  Result (*startEvent)(void* context, void** eHandle, DescrV5* eDescr);
  Result (*stopEvent)(void* eHandle);
  Result (*recordEventState)(void* eHandle, int eState, StateArgs* eStateArgs);
  Result (*finalize)(void* context);
};

// NCCL's numbers, written out (its headers' layout on LP64), so that a slip here cannot hide
// behind Loom's test plugin, which shares these declarations.
static_assert(kGroup == 1 && kColl == 2 && kP2p == 4 && kKernelCh == 64 && kGroupApi == 256 && kCollApi == 512 &&
              kP2pApi == 1024 && kKernelLaunch == 2048);
static_assert(kStateKernelChStop == 22 && kStateGroupStartApiStop == 23 && kStateGroupEndApiStart == 24);
static_assert(offsetof(DescrV4, parentObj) == 8 && offsetof(DescrV4, rank) == 16 && offsetof(DescrV4, coll) == 24);
static_assert(offsetof(DescrV5, parentObj) == 8 && offsetof(DescrV5, rank) == 16 && offsetof(DescrV5, coll) == 24);
static_assert(offsetof(CollFields, count) == 32 && offsetof(CollFields, root) == 40 &&
              offsetof(CollFields, nChannels) == 56 && offsetof(CollFields, algo) == 64 &&
              offsetof(CollFields, proto) == 72 && sizeof(CollFields) == 80);
static_assert(offsetof(P2pFields, peer) == 32 && offsetof(P2pFields, nChannels) == 36 && sizeof(P2pFields) == 40);
static_assert(offsetof(DescrV5, coll.parentGroup) == 104 && offsetof(DescrV5, p2p.parentGroup) == 64);
static_assert(offsetof(DescrV5, groupApi.groupDepth) == 28 && offsetof(DescrV5, collApi.stream) == 56 &&
              offsetof(DescrV5, collApi.graphCaptured) == 64 && offsetof(DescrV5, p2pApi.stream) == 48);
static_assert(offsetof(KernelChFields, pTimer) == 8);
static_assert(offsetof(ProfilerV5, finalize) == 40 && offsetof(ProfilerV4, finalize) == 40);

}  // namespace loom::profabi
