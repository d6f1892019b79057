// User-defined reduction operators (ncclRedOpCreatePreMulSum / ncclRedOpDestroy).
#include <nccl.h>

#include "api/comm.h"
#include "api/guard.h"
#include "base/mem_kind.h"
#include "kernels/reduce.h"

using loom::api::guard;

LOOM_NCCL_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                    ncclDataType_t datatype,
                                                    ncclScalarResidence_t residence,
                                                    ncclComm_t comm) {
  const char* fn = "ncclRedOpCreatePreMulSum";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    LOOM_CHECK_ARG(op != nullptr, "%s: op is NULL", fn);
    LOOM_CHECK_ARG(scalar != nullptr, "%s: scalar is NULL", fn);
    LOOM_CHECK_ARG(static_cast<int>(datatype) >= 0 && datatype < ncclNumTypes,
                   "%s: datatype %d is not an ncclDataType_t", fn, static_cast<int>(datatype));
    LOOM_CHECK_ARG(residence == ncclScalarHostImmediate || residence == ncclScalarDevice,
                   "%s: residence %d is not an ncclScalarResidence_t", fn,
                   static_cast<int>(residence));
    // A device-resident scalar is read when each collective runs: the staged path copies it
    // from device memory on the stream (stock NCCL's twin reads it itself).
    if (residence == ncclScalarDevice) {
      loom::MemInfo where = loom::classifyPointer(scalar);
      LOOM_CHECK_USAGE(where.kind == loom::MemKind::kDevice,
                       "%s: ncclScalarDevice with a scalar at %p that is not CUDA device memory; "
                       "pass a host scalar with ncclScalarHostImmediate",
                       fn, scalar);
      LOOM_CHECK_USAGE(comm->staged || comm->shadow,
                       "%s: ncclScalarDevice on a communicator whose device buffers nobody "
                       "serves (%s)",
                       fn, comm->deviceServer.c_str());
    }
    std::lock_guard<std::mutex> lock(comm->opsMu);
    size_t idx = 0;
    while (idx < comm->userOps.size() && comm->userOps[idx].live) ++idx;
    if (idx == comm->userOps.size()) comm->userOps.emplace_back();
    auto& u = comm->userOps[idx];
    u.live = true;
    u.dtype = static_cast<int>(datatype);
    u.deviceScalar = residence == ncclScalarDevice ? scalar : nullptr;
    // A device scalar is not known here: the reducer carries the kind and the type, and the
    // staged path makes each call's reducer from the scalar its stream copied (runRecord).
    const uint64_t zero = 0;
    u.red = loom::Reducer::preMulSum(static_cast<int>(datatype), u.deviceScalar ? &zero : scalar);
    // Its twin on stock NCCL, for the calls the shadow serves; without one, those calls
    // fail naming the op (host calls are unaffected).
    u.hasStockOp = false;
    if (comm->shadow && comm->shadow->lib().api().redOpCreatePreMulSum)
      u.hasStockOp = comm->shadow->lib().api().redOpCreatePreMulSum(
                         &u.stockOp, scalar, datatype, residence,
                         comm->shadow->stockComm()) == ncclSuccess;
    *op = static_cast<ncclRedOp_t>(ncclNumOps + idx);
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  const char* fn = "ncclRedOpDestroy";
  return guard(fn, comm, [&] {
    loom::api::checkComm(comm, fn);
    LOOM_CHECK_ARG(op >= ncclNumOps, "%s: op %d is a built-in operator", fn, static_cast<int>(op));
    std::lock_guard<std::mutex> lock(comm->opsMu);
    size_t idx = static_cast<size_t>(op - ncclNumOps);
    LOOM_CHECK_ARG(idx < comm->userOps.size() && comm->userOps[idx].live,
                   "%s: op %d was not created on this communicator (or destroyed already)", fn,
                   static_cast<int>(op));
    auto& u = comm->userOps[idx];
    u.live = false;
    if (u.hasStockOp && comm->shadow->lib().api().redOpDestroy)
      comm->shadow->lib().api().redOpDestroy(u.stockOp, comm->shadow->stockComm());
    u.hasStockOp = false;
    return ncclSuccess;
  });
}

// The pncclX profiling names (nccl.h declares both; NCCL exports both).
LOOM_NCCL_PROFILING_ALIAS(ncclRedOpCreatePreMulSum);
LOOM_NCCL_PROFILING_ALIAS(ncclRedOpDestroy);
