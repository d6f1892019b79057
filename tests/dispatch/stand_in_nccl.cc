// A stand-in for stock NCCL (libnccl.so.2), selected with LOOM_NCCL_LIBRARY, for the
// fallback's routing tests on machines without a GPU. It exports the entry points Loom's
// dispatch binds, with nccl.h's signatures, and keeps every rank of a process in memory:
// ranks that share a unique id form a clique. All-reduce (float; sum, prod, max, min and
// pre-multiplied sums) and send/receive really move data, computed by whichever rank's
// call completes a round, so one thread driving every rank in a group works as well as a
// thread per rank. Every call is logged; tests read the log (and inject an asynchronous
// error) through the standInNccl* hooks with dlopen(RTLD_NOLOAD) and dlsym.
//
// The same tests run against real stock NCCL on a GPU (see tests/dispatch/CMakeLists.txt);
// this library is a test aid only.
#include <nccl.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct Deposit {
  int rank;
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t dtype;
  ncclRedOp_t op;
  float scalar = 1;  // the depositing rank's pre-multiplier (its own op table)
};

struct Clique {
  int nranks = 0;
  std::map<long, std::vector<Deposit>> allReduceRounds;  // round -> deposits so far
  std::map<std::pair<int, int>, std::deque<Deposit>> sends, recvs;  // (src, dst)
};

struct PreMul {
  float scalar;
};

}  // namespace

struct ncclComm {
  std::string id;
  int rank = 0;
  int nranks = 0;
  bool blocking = true;
  int pendingPolls = 0;  // ncclInProgress answers left (non-blocking init or group)
  long allReduces = 0;
  int asyncError = ncclSuccess;  // this communicator's own (the process-wide one aside)
  bool suspended = false;
  std::vector<PreMul> ops;
};

namespace {

struct State {
  std::mutex mu;
  std::map<std::string, Clique> cliques;
  std::string log;
  std::string lastError;
  long nextId = 0;
  int groupDepth = 0;
  int failInitOfRank = -1;  // this rank's init fails (unhandled CUDA error)
  std::vector<ncclComm*> inGroup;  // non-blocking comms with calls in the open group
  std::vector<ncclComm*> comms;    // live ones
  int liveComms = 0;
  std::atomic<int> asyncError{ncclSuccess};
  // Window registrations and device communicators made inside a group finish at its end,
  // as stock NCCL's do; collective calls outside one wait for their peers on `cv`.
  std::vector<std::function<ncclResult_t()>> atGroupEnd;
  std::condition_variable cv;
};

State& state() {
  static State* s = new State();
  return *s;
}

void logLine(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void logLine(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  state().log += buf;
  state().log += '\n';
}

ncclResult_t fail(ncclResult_t rc, const char* what) {
  state().lastError = what;
  return rc;
}

float apply(const Deposit& d, float acc, float x, bool first) {
  const ncclRedOp_t op = d.op;
  if (op >= ncclNumOps) x *= d.scalar;  // pre-multiplied sum
  if (first) return x;
  switch (op) {
    case ncclProd: return acc * x;
    case ncclMax: return acc > x ? acc : x;
    case ncclMin: return acc < x ? acc : x;
    default: return acc + x;
  }
}

void matchSendRecv(Clique& q, std::pair<int, int> key) {
  auto& s = q.sends[key];
  auto& r = q.recvs[key];
  while (!s.empty() && !r.empty()) {
    memcpy(r.front().recv, s.front().send, s.front().count * sizeof(float));
    s.pop_front();
    r.pop_front();
  }
}

// Inside a group, a non-blocking communicator's calls make ncclGroupEnd answer
// ncclInProgress until that communicator has been polled (as stock NCCL's may).
void touch(ncclComm* c) {
  State& st = state();
  if (st.groupDepth > 0 && !c->blocking) st.inGroup.push_back(c);
}

}  // namespace

EXPORT ncclResult_t ncclGetVersion(int* version) {
  *version = 22809;
  return ncclSuccess;
}

EXPORT const char* ncclGetErrorString(ncclResult_t rc) {
  switch (rc) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (stand-in)";
    case ncclInvalidArgument: return "invalid argument (stand-in)";
    case ncclInProgress: return "operation in progress";
    default: return "stand-in error";
  }
}

EXPORT const char* ncclGetLastError(ncclComm_t) { return state().lastError.c_str(); }

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* uid) {
  std::lock_guard<std::mutex> lock(state().mu);
  memset(uid->internal, 0, sizeof(uid->internal));
  snprintf(uid->internal, sizeof(uid->internal), "stand-in-%ld", state().nextId++);
  logLine("GetUniqueId %s", uid->internal);
  return ncclSuccess;
}

// The calling thread's current device, as stock NCCL takes it (cudaGetDevice): asked of the
// driver Loom loaded (LOOM_CUDA_DRIVER_LIBRARY, the stand-in driver in these tests).
int currentDevice() {
  const char* path = getenv("LOOM_CUDA_DRIVER_LIBRARY");
  void* h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  auto get = h ? reinterpret_cast<int (*)(int*)>(dlsym(h, "cuCtxGetDevice")) : nullptr;
  int dev = -1;
  if (!get || get(&dev) != 0) dev = -1;
  if (h) dlclose(h);
  return dev;
}

// The ints a newer NCCL's config has after NCCL 2.28.9's fields, as "a,b,c".
std::string newerFields(const ncclConfig_t* config) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(config);
  for (size_t at = sizeof(ncclConfig_t); at + sizeof(int) <= config->size; at += sizeof(int)) {
    int v;
    memcpy(&v, p + at, sizeof v);
    out += (out.empty() ? "" : ",") + std::to_string(v);
  }
  return out.empty() ? "-" : out;
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId uid,
                                           int rank, ncclConfig_t* config) {
  std::lock_guard<std::mutex> lock(state().mu);
  if (rank == state().failInitOfRank) {
    logLine("CommInitRank rank=%d failed", rank);
    return fail(ncclUnhandledCudaError, "stand-in: this rank's init fails");
  }
  auto* c = new ncclComm();
  c->id.assign(uid.internal, strnlen(uid.internal, sizeof(uid.internal)));
  c->rank = rank;
  c->nranks = nranks;
  state().cliques[c->id].nranks = nranks;
  state().liveComms++;
  state().comms.push_back(c);
  const bool blocking = !config || config->blocking != 0;
  c->blocking = blocking;
  c->pendingPolls = blocking ? 0 : 3;
  logLine("CommInitRank id=%s rank=%d nranks=%d blocking=%d device=%d", c->id.c_str(), rank,
          nranks, blocking ? 1 : 0, currentDevice());
  if (config)  // what the caller's config asked of stock NCCL
    logLine("CommConfig rank=%d size=%zu newer=%s cga=%d minCTAs=%d maxCTAs=%d net=%s "
            "trafficClass=%d name=%s CTAPolicy=%d nvlsCTAs=%d", rank, config->size,
            newerFields(config).c_str(), config->cgaClusterSize, config->minCTAs,
            config->maxCTAs, config->netName ? config->netName : "(none)", config->trafficClass,
            config->commName ? config->commName : "(none)", config->CTAPolicy, config->nvlsCTAs);
  *comm = c;
  return blocking ? ncclSuccess : ncclInProgress;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId uid, int rank) {
  return ncclCommInitRankConfig(comm, nranks, uid, rank, nullptr);
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
  std::lock_guard<std::mutex> lock(state().mu);
  if (comm->pendingPolls > 0) {
    comm->pendingPolls--;
    *err = ncclInProgress;
  } else {
    *err = comm->asyncError != ncclSuccess ? static_cast<ncclResult_t>(comm->asyncError)
                                           : static_cast<ncclResult_t>(state().asyncError.load());
  }
  return ncclSuccess;
}

// A non-blocking communicator finishes its finalize only after being polled, as stock's may.
EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(state().mu);
  logLine("CommFinalize id=%s rank=%d", comm->id.c_str(), comm->rank);
  if (comm->blocking) return ncclSuccess;
  comm->pendingPolls = 2;
  return ncclInProgress;
}

namespace {
ncclResult_t release(ncclComm_t comm, const char* how) {
  std::lock_guard<std::mutex> lock(state().mu);
  logLine("%s id=%s rank=%d", how, comm->id.c_str(), comm->rank);
  state().liveComms--;
  auto& live = state().comms;
  live.erase(std::remove(live.begin(), live.end(), comm), live.end());
  delete comm;
  return ncclSuccess;
}
}  // namespace

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) { return release(comm, "CommDestroy"); }
EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) { return release(comm, "CommAbort"); }

EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                             ncclDataType_t dtype, ncclScalarResidence_t,
                                             ncclComm_t comm) {
  if (dtype != ncclFloat) return fail(ncclInvalidArgument, "stand-in: float scalars only");
  std::lock_guard<std::mutex> lock(state().mu);
  comm->ops.push_back({*static_cast<float*>(scalar)});
  *op = static_cast<ncclRedOp_t>(ncclNumOps + comm->ops.size() - 1);
  logLine("RedOpCreatePreMulSum rank=%d op=%d scalar=%g", comm->rank, static_cast<int>(*op),
          comm->ops.back().scalar);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(state().mu);
  logLine("RedOpDestroy rank=%d op=%d", comm->rank, static_cast<int>(op));
  return ncclSuccess;
}

EXPORT ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count,
                                  ncclDataType_t dtype, ncclRedOp_t op, ncclComm_t comm,
                                  cudaStream_t stream) {
  if (dtype != ncclFloat) return fail(ncclInvalidArgument, "stand-in: float all-reduce only");
  std::lock_guard<std::mutex> lock(state().mu);
  touch(comm);
  logLine("AllReduce id=%s rank=%d count=%zu op=%d stream=%p", comm->id.c_str(), comm->rank,
          count, static_cast<int>(op), static_cast<void*>(stream));
  Clique& q = state().cliques[comm->id];
  auto& round = q.allReduceRounds[comm->allReduces++];
  round.push_back({comm->rank, send, recv, count, dtype, op,
                   op >= ncclNumOps ? comm->ops.at(op - ncclNumOps).scalar : 1.0f});
  if (static_cast<int>(round.size()) < q.nranks) return ncclSuccess;
  // The round is complete: every rank's result, in rank order like a ring would not be,
  // but exact for the small integers the tests use.
  std::vector<float> acc(count);
  std::vector<const Deposit*> byRank(q.nranks);
  for (const Deposit& d : round) byRank[d.rank] = &d;
  for (int r = 0; r < q.nranks; ++r)
    for (size_t i = 0; i < count; ++i)
      acc[i] = apply(*byRank[r], acc[i], static_cast<const float*>(byRank[r]->send)[i], r == 0);
  for (const Deposit& d : round) memcpy(d.recv, acc.data(), count * sizeof(float));
  q.allReduceRounds.erase(comm->allReduces - 1);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t dtype, int peer,
                             ncclComm_t comm, cudaStream_t stream) {
  if (dtype != ncclFloat) return fail(ncclInvalidArgument, "stand-in: float send only");
  std::lock_guard<std::mutex> lock(state().mu);
  touch(comm);
  logLine("Send id=%s rank=%d peer=%d count=%zu stream=%p", comm->id.c_str(), comm->rank, peer,
          count, static_cast<void*>(stream));
  Clique& q = state().cliques[comm->id];
  q.sends[{comm->rank, peer}].push_back({comm->rank, send, nullptr, count, dtype, ncclSum});
  matchSendRecv(q, {comm->rank, peer});
  return ncclSuccess;
}

EXPORT ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t dtype, int peer,
                             ncclComm_t comm, cudaStream_t stream) {
  if (dtype != ncclFloat) return fail(ncclInvalidArgument, "stand-in: float recv only");
  std::lock_guard<std::mutex> lock(state().mu);
  touch(comm);
  logLine("Recv id=%s rank=%d peer=%d count=%zu stream=%p", comm->id.c_str(), comm->rank, peer,
          count, static_cast<void*>(stream));
  Clique& q = state().cliques[comm->id];
  q.recvs[{peer, comm->rank}].push_back({comm->rank, nullptr, recv, count, dtype, ncclSum});
  matchSendRecv(q, {peer, comm->rank});
  return ncclSuccess;
}

// Logged only: the routing tests check what reaches them.
EXPORT ncclResult_t ncclBroadcast(const void*, void*, size_t count, ncclDataType_t, int root,
                                  ncclComm_t comm, cudaStream_t) {
  std::lock_guard<std::mutex> lock(state().mu);
  touch(comm);
  logLine("Broadcast id=%s rank=%d count=%zu root=%d", comm->id.c_str(), comm->rank, count, root);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclReduce(const void*, void*, size_t count, ncclDataType_t, ncclRedOp_t op,
                               int root, ncclComm_t comm, cudaStream_t) {
  std::lock_guard<std::mutex> lock(state().mu);
  touch(comm);
  logLine("Reduce id=%s rank=%d count=%zu op=%d root=%d", comm->id.c_str(), comm->rank, count,
          static_cast<int>(op), root);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclAllGather(const void*, void*, size_t count, ncclDataType_t,
                                  ncclComm_t comm, cudaStream_t) {
  std::lock_guard<std::mutex> lock(state().mu);
  touch(comm);
  logLine("AllGather id=%s rank=%d count=%zu", comm->id.c_str(), comm->rank, count);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclReduceScatter(const void*, void*, size_t count, ncclDataType_t,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  std::lock_guard<std::mutex> lock(state().mu);
  touch(comm);
  logLine("ReduceScatter id=%s rank=%d count=%zu op=%d", comm->id.c_str(), comm->rank, count,
          static_cast<int>(op));
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupStart() {
  std::lock_guard<std::mutex> lock(state().mu);
  state().groupDepth++;
  logLine("GroupStart");
  return ncclSuccess;
}
EXPORT ncclResult_t ncclGroupEnd() {
  std::lock_guard<std::mutex> lock(state().mu);
  logLine("GroupEnd");
  if (--state().groupDepth > 0) return ncclSuccess;
  std::vector<std::function<ncclResult_t()>> ends;
  ends.swap(state().atGroupEnd);
  ncclResult_t rc = ncclSuccess;
  for (auto& end : ends)
    if (ncclResult_t r = end(); rc == ncclSuccess) rc = r;
  if (rc != ncclSuccess) return rc;
  std::vector<ncclComm*> touched;
  touched.swap(state().inGroup);
  for (ncclComm* c : touched) c->pendingPolls = 2;
  return touched.empty() ? ncclSuccess : ncclInProgress;
}

// ---- registration, windows, memory and the device API. Windows of one registration round
// of a clique know each other: a peer's pointer is the peer's buffer.

struct ncclWindow_vidmem {
  ncclComm* comm;
  char* buff;
  size_t size;
  int round;
};

namespace {

// The stand-in driver's hook that makes host memory "device memory" of a device.
void markDevice(const void* p, size_t bytes, int dev) {
  const char* path = getenv("LOOM_CUDA_DRIVER_LIBRARY");
  void* h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  auto add = h ? reinterpret_cast<void (*)(const void*, size_t, int)>(
                     dlsym(h, "loomStandInAddDeviceRange"))
               : nullptr;
  if (add) add(p, bytes, dev);
  if (h) dlclose(h);
}

struct Extras {
  std::map<std::string, std::vector<std::vector<ncclWindow_vidmem*>>> windows;  // id -> rounds
  std::map<ncclComm*, int> windowRounds;  // each comm's registrations so far
  std::vector<void*> registrations;
  std::vector<void*> allocations;
  bool failMemAlloc = false;
  bool nullHandles = false;  // registrations and windows come back NULL
};
Extras& extras() {
  static Extras* e = new Extras();
  return *e;
}

}  // namespace

EXPORT ncclResult_t ncclCommRegister(ncclComm_t comm, void* buff, size_t size, void** handle) {
  std::lock_guard<std::mutex> lock(state().mu);
  logLine("CommRegister rank=%d buff=%p size=%zu", comm->rank, buff, size);
  if (extras().nullHandles) {  // as stock NCCL with its registration off
    *handle = nullptr;
    return ncclSuccess;
  }
  *handle = new char(1);
  extras().registrations.push_back(*handle);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommDeregister(ncclComm_t comm, void* handle) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto& regs = extras().registrations;
  auto it = std::find(regs.begin(), regs.end(), handle);
  if (it == regs.end()) return fail(ncclInvalidUsage, "stand-in: unknown registration");
  regs.erase(it);
  delete static_cast<char*>(handle);
  logLine("CommDeregister rank=%d", comm->rank);
  return ncclSuccess;
}

namespace {
bool roundComplete(const std::vector<ncclWindow_vidmem*>& round) {
  return std::all_of(round.begin(), round.end(), [](ncclWindow_vidmem* w) { return w; });
}
}  // namespace

// Collective: every rank of the communicator registers its window of the round. Inside a
// group *win is set at its end (the round must be complete then); outside one the call
// waits for the other ranks (5 s, then fails: a caller that registers its ranks one after
// another on one thread, outside a group, would wait forever on real NCCL).
EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                           ncclWindow_t* win, int flags) {
  std::unique_lock<std::mutex> lock(state().mu);
  const int round = extras().windowRounds[comm]++;
  auto& rounds = extras().windows[comm->id];
  if (static_cast<int>(rounds.size()) <= round) rounds.resize(round + 1);
  if (rounds[round].empty()) rounds[round].resize(comm->nranks, nullptr);
  auto* w = new ncclWindow_vidmem{comm, static_cast<char*>(buff), size, round};
  rounds[round][comm->rank] = w;
  logLine("CommWindowRegister rank=%d size=%zu flags=%d round=%d group=%d", comm->rank, size,
          flags, round, state().groupDepth > 0 ? 1 : 0);
  const std::string id = comm->id;
  const bool null = extras().nullHandles;
  auto finish = [id, round, w, win, null]() -> ncclResult_t {
    if (!roundComplete(extras().windows[id][round]))
      return fail(ncclInvalidUsage, "stand-in: a rank never registered its window of the round");
    *win = null ? nullptr : w;
    return ncclSuccess;
  };
  if (state().groupDepth > 0) {
    state().atGroupEnd.push_back(finish);
    return ncclSuccess;
  }
  state().cv.notify_all();
  const bool all = state().cv.wait_for(lock, std::chrono::seconds(5), [&] {
    return roundComplete(extras().windows[id][round]);
  });
  if (!all) return fail(ncclInternalError, "stand-in: the other ranks never registered (5 s)");
  return finish();
}

EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  std::lock_guard<std::mutex> lock(state().mu);
  if (!win || win->comm != comm) return fail(ncclInvalidArgument, "stand-in: not its window");
  extras().windows[comm->id][win->round][comm->rank] = nullptr;
  delete win;
  logLine("CommWindowDeregister rank=%d", comm->rank);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** out) {
  std::lock_guard<std::mutex> lock(state().mu);
  if (!win || win->comm != comm) return fail(ncclInvalidArgument, "stand-in: not its window");
  *out = win->buff;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t win, size_t offset, int peer,
                                             void** out) {
  std::lock_guard<std::mutex> lock(state().mu);
  const auto& round = extras().windows[win->comm->id][win->round];
  if (peer < 0 || peer >= static_cast<int>(round.size()) || !round[peer])
    return fail(ncclInvalidArgument, "stand-in: that peer has no such window");
  *out = round[peer]->buff + offset;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t, size_t, void**) {
  return fail(ncclInvalidUsage, "stand-in: no multimem (NVLS) here");
}

EXPORT ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  const int dev = currentDevice();
  std::lock_guard<std::mutex> lock(state().mu);
  if (extras().failMemAlloc || dev < 0) {
    logLine("MemAlloc size=%zu failed", size);
    return fail(ncclUnhandledCudaError, "stand-in: ncclMemAlloc fails as asked");
  }
  *ptr = aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  markDevice(*ptr, size, dev);
  extras().allocations.push_back(*ptr);
  logLine("MemAlloc size=%zu device=%d", size, dev);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclMemFree(void* ptr) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto& a = extras().allocations;
  auto it = std::find(a.begin(), a.end(), ptr);
  if (it == a.end()) return fail(ncclInvalidArgument, "stand-in: not its allocation");
  a.erase(it);
  logLine("MemFree");
  // The stand-in driver may still list the range as device memory: the memory is kept
  // (a test aid's leak) so that no later allocation at the address is misclassified.
  return ncclSuccess;
}

// The device communicator is NCCL's struct; the stand-in writes its rank, size and the first
// int of the requirements (copied when the call is made, as stock NCCL copies them) into the
// first three ints of whatever the caller passed; inside a group at its end.
EXPORT ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* reqs, void* out) {
  std::lock_guard<std::mutex> lock(state().mu);
  if (!reqs) return fail(ncclInvalidArgument, "stand-in: no requirements");
  const int marker = *static_cast<const int*>(reqs);
  const int rank = comm->rank, nranks = comm->nranks;
  auto finish = [out, rank, nranks, marker]() -> ncclResult_t {
    static_cast<int*>(out)[0] = rank;
    static_cast<int*>(out)[1] = nranks;
    static_cast<int*>(out)[2] = marker;
    return ncclSuccess;
  };
  logLine("DevCommCreate rank=%d group=%d", rank, state().groupDepth > 0 ? 1 : 0);
  if (state().groupDepth > 0) {
    state().atGroupEnd.push_back(finish);
    return ncclSuccess;
  }
  return finish();
}

EXPORT ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void*) {
  std::lock_guard<std::mutex> lock(state().mu);
  logLine("DevCommDestroy rank=%d", comm->rank);
  return ncclSuccess;
}

struct Team {
  int nRanks, rank, stride;
};
EXPORT Team ncclTeamWorld(ncclComm_t comm) { return {comm->nranks, comm->rank, 1}; }
EXPORT Team ncclTeamLsa(ncclComm_t comm) { return {comm->nranks, comm->rank, 1}; }
EXPORT Team ncclTeamRail(ncclComm_t) { return {1, 0, 1}; }
EXPORT int ncclTeamRankToWorld(ncclComm_t, Team team, int rank) { return rank * team.stride; }
EXPORT int ncclTeamRankToLsa(ncclComm_t, Team team, int rank) { return rank * team.stride; }
EXPORT ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, Team, int n, void*, void*) {
  std::lock_guard<std::mutex> lock(state().mu);
  logLine("GinBarrierCreateRequirement rank=%d n=%d", comm->rank, n);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclLsaBarrierCreateRequirement(Team team, int n, void*, void*) {
  std::lock_guard<std::mutex> lock(state().mu);
  logLine("LsaBarrierCreateRequirement nRanks=%d n=%d", team.nRanks, n);
  return ncclSuccess;
}
EXPORT int ncclLLA2ACalcSlots(int maxElts, int maxEltSize) { return maxElts * maxEltSize / 8; }
EXPORT ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, void*, void*) {
  std::lock_guard<std::mutex> lock(state().mu);
  logLine("LLA2ACreateRequirement nBlocks=%d nSlots=%d", nBlocks, nSlots);
  return ncclSuccess;
}

// ---- NCCL 2.30's one-sided calls (at once, not in stream order: a test aid)

namespace {
struct WaitDesc {  // nccl.h 2.30.7's ncclWaitSignalDesc_t
  int opCnt, peer, sigIdx, ctx;
};
size_t typeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 4;
  }
}
// Signals arrived: (clique, receiver, sender, sigIdx, ctx) -> count.
std::map<std::tuple<std::string, int, int, int, int>, int>& signals() {
  static auto* m = new std::map<std::tuple<std::string, int, int, int, int>, int>();
  return *m;
}
}  // namespace

EXPORT ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype,
                                  int peer, ncclWindow_t peerWin, size_t peerWinOffset,
                                  int sigIdx, int ctx, unsigned int, ncclComm_t comm,
                                  cudaStream_t) {
  std::lock_guard<std::mutex> lock(state().mu);
  if (!peerWin || peerWin->comm != comm) return fail(ncclInvalidArgument, "stand-in: not its window");
  auto& round = extras().windows[comm->id][peerWin->round];
  ncclWindow_vidmem* dst = peer >= 0 && peer < static_cast<int>(round.size()) ? round[peer] : nullptr;
  const size_t bytes = count * typeBytes(datatype);
  if (!dst || peerWinOffset + bytes > dst->size)
    return fail(ncclInvalidArgument, "stand-in: outside the peer's window");
  memcpy(dst->buff + peerWinOffset, localbuff, bytes);
  signals()[{comm->id, peer, comm->rank, sigIdx, ctx}]++;
  logLine("PutSignal rank=%d peer=%d bytes=%zu offset=%zu sigIdx=%d", comm->rank, peer, bytes,
          peerWinOffset, sigIdx);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int, ncclComm_t comm,
                               cudaStream_t) {
  std::lock_guard<std::mutex> lock(state().mu);
  signals()[{comm->id, peer, comm->rank, sigIdx, ctx}]++;
  logLine("Signal rank=%d peer=%d sigIdx=%d", comm->rank, peer, sigIdx);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclWaitSignal(int nDesc, const WaitDesc* descs, ncclComm_t comm,
                                   cudaStream_t) {
  std::lock_guard<std::mutex> lock(state().mu);
  for (int i = 0; i < nDesc; ++i) {
    int& arrived = signals()[{comm->id, comm->rank, descs[i].peer, descs[i].sigIdx, descs[i].ctx}];
    if (arrived < descs[i].opCnt) return fail(ncclInvalidUsage, "stand-in: signals not arrived");
    arrived -= descs[i].opCnt;
  }
  logLine("WaitSignal rank=%d n=%d", comm->rank, nDesc);
  return ncclSuccess;
}

// NCCL 2.30's memory calls: a suspended communicator says so in its statistics.
EXPORT ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  std::lock_guard<std::mutex> lock(state().mu);
  comm->suspended = true;
  logLine("CommSuspend rank=%d flags=%d", comm->rank, flags);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclCommResume(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(state().mu);
  comm->suspended = false;
  logLine("CommResume rank=%d", comm->rank);
  return ncclSuccess;
}
EXPORT ncclResult_t ncclCommMemStats(ncclComm_t comm, int stat, uint64_t* value) {
  std::lock_guard<std::mutex> lock(state().mu);
  if (stat == 1) *value = comm->suspended ? 1 : 0;  // ncclStatGpuMemSuspended
  else if (stat >= 0 && stat <= 3) *value = 4096u * (comm->rank + 1);
  else return fail(ncclInvalidArgument, "stand-in: no such statistic");
  return ncclSuccess;
}

// ---- test hooks

EXPORT void standInNcclNullHandles(int null) {
  std::lock_guard<std::mutex> lock(state().mu);
  extras().nullHandles = null != 0;
}
EXPORT void standInNcclFailMemAlloc(int fail) {
  std::lock_guard<std::mutex> lock(state().mu);
  extras().failMemAlloc = fail != 0;
}

EXPORT const char* standInNcclLog() {
  static thread_local std::string copy;
  std::lock_guard<std::mutex> lock(state().mu);
  copy = state().log;
  return copy.c_str();
}
EXPORT void standInNcclClearLog() {
  std::lock_guard<std::mutex> lock(state().mu);
  state().log.clear();
}
EXPORT int standInNcclLiveComms() {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().liveComms;
}
EXPORT void standInNcclSetAsyncError(int rc) { state().asyncError = rc; }
// The asynchronous error of the live stand-in communicator that is rank `rank` of `nranks`.
EXPORT void standInNcclSetCommAsyncError(int rank, int nranks, int rc) {
  std::lock_guard<std::mutex> lock(state().mu);
  for (ncclComm* c : state().comms)
    if (c->rank == rank && c->nranks == nranks) c->asyncError = rc;
}
EXPORT void standInNcclFailInitOfRank(int rank) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().failInitOfRank = rank;
}
