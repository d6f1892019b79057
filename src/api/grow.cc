// ncclCommGetUniqueId and ncclCommGrow (NCCL 2.29): a communicator grown by ranks that join
// it. The coordinator, one existing rank, makes a fresh job id with ncclCommGetUniqueId (its
// root runs in the coordinator's process) and hands it to the new ranks out of band. At
// ncclCommGrow the existing ranks all-gather over the parent which of them holds the id
// (exactly one must, the id this communicator made and no grow has used) and the nRanks
// each asks for, so that a bad call fails on every existing rank alike instead of leaving
// the others waiting; then every rank initializes the new communicator from the id as
// ncclCommInitRankConfig does, the existing ranks keeping their ranks on their parent's
// device, with the parent's config unless given one, the new ranks with theirs (or the
// defaults). Stock NCCL, where it serves device memory, gets a communicator of its own at
// that init, as for any other.
#include <nccl.h>

#include <array>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include "api/comm.h"
#include "api/group.h"
#include "api/guard.h"
#include "api/init.h"
#include "api/kept_config.h"
#include "base/error.h"
#include "dispatch/nccl_extra_abi.h"

namespace {

using IdBytes = std::array<uint8_t, loom::kUniqueIdBytes>;

// At the call or, inside a group, at its end: collective over the parent's existing ranks.
ncclResult_t growNow(ncclComm_t comm, int nRanks, const std::optional<IdBytes>& id,
                     ncclComm_t* newcomm, const ncclConfig_t* config) {
  const char* fn = "ncclCommGrow";
  // id: 0 none, 1 the id this communicator made and no grow has used, 2 another id
  struct Entry {
    int32_t nRanks;
    int32_t id;
    IdBytes bytes;
  };
  Entry mine{nRanks, 0, {}};
  if (id) {
    std::lock_guard<std::mutex> lock(comm->growMu);
    const bool ours = comm->growIdPending && std::memcmp(id->data(), comm->growId, id->size()) == 0;
    mine.id = ours ? 1 : 2;
    mine.bytes = *id;
  }
  std::vector<Entry> all(comm->nranks);
  all[comm->rank] = mine;
  comm->core->bootstrap().allGather(all.data(), sizeof(Entry));
  int holder = -1;
  for (int r = 0; r < comm->nranks; ++r) {
    LOOM_CHECK_USAGE(all[r].nRanks == all[0].nRanks,
                     "%s: existing ranks ask for different sizes: rank 0 nRanks=%d, rank %d "
                     "nRanks=%d", fn, all[0].nRanks, r, all[r].nRanks);
    if (all[r].id == 0) continue;
    LOOM_CHECK_USAGE(holder < 0,
                     "%s: existing ranks %d and %d both passed a uniqueId; only the coordinator "
                     "passes the one ncclCommGetUniqueId gave it, the other existing ranks NULL",
                     fn, holder, r);
    holder = r;
  }
  LOOM_CHECK_USAGE(holder >= 0,
                   "%s: no existing rank passed a uniqueId; the coordinator passes the one "
                   "ncclCommGetUniqueId gave it (and hands it to the new ranks)", fn);
  LOOM_CHECK_USAGE(all[holder].id == 1,
                   "%s: the uniqueId rank %d passed was not made by ncclCommGetUniqueId on this "
                   "communicator, or an earlier grow used it (each is used once)", fn, holder);
  if (holder == comm->rank) {
    std::lock_guard<std::mutex> lock(comm->growMu);
    comm->growIdPending = false;  // used
  }
  const loom::JobId job = loom::JobId::decode(all[holder].bytes.data());
  return loom::api::startChild(comm, newcomm, nRanks, comm->rank, job, config, fn);
}

}  // namespace

LOOM_NCCL_API ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId) {
  const char* fn = "ncclCommGetUniqueId";
  return loom::api::guard(fn, comm, [&] {
    LOOM_CHECK_ARG(uniqueId != nullptr, "%s: uniqueId is NULL", fn);
    loom::api::checkCommForManagement(comm, fn);
    std::lock_guard<std::mutex> lock(comm->growMu);
    LOOM_CHECK_USAGE(!comm->growIdPending,
                     "%s: this communicator's last grow id has not been used by ncclCommGrow "
                     "yet (as in NCCL, one at a time)", fn);
    loom::api::newJobFrom(comm).encode(comm->growId);
    std::memcpy(uniqueId->internal, comm->growId, sizeof(comm->growId));
    comm->growIdPending = true;
    return ncclSuccess;
  });
}

LOOM_NCCL_API ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId,
                                        int rank, ncclComm_t* newcomm, ncclConfig_t* config) {
  const char* fn = "ncclCommGrow";
  return loom::api::guard(fn, comm, [&] {
    if (!comm) {  // a new rank: an init from the coordinator's id
      LOOM_CHECK_ARG(uniqueId != nullptr,
                     "%s: a new rank (comm NULL) passes the uniqueId the coordinator got from "
                     "ncclCommGetUniqueId; it is NULL", fn);
      loom::api::checkInitArgs(newcomm, nRanks, rank, fn);
      const loom::JobId job = loom::JobId::decode(uniqueId->internal);
      return loom::api::startInit(newcomm, nRanks, job, rank, config, fn,
                                  loom::api::callerDevice());
    }
    LOOM_CHECK_ARG(newcomm != nullptr, "%s: newcomm is NULL", fn);
    *newcomm = nullptr;
    LOOM_CHECK_ARG(loom::api::isLiveComm(comm), "%s: comm %p is not a live communicator", fn,
                   static_cast<void*>(comm));
    LOOM_CHECK_ARG(rank == -1,
                   "%s: an existing rank passes rank=-1 (it keeps its rank, %d); got rank=%d", fn,
                   comm->rank, rank);
    LOOM_CHECK_ARG(nRanks > comm->nranks,
                   "%s: nRanks=%d must exceed the communicator's %d ranks", fn, nRanks,
                   comm->nranks);
    std::optional<IdBytes> id;
    if (uniqueId) {
      id.emplace();
      std::memcpy(id->data(), uniqueId->internal, id->size());
    }
    loom::api::KeptConfig kept(config, fn);  // checked now, kept for a group's end
    if (!loom::api::inGroup()) {
      loom::api::checkCommForManagement(comm, fn);
      return growNow(comm, nRanks, id, newcomm, kept.get());
    }
    // Inside a group (one thread driving existing and new ranks, or several existing ones):
    // at the group's end, on a thread of its own, as a split.
    loom::api::deferCall(comm, fn, [=, copy = kept]() mutable {
      loom::api::checkCommForManagement(comm, fn);
      return growNow(comm, nRanks, id, newcomm, copy.get());
    });
    return ncclSuccess;
  });
}

LOOM_NCCL_PROFILING_ALIAS(ncclCommGetUniqueId);
LOOM_NCCL_PROFILING_ALIAS(ncclCommGrow);
