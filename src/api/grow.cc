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
#include <iterator>
#include <string>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include "api/comm.h"
#include "api/group.h"
#include "api/guard.h"
#include "api/init.h"
#include "api/kept_config.h"
#include "api/mgmt_job.h"
#include "base/error.h"
#include "bootstrap/root.h"
#include "dispatch/nccl_extra_abi.h"

namespace {

using IdBytes = std::array<uint8_t, loom::kUniqueIdBytes>;

// What an existing rank's call brings to the exchange.
struct Call {
  int nRanks = 0;
  std::optional<IdBytes> id;
  ncclComm_t* newcomm = nullptr;
  loom::api::KeptConfig config;
  // A bad argument of this rank's call: reported on every existing rank after the exchange
  // (this rank's own words here), so that none waits for a rank that gave up.
  int bad = 0;  // one of kBadWhy's indexes
  std::string badMsg;
};

const char* const kBadWhy[] = {"", "rank is not -1", "nRanks does not exceed the parent's size",
                               "newcomm is NULL", "its config is invalid"};

// At the call or, inside a group, at its end: collective over the parent's existing ranks.
ncclResult_t growNow(ncclComm_t comm, const Call& call) {
  const char* fn = "ncclCommGrow";
  // id: 0 none, 1 the id this communicator made and no grow has used, 2 another id
  struct Entry {
    int32_t nRanks;
    int32_t id;
    int32_t bad;
    IdBytes bytes;
  };
  Entry mine{call.nRanks, 0, call.bad, {}};
  if (call.id) {
    std::lock_guard<std::mutex> lock(comm->growMu);
    const bool ours = comm->growIdPending &&
                      std::memcmp(call.id->data(), comm->growId, call.id->size()) == 0;
    mine.id = ours ? 1 : 2;
    mine.bytes = *call.id;
  }
  std::vector<Entry> all(comm->nranks);
  all[comm->rank] = mine;
  comm->core->bootstrap().allGather(all.data(), sizeof(Entry));
  // A grow that fails uses up the id this communicator made (passed or not) and calls off
  // its root's rendezvous, so that the new ranks waiting there fail at once.
  auto fail = [&](loom::Code code, const std::string& msg) {
    loom::api::cancelPendingGrowId(comm);
    throw loom::Error(code, msg);
  };
  if (call.bad) fail(loom::Code::kInvalidArgument, call.badMsg);
  int holder = -1;
  for (int r = 0; r < comm->nranks; ++r) {
    if (all[r].bad > 0 && all[r].bad < static_cast<int>(std::size(kBadWhy)))
      fail(loom::Code::kInvalidUsage,
           loom::strprintf("%s: existing rank %d's call has a bad argument (%s); no rank grows",
                           fn, r, kBadWhy[all[r].bad]));
    if (all[r].nRanks != all[0].nRanks)
      fail(loom::Code::kInvalidUsage,
           loom::strprintf("%s: existing ranks ask for different sizes: rank 0 nRanks=%d, rank "
                           "%d nRanks=%d", fn, all[0].nRanks, r, all[r].nRanks));
    if (all[r].id == 0) continue;
    if (holder >= 0)
      fail(loom::Code::kInvalidUsage,
           loom::strprintf("%s: existing ranks %d and %d both passed a uniqueId; only the "
                           "coordinator passes the one ncclCommGetUniqueId gave it, the other "
                           "existing ranks NULL", fn, holder, r));
    holder = r;
  }
  if (holder < 0)
    fail(loom::Code::kInvalidUsage,
         loom::strprintf("%s: no existing rank passed a uniqueId; the coordinator passes the one "
                         "ncclCommGetUniqueId gave it (and hands it to the new ranks)", fn));
  if (all[holder].id != 1)
    fail(loom::Code::kInvalidUsage,
         loom::strprintf("%s: the uniqueId rank %d passed was not made by ncclCommGetUniqueId on "
                         "this communicator, or an earlier grow used it (each is used once)",
                         fn, holder));
  if (holder == comm->rank) {
    std::lock_guard<std::mutex> lock(comm->growMu);
    comm->growIdPending = false;  // used
  }
  const loom::JobId job = loom::JobId::decode(all[holder].bytes.data());
  try {
    return loom::api::startChild(comm, call.newcomm, call.nRanks, comm->rank, job,
                                 call.config.get(), fn);
  } catch (...) {
    // This rank will not join: the new ranks are told at once (the holder runs the root).
    if (holder == comm->rank) loom::cancelRoot(job);
    throw;
  }
}

}  // namespace

LOOM_NCCL_API ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId) {
  const char* fn = "ncclCommGetUniqueId";
  return loom::api::guard(fn, comm, [&] {
    LOOM_CHECK_ARG(uniqueId != nullptr, "%s: uniqueId is NULL", fn);
    LOOM_CHECK_ARG(comm && loom::api::isLiveComm(comm), "%s: comm %p is not a live communicator",
                   fn, static_cast<void*>(comm));
    // Its init may be deferred to this very group's end: waiting for it would never end.
    LOOM_CHECK_USAGE(!loom::api::inGroup() || comm->asyncError.load() != ncclInProgress,
                     "%s: the communicator (rank %d) has not finished its init, which inside a "
                     "group runs at the group's end; call it after ncclGroupEnd", fn, comm->rank);
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
    LOOM_CHECK_ARG(loom::api::isLiveComm(comm), "%s: comm %p is not a live communicator", fn,
                   static_cast<void*>(comm));
    Call call;
    call.nRanks = nRanks;
    call.newcomm = newcomm;
    if (newcomm) *newcomm = nullptr;
    if (uniqueId) std::memcpy(call.id.emplace().data(), uniqueId->internal, sizeof(IdBytes));
    if (rank != -1) {
      call.bad = 1;
      call.badMsg = loom::strprintf("%s: an existing rank passes rank=-1 (it keeps its rank, %d); "
                                    "got rank=%d", fn, comm->rank, rank);
    } else if (nRanks <= comm->nranks) {
      call.bad = 2;
      call.badMsg = loom::strprintf("%s: nRanks=%d must exceed the communicator's %d ranks", fn,
                                    nRanks, comm->nranks);
    } else if (!newcomm) {
      call.bad = 3;
      call.badMsg = loom::strprintf("%s: newcomm is NULL", fn);
    } else {
      try {
        call.config = loom::api::KeptConfig(config, fn);  // checked now, kept for a group's end
      } catch (const loom::Error& e) {
        call.bad = 4;
        call.badMsg = e.what();
      }
    }
    if (!loom::api::inGroup()) {
      loom::api::checkCommForManagement(comm, fn);
      if (!loom::api::runsAsJob(comm)) return growNow(comm, call);
      // Its bad arguments too are reported by the job, after the exchange.
      return loom::api::startJob(comm, {{fn, newcomm, [comm, call](ncclComm_t* out) mutable {
                                   call.newcomm = out;
                                   return growNow(comm, call);
                                 }, {}}});
    }
    // Inside a group (one thread driving existing and new ranks, or several existing ones):
    // at the group's end, on a thread of its own, as a split.
    loom::api::deferCall(
        comm, fn, newcomm,
        [comm, call](ncclComm_t* out) mutable {
          loom::api::checkCommForManagement(comm, "ncclCommGrow");
          call.newcomm = out;
          return growNow(comm, call);
        },
        [comm] { loom::api::cancelPendingGrowId(comm); });
    return ncclSuccess;
  });
}

LOOM_NCCL_PROFILING_ALIAS(ncclCommGetUniqueId);
LOOM_NCCL_PROFILING_ALIAS(ncclCommGrow);
