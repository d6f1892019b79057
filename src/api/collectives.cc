// Collective and point-to-point entry points: argument checks, then submit to the group.
#include <nccl.h>

#include <cstring>

#include "api/buffers.h"
#include "api/comm.h"
#include "api/group.h"
#include "api/guard.h"
#include "base/log.h"
#include "kernels/reduce.h"

using loom::Collective;
using loom::MemKind;
using loom::api::checkBuffers;
using loom::api::guard;
using loom::api::OpArgs;

namespace {

// Reads an enum argument's raw value: a caller may pass any int, and loading an
// out-of-range value as the enum type would be undefined behaviour.
template <typename E>
int raw(const E& e) {
  int v;
  static_assert(sizeof(E) == sizeof(int));
  memcpy(&v, &e, sizeof(v));
  return v;
}

void checkType(const ncclDataType_t& type, const char* fn) {
  int t = raw(type);
  LOOM_CHECK_ARG(t >= 0 && t < ncclNumTypes, "%s: datatype %d is not an ncclDataType_t (0..%d)",
                 fn, t, ncclNumTypes - 1);
}

// Call after checkType.
void checkOp(ncclComm_t comm, const ncclRedOp_t& redop, ncclDataType_t t, const char* fn) {
  int op = raw(redop);
  if (op >= 0 && op < ncclNumOps) return;
  int idx = op - ncclNumOps;
  std::lock_guard<std::mutex> lock(comm->opsMu);
  LOOM_CHECK_ARG(idx >= 0 && idx < static_cast<int>(comm->userOps.size()) &&
                     comm->userOps[idx].live,
                 "%s: reduction op %d is neither built in nor created on this communicator", fn,
                 op);
  LOOM_CHECK_ARG(comm->userOps[idx].dtype == static_cast<int>(t),
                 "%s: reduction op %d was created for datatype %d, used with %d", fn, op,
                 comm->userOps[idx].dtype, static_cast<int>(t));
}

void checkCount(size_t count, ncclDataType_t t, size_t mult, const char* fn) {
  size_t elt = loom::dtypeSize(static_cast<int>(t));
  LOOM_CHECK_ARG(count <= SIZE_MAX / elt / (mult ? mult : 1),
                 "%s: count %zu is too large for its datatype", fn, count);
}

void checkPtr(const void* p, size_t count, const char* what, const char* fn) {
  LOOM_CHECK_ARG(count == 0 || p != nullptr, "%s: %s is NULL with count %zu", fn, what, count);
}

void checkRoot(ncclComm_t comm, int root, const char* what, const char* fn) {
  LOOM_CHECK_ARG(root >= 0 && root < comm->nranks, "%s: %s %d is out of range [0, %d)", fn, what,
                 root, comm->nranks);
}

ncclResult_t submit(OpArgs a, MemKind mem, cudaStream_t stream, const char* fn) {
  a.mem = mem;
  a.stream = stream;
  loom::ScopedLogRank lr(a.comm->rank);
  if (a.count == 0) return ncclSuccess;  // a valid no-op (every rank drops it alike)
  loom::api::submit(a);
  return ncclSuccess;
}

}  // namespace

LOOM_NCCL_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream) {
  const char* fn = "ncclAllReduce";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    checkType(datatype, fn);
    checkOp(comm, op, datatype, fn);
    checkCount(count, datatype, 1, fn);
    checkPtr(sendbuff, count, "sendbuff", fn);
    checkPtr(recvbuff, count, "recvbuff", fn);
    MemKind mem =
        checkBuffers(comm, fn, {{"sendbuff", sendbuff, count}, {"recvbuff", recvbuff, count}});
    return submit({Collective::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, false,
                   false, comm}, mem, stream, fn);
  });
}

LOOM_NCCL_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                         ncclDataType_t datatype, int root, ncclComm_t comm,
                                         cudaStream_t stream) {
  const char* fn = "ncclBroadcast";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    checkType(datatype, fn);
    checkCount(count, datatype, 1, fn);
    checkRoot(comm, root, "root", fn);
    if (comm->rank == root) checkPtr(sendbuff, count, "sendbuff (root)", fn);
    checkPtr(recvbuff, count, "recvbuff", fn);
    MemKind mem =
        checkBuffers(comm, fn, {{"sendbuff (root)", comm->rank == root ? sendbuff : nullptr, count},
                            {"recvbuff", recvbuff, count}});
    return submit({Collective::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root,
                   false, false, comm}, mem, stream, fn);
  });
}

LOOM_NCCL_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                     ncclComm_t comm, cudaStream_t stream) {
  return pncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

LOOM_NCCL_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op, int root,
                                      ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclReduce";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    checkType(datatype, fn);
    checkOp(comm, op, datatype, fn);
    checkCount(count, datatype, 1, fn);
    checkRoot(comm, root, "root", fn);
    checkPtr(sendbuff, count, "sendbuff", fn);
    if (comm->rank == root) checkPtr(recvbuff, count, "recvbuff (root)", fn);
    MemKind mem = checkBuffers(comm, fn, {{"sendbuff", sendbuff, count},
                            {"recvbuff (root)", comm->rank == root ? recvbuff : nullptr, count}});
    return submit({Collective::kReduce, sendbuff, recvbuff, count, datatype, op, root, false,
                   false, comm}, mem, stream, fn);
  });
}

LOOM_NCCL_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                         ncclDataType_t datatype, ncclComm_t comm,
                                         cudaStream_t stream) {
  const char* fn = "ncclAllGather";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    checkType(datatype, fn);
    checkCount(sendcount, datatype, comm->nranks, fn);
    checkPtr(sendbuff, sendcount, "sendbuff", fn);
    checkPtr(recvbuff, sendcount, "recvbuff", fn);
    MemKind mem =
        checkBuffers(comm, fn, {{"sendbuff", sendbuff, sendcount},
                                {"recvbuff", recvbuff, sendcount}});
    return submit({Collective::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0,
                   false, false, comm}, mem, stream, fn);
  });
}

LOOM_NCCL_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                             ncclDataType_t datatype, ncclRedOp_t op,
                                             ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclReduceScatter";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    checkType(datatype, fn);
    checkOp(comm, op, datatype, fn);
    checkCount(recvcount, datatype, comm->nranks, fn);
    checkPtr(sendbuff, recvcount, "sendbuff", fn);
    checkPtr(recvbuff, recvcount, "recvbuff", fn);
    MemKind mem =
        checkBuffers(comm, fn, {{"sendbuff", sendbuff, recvcount},
                                {"recvbuff", recvbuff, recvcount}});
    return submit({Collective::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0,
                   false, false, comm}, mem, stream, fn);
  });
}

LOOM_NCCL_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclComm_t comm,
                                        cudaStream_t stream) {
  const char* fn = "ncclAlltoAll";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    checkType(datatype, fn);
    checkCount(count, datatype, comm->nranks, fn);
    checkPtr(sendbuff, count, "sendbuff", fn);
    checkPtr(recvbuff, count, "recvbuff", fn);
    MemKind mem =
        checkBuffers(comm, fn, {{"sendbuff", sendbuff, count}, {"recvbuff", recvbuff, count}});
    // All-to-all is a group of sends and receives to every rank (self included).
    size_t bytes = count * loom::dtypeSize(datatype);
    OpArgs base{Collective::kAlltoAll, nullptr, nullptr, count, datatype, ncclSum, 0, false,
                false, comm};
    base.mem = mem;
    base.stream = stream;
    loom::api::InternalGroup internal;
    pncclGroupStart();
    for (int p = 0; p < comm->nranks; ++p) {
      OpArgs s = base, r = base;
      s.isSend = true;
      s.root = p;
      s.sendbuff = static_cast<const char*>(sendbuff) + p * bytes;
      r.isRecv = true;
      r.root = p;
      r.recvbuff = static_cast<char*>(recvbuff) + p * bytes;
      loom::api::submit(s);
      loom::api::submit(r);
    }
    return pncclGroupEnd();
  });
}

LOOM_NCCL_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, int root, ncclComm_t comm,
                                      cudaStream_t stream) {
  const char* fn = "ncclGather";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    checkType(datatype, fn);
    checkCount(count, datatype, comm->nranks, fn);
    checkRoot(comm, root, "root", fn);
    checkPtr(sendbuff, count, "sendbuff", fn);
    if (comm->rank == root) checkPtr(recvbuff, count, "recvbuff (root)", fn);
    MemKind mem = checkBuffers(comm, fn, {{"sendbuff", sendbuff, count},
                            {"recvbuff (root)", comm->rank == root ? recvbuff : nullptr, count}});
    size_t bytes = count * loom::dtypeSize(datatype);
    OpArgs base{Collective::kGather, nullptr, nullptr, count, datatype, ncclSum, root, false,
                false, comm};
    base.mem = mem;
    base.stream = stream;
    loom::api::InternalGroup internal;
    pncclGroupStart();
    OpArgs s = base;
    s.isSend = true;
    s.sendbuff = sendbuff;
    loom::api::submit(s);
    if (comm->rank == root)
      for (int p = 0; p < comm->nranks; ++p) {
        OpArgs r = base;
        r.isRecv = true;
        r.root = p;
        r.recvbuff = static_cast<char*>(recvbuff) + p * bytes;
        loom::api::submit(r);
      }
    return pncclGroupEnd();
  });
}

LOOM_NCCL_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  const char* fn = "ncclScatter";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    checkType(datatype, fn);
    checkCount(count, datatype, comm->nranks, fn);
    checkRoot(comm, root, "root", fn);
    if (comm->rank == root) checkPtr(sendbuff, count, "sendbuff (root)", fn);
    checkPtr(recvbuff, count, "recvbuff", fn);
    MemKind mem =
        checkBuffers(comm, fn, {{"sendbuff (root)", comm->rank == root ? sendbuff : nullptr, count},
                            {"recvbuff", recvbuff, count}});
    size_t bytes = count * loom::dtypeSize(datatype);
    OpArgs base{Collective::kScatter, nullptr, nullptr, count, datatype, ncclSum, root, false,
                false, comm};
    base.mem = mem;
    base.stream = stream;
    loom::api::InternalGroup internal;
    pncclGroupStart();
    if (comm->rank == root)
      for (int p = 0; p < comm->nranks; ++p) {
        OpArgs s = base;
        s.isSend = true;
        s.root = p;
        s.sendbuff = static_cast<const char*>(sendbuff) + p * bytes;
        loom::api::submit(s);
      }
    OpArgs r = base;
    r.isRecv = true;
    r.recvbuff = recvbuff;
    loom::api::submit(r);
    return pncclGroupEnd();
  });
}

LOOM_NCCL_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                    int peer, ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclSend";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    checkType(datatype, fn);
    checkCount(count, datatype, 1, fn);
    checkRoot(comm, peer, "peer", fn);
    checkPtr(sendbuff, count, "sendbuff", fn);
    MemKind mem = checkBuffers(comm, fn, {{"sendbuff", sendbuff, count}});
    return submit({Collective::kSendRecv, sendbuff, nullptr, count, datatype, ncclSum, peer, true,
                   false, comm}, mem, stream, fn);
  });
}

LOOM_NCCL_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                    ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclRecv";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    checkType(datatype, fn);
    checkCount(count, datatype, 1, fn);
    checkRoot(comm, peer, "peer", fn);
    checkPtr(recvbuff, count, "recvbuff", fn);
    MemKind mem = checkBuffers(comm, fn, {{"recvbuff", recvbuff, count}});
    return submit({Collective::kSendRecv, nullptr, recvbuff, count, datatype, ncclSum, peer, false,
                   true, comm}, mem, stream, fn);
  });
}

// The pncclX profiling names (nccl.h declares both; NCCL exports both).
LOOM_NCCL_PROFILING_ALIAS(ncclAllReduce);
LOOM_NCCL_PROFILING_ALIAS(ncclBroadcast);
LOOM_NCCL_PROFILING_ALIAS(ncclBcast);
LOOM_NCCL_PROFILING_ALIAS(ncclReduce);
LOOM_NCCL_PROFILING_ALIAS(ncclAllGather);
LOOM_NCCL_PROFILING_ALIAS(ncclReduceScatter);
LOOM_NCCL_PROFILING_ALIAS(ncclAlltoAll);
LOOM_NCCL_PROFILING_ALIAS(ncclGather);
LOOM_NCCL_PROFILING_ALIAS(ncclScatter);
LOOM_NCCL_PROFILING_ALIAS(ncclSend);
LOOM_NCCL_PROFILING_ALIAS(ncclRecv);
