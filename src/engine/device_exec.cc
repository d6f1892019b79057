#include "engine/device_exec.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "base/shm.h"
#include "bootstrap/bootstrap.h"
#include "engine/communicator.h"
#include "engine/device_net.h"
#include "engine/engine.h"
#include "engine/flat_plan.h"
#include "engine/plan_cache.h"
#include "topo/load.h"

namespace loom {
namespace {

StringKnob kDeviceExecutor("LOOM_DEVICE_EXECUTOR", "", "staged",
                           "What runs collectives on device buffers of communicators created from then "
                           "on: staged (through pinned host memory and the host engine), or kernel "
                           "(the device executor: the plan-interpreter kernel over FIFOs in GPU "
                           "memory; not yet run on a GPU). Every rank of a job must use the same");

SizeKnob kDeviceLLBytes("LOOM_DEVICE_LL_BYTES", "", "64K",
                        "The device executor runs collectives of at most this many bytes per rank with "
                        "the LL protocol (flagged 8-byte lines; lower latency), larger ones with Simple; "
                        "0: Simple always. NCCL_PROTO without LL also means Simple. Every rank must use the same",
                        KnobScope::kJob);

constexpr int kMaxRanks = 16;  // a direct plan's channel uses 2 (n - 1) = 30 FIFO ends; a block keeps 32
constexpr size_t kPinnedChunk = 256 << 10;  // pinned() allocates this much at a time
constexpr double kPeerGoneGraceSec = 2.0;     // watch(): a local peer process that exited

bool sameProcess(const PeerInfo& a, const PeerInfo& b) {
  return a.hostHash == b.hostHash && a.pidNs == b.pidNs && a.pid == b.pid;
}

// Whether `peers` span several hosts.
bool severalHosts(const std::vector<PeerInfo>& peers) {
  for (const PeerInfo& p : peers)
    if (p.hostHash != peers[0].hostHash) return true;
  return false;
}

// Why this rank cannot run the device executor ("" when it can).
std::string cannot(const std::vector<PeerInfo>& peers, const std::vector<int>& devices,
                   const std::vector<int>& sameContext, int rank) {
  const cuda::Driver* drv = cuda::driver();
  if (!drv) return "no CUDA driver: " + cuda::driverAbsenceReason();
  if (!drv->hasKernel) return drv->lib.path() + " lacks the stream, IPC or allocation functions it needs";
  const cuda::Kernels* k = cuda::kernels();
  if (!k) return "no CUDA kernels module (" LOOM_CUDA_KERNELS_LIBRARY ")";
  if (peers.size() > static_cast<size_t>(kMaxRanks))
    return strprintf("%zu ranks; it serves at most %d", peers.size(), kMaxRanks);
  for (size_t r = 0; r < peers.size(); ++r) {
    if (devices[r] < 0) return strprintf("rank %zu has no CUDA device", r);
    if (peers[r].hostHash == peers[rank].hostHash && peers[r].pidNs != peers[rank].pidNs)
      return "the ranks of this host span several pid namespaces";
  }
  // Rank threads sharing a CUDA context: their streams share its GPU work queues, which run
  // in push order, so a stream waiting for one rank's kernel (its next launch, an event wait)
  // would hold another rank's kernel, for which the first waits (8 rank threads on an H100
  // hung so). The direct path serves them without kernels that wait for each other.
  if (!sameContext.empty())
    return strprintf("rank %d is a thread of this process on the same CUDA device %d (ranks sharing a context "
                     "take the direct path)", sameContext[0], devices[rank]);
  return "";
}

// Lets this rank's device reach the devices of ranks in this process (threads on several
// GPUs): "" when it can.
std::string enablePeers(const cuda::Driver& drv, const std::vector<PeerInfo>& peers,
                        const std::vector<int>& devices, int rank) {
  for (size_t r = 0; r < peers.size(); ++r) {
    const int peerDev = devices[r];
    if (!sameProcess(peers[r], peers[rank]) || peerDev == devices[rank]) continue;
    if (!drv.kernel.deviceCanAccessPeer || !drv.kernel.ctxEnablePeerAccess || !drv.api.deviceGet)
      return drv.lib.path() + " lacks cuDeviceCanAccessPeer / cuCtxEnablePeerAccess";
    cuda::CuDevice me = 0, peer = 0;
    int can = 0;
    void* ctx = nullptr;
    if (drv.api.deviceGet(&me, devices[rank]) != cuda::kCudaSuccess ||
        drv.api.deviceGet(&peer, peerDev) != cuda::kCudaSuccess ||
        drv.kernel.deviceCanAccessPeer(&can, me, peer) != cuda::kCudaSuccess || !can)
      return strprintf("device %d cannot access device %d (rank %zu) as a peer", devices[rank], peerDev, r);
    if (drv.api.primaryCtxRetain(&ctx, peer) != cuda::kCudaSuccess) return "cuDevicePrimaryCtxRetain failed";
    const cuda::CuResult e = drv.kernel.ctxEnablePeerAccess(ctx, 0);
    if (e != cuda::kCudaSuccess && e != cuda::kPeerAccessAlreadyEnabled)
      return strprintf("cuCtxEnablePeerAccess(device %d -> %d): %s", devices[rank], peerDev,
                       drv.errorText(e).c_str());
  }
  return "";
}

// Whether this rank maps, through CUDA IPC, a small allocation of every peer in another
// process (GPUs without peer access refuse it): collective, every rank calls it once; `can`
// says whether this rank takes part. "" when it can; *keep is the rank's own allocation, to
// free once every peer has closed it.
std::string ipcTrial(Bootstrap& bs, const cuda::Driver* drv, const std::vector<PeerInfo>& peers, bool can,
                     cuda::CuDevicePtr* keep) {
  struct Trial {
    uint32_t ok = 0;
    uint32_t pad = 0;
    cuda::CuIpcHandle handle{};
  };
  const int rank = bs.rank();
  std::vector<Trial> all(peers.size());
  if (can && drv->api.memAlloc(keep, 256) == cuda::kCudaSuccess &&
      drv->ipc.ipcGetMemHandle(&all[rank].handle, *keep) == cuda::kCudaSuccess)
    all[rank].ok = 1;
  bs.allGather(all.data(), sizeof(Trial));
  if (!can) return "";
  if (!all[rank].ok) return "cannot export device memory through CUDA IPC";
  for (size_t r = 0; r < peers.size(); ++r) {
    if (peers[r].hostHash != peers[rank].hostHash || sameProcess(peers[r], peers[rank]) || !all[r].ok) continue;
    cuda::CuDevicePtr p = 0;
    if (cuda::CuResult e = drv->ipc.ipcOpenMemHandle(&p, all[r].handle, cuda::kIpcMemLazyEnablePeerAccess);
        e != cuda::kCudaSuccess)
      return strprintf("cannot map rank %zu's device memory through CUDA IPC (no peer access between the "
                       "GPUs?): %s", r, drv->errorText(e).c_str());
    drv->ipc.ipcCloseMemHandle(p);
  }
  return "";
}

// The plan context of device plans: the host's, ranked with this host's GPU model (NVLink or
// PCIe figures, channels a GPU keeps busy, rings in the topology search's GPU order; on a
// host without GPUs the model is the host-memory one) and the communicator's tuner plugin,
// if any, Simple protocol only (what the executor runs). Across hosts, the host's ranking as it is (the network's figures, which
// the ranks agreed on). Its checksum lets the ranks confirm they ranked alike.
PlanContext devicePlans(const PlanContext& host, int localRanks, bool oneHost, uint64_t* sum) {
  PlanContext ctx = host;
  for (auto& p : ctx.allowedProtocols)
    for (size_t i = 0; i < p.size(); ++i) p[i] = p[i] && i == static_cast<size_t>(Protocol::kSimple);
  if (oneHost) {
    ctx.loadTuning(algo::buildNodeModel(topo::loadLocalSystem(), localRanks, false), host.tuner);
    ctx.loadRings();
  }
  uint64_t h = ctx.digest();
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (const Ring& ring : ctx.rings)
    for (int rk : ring.order) mix(static_cast<uint64_t>(rk));
  *sum = h;
  return ctx;
}

const char* statusText(uint32_t s) {
  switch (s) {
    case LOOM_CUDA_INTERP_SIZE_MISMATCH:
      return "a peer posted a piece of another size: do all ranks call the same collectives with the "
             "same counts and datatypes?";
    case LOOM_CUDA_INTERP_REMOTE_PAYLOAD: return "a peer posted an address where data was expected";
    case LOOM_CUDA_INTERP_ABORTED: return "the kernel was stopped by the communicator's abort";
    case LOOM_CUDA_INTERP_TOO_MANY_FIFOS:
      return "a channel of its plan uses more FIFO ends than the kernel keeps (32)";
    default: return "the kernel failed";
  }
}

}  // namespace

bool deviceExecutorWanted() {
  const std::string v = kDeviceExecutor.get();
  if (v == "kernel") return true;
  if (v != "staged" && !v.empty())
    LOOM_WARN("LOOM_DEVICE_EXECUTOR=%s: expected staged or kernel; using staged", v.c_str());
  return false;
}

// A plan in device memory: the FlatPlan, then the table of the FIFO ends it uses.
struct DeviceExec::OnDevice {
  std::shared_ptr<CachedPlan> keep;   // the key stays valid
  cuda::CuDevicePtr plan = 0;         // the FlatPlan
  cuda::CuDevicePtr fifos[2] = {};    // its FIFO table: Simple's, LL's (0: not made yet)
  int nFifos = 0, channels = 0;
  size_t scratchBytes = 0;
  // Copies the next launch queues before its kernel; cleared by a launch outside a capture
  // (a graph's copies run at its replays only).
  std::vector<Upload> pending;
  // Across hosts: the FIFO steps a launch takes from each receiving end on another host
  // ((peer, conn), steps), for DeviceNet::expect.
  std::vector<std::pair<std::pair<int, int>, uint64_t>> netSteps;
};

namespace {

// The FIFO steps channel by channel a plan's launch for (count, elt) takes from each
// receiving end whose peer `remote` names: a step moves in pieces of at most a slot (one
// piece when it has no bytes), each one FIFO step (kernels/interp.h).
std::vector<std::pair<std::pair<int, int>, uint64_t>> recvSteps(const FlatPlan& plan, size_t count, size_t elt,
                                                                 size_t slotBytes, const std::vector<bool>& remote) {
  std::map<std::pair<int, int>, uint64_t> steps;
  for (size_t c = 0; c < plan.nChannels; ++c) {
    const auto seq = flatSteps(plan, c, count, elt);
    for (size_t i = 0; i < seq.size(); ++i) {
      const Step st = seq[i];
      if (!stepRecvs(st.op) || st.recvPeer < 0 || !remote[static_cast<size_t>(st.recvPeer)]) continue;
      steps[{st.recvPeer, st.conn}] += st.bytes == 0 ? 1 : (st.bytes + slotBytes - 1) / slotBytes;
    }
  }
  return {steps.begin(), steps.end()};
}

}  // namespace

std::unique_ptr<DeviceExec> DeviceExec::create(Bootstrap& bs, const std::vector<PeerInfo>& peers,
                                               const std::vector<int>& devices, const PlanContext& host,
                                               const std::vector<int>& sameContext, bool allWant) {
  if (!allWant) return nullptr;
  const int rank = bs.rank(), n = bs.nranks();
  std::string why = cannot(peers, devices, sameContext, rank);
  std::unique_ptr<DeviceExec> ex;
  uint64_t sum = 0;  // of the device plan context's ranking
  if (why.empty()) {
    const cuda::Driver& drv = *cuda::driver();
    cuda::ScopedDevice sd;
    if (sd.set(devices[rank], &why)) why = enablePeers(drv, peers, devices, rank);
    if (why.empty()) {
      std::vector<bool> same(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) same[static_cast<size_t>(r)] = sameProcess(peers[r], peers[rank]);
      try {
        const FifoShape shape{host.slotBytes, host.depth};
        std::unique_ptr<DeviceNet> net;
        if (severalHosts(peers)) net = std::make_unique<DeviceNet>(bs, drv, peers, devices[rank], shape);
        ex.reset(new DeviceExec(bs, drv, *cuda::kernels(), peers, devices[rank], shape, std::move(same),
                                std::move(net)));
        ex->slotBytes_ = host.slotBytes;
        ex->llMostBytes_ = kDeviceLLBytes.get();  // read once: every rank's communicators alike
        for (size_t c = 0; c < ex->llAllowed_.size(); ++c)
          ex->llAllowed_[c] = host.allowedProtocols[c][static_cast<size_t>(Protocol::kLL)];
        ex->ctx_ = devicePlans(host, n, !ex->net_, &sum);
      } catch (const std::exception& e) {  // every rank must reach the all-gather below
        why = e.what();
      }
    }
  }
  // The trial allocates on this rank's device: the init thread (ncclCommInitAll's, say) may
  // have no current context, and cuMemAlloc / cuMemFree need one.
  cuda::ScopedDevice trialDevice;
  if (ex && !trialDevice.set(devices[rank], &why)) ex.reset();
  cuda::CuDevicePtr trial = 0;
  if (std::string e = ipcTrial(bs, cuda::driver(), peers, ex != nullptr, &trial); !e.empty()) {
    why = e;
    ex.reset();
  }
  // Every rank can, or none runs it: their collectives then take the staged path.
  struct Outcome {
    uint64_t ok;
    uint64_t sum;
    uint64_t llBytes;  // LOOM_DEVICE_LL_BYTES: the protocol of each launch, alike on every rank
  };
  std::vector<Outcome> ok(static_cast<size_t>(n));
  ok[static_cast<size_t>(rank)] = {ex ? 1u : 0u, sum, ex ? ex->llMostBytes_ : 0};
  bs.allGather(ok.data(), sizeof(Outcome));
  if (trial) cuda::driver()->api.memFree(trial);  // every peer has closed it
  bool alike = true;
  for (int r = 0; r < n; ++r) alike &= ok[static_cast<size_t>(r)].sum == ok[0].sum;
  if (ex && !alike) {  // ranks that see their host differently would run different plans
    LOOM_INFO(kLogInit, "rank %d: the ranks model this host's GPUs differently: device plans are selected "
              "as host plans are", rank);
    ex->ctx_ = host;
  }
  for (int r = 0; r < n; ++r)
    if (!ok[static_cast<size_t>(r)].ok) {
      LOOM_INFO(kLogInit, "rank %d: no device executor (LOOM_DEVICE_EXECUTOR=kernel): rank %d cannot run it%s%s; "
                "device buffers take the staged path", rank, r, r == rank ? ": " : "", r == rank ? why.c_str() : "");
      return nullptr;
    }
  for (int r = 1; r < n; ++r)
    if (ok[static_cast<size_t>(r)].llBytes != ok[0].llBytes)
      LOOM_THROW(kInvalidUsage,
                 "LOOM_DEVICE_LL_BYTES differs between ranks: rank 0 has %llu, rank %d has %llu. Set "
                 "it alike on every rank: the device executor's ranks would pick different "
                 "protocols for one collective and wait on each other",
                 static_cast<unsigned long long>(ok[0].llBytes), r,
                 static_cast<unsigned long long>(ok[static_cast<size_t>(r)].llBytes));
  LOOM_INFO(kLogInit, "rank %d: device buffers run on the device executor (plan-interpreter kernel, device %d%s%s); "
            "device plans: %s", rank, devices[rank], ex->net_ ? "; other hosts through " : "",
            ex->net_ ? ex->net_->backendName().c_str() : "", ex->ctx_.modelNotes.c_str());
  return ex;
}

DeviceExec::DeviceExec(Bootstrap& bs, const cuda::Driver& drv, const cuda::Kernels& k, std::vector<PeerInfo> peers,
                       int device, FifoShape shape, std::vector<bool> sameProcess, std::unique_ptr<DeviceNet> net)
    : drv_(drv), kernels_(k), peers_(std::move(peers)), rank_(bs.rank()), device_(device), net_(std::move(net)) {
  try {
    check(drv_.kernel.streamCreate(&setup_, cuda::kStreamNonBlocking), "cuStreamCreate");
    check(drv_.streams.eventCreate(&last_, cuda::kEventDisableTiming), "cuEventCreate");
    check(drv_.streams.eventCreate(&join_, cuda::kEventDisableTiming), "cuEventCreate");
    void* w = nullptr;
    check(drv_.streams.memHostAlloc(&w, 64, cuda::kMemHostAllocPortable | cuda::kMemHostAllocDeviceMap),
          "cuMemHostAlloc");
    words_ = static_cast<uint32_t*>(w);
    memset(words_, 0, 64);
    check(drv_.streams.memHostGetDevicePointer(&deviceWords_, words_, 0), "cuMemHostGetDevicePointer");
    remote_.resize(peers_.size());
    for (size_t r = 0; r < peers_.size(); ++r) remote_[r] = peers_[r].hostHash != peers_[rank_].hostHash;
    fifos_ = std::make_unique<DeviceFifos>(bs, drv, device, shape, std::move(sameProcess), setup_, net_.get(),
                                           remote_);
  } catch (...) {
    if (words_) drv_.streams.memFreeHost(words_);
    throw;
  }
}

DeviceExec::~DeviceExec() {
  detach();
  cuda::ScopedDevice sd;
  std::string why;
  // Every queued kernel ends before its memory goes: an aborted one at its next wait, one
  // waiting for a peer that died once the watchdog, still running, sees it.
  const bool current = sd.set(device_, &why);
  if (current && launched_) drv_.ipc.ctxSynchronize();
  stopWatchdog();
  if (net_ && current && !stopped_.load() && __atomic_load_n(&words_[1], __ATOMIC_ACQUIRE) == 0) net_->checkCounts();
  fifos_.reset();
  net_.reset();  // its proxy stops, then its connections close
  for (cuda::CuDevicePtr p : kept_) drv_.api.memFree(p);
  if (llStaging_.p) drv_.api.memFree(llStaging_.p);
  for (cuda::CuDevicePtr p : retired_) drv_.api.memFree(p);
  if (scratch_.p) drv_.api.memFree(scratch_.p);
  for (Block& b : blocks_) {
    drv_.api.memFree(b.p);
    if (b.done && drv_.streams.eventDestroy) drv_.streams.eventDestroy(b.done);
  }
  if (join_ && drv_.streams.eventDestroy) drv_.streams.eventDestroy(join_);
  for (void* p : pinned_) drv_.streams.memFreeHost(p);
  if (words_) drv_.streams.memFreeHost(words_);
  if (last_ && drv_.streams.eventDestroy) drv_.streams.eventDestroy(last_);
  if (setup_ && drv_.kernel.streamDestroy) drv_.kernel.streamDestroy(setup_);
}

void DeviceExec::check(cuda::CuResult r, const char* what) const {
  if (r != cuda::kCudaSuccess)
    LOOM_THROW(kUnhandledCudaError, "rank %d: the device executor on device %d: %s failed: %s", rank_, device_,
               what, drv_.errorText(r).c_str());
}

// Never freed before the executor goes: cuMemFreeHost waits for the whole device, where
// another rank's kernel may be waiting for this rank. (cuMemHostAlloc does not wait.)
void* DeviceExec::pinned(size_t bytes) {
  bytes = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  if (bytes > pinLeft_) {
    const size_t n = std::max(bytes, kPinnedChunk);
    void* p = nullptr;
    check(drv_.streams.memHostAlloc(&p, n, cuda::kMemHostAllocPortable), "cuMemHostAlloc");
    pinned_.push_back(p);
    pinNext_ = static_cast<char*>(p);
    pinLeft_ = n;
  }
  void* out = pinNext_;
  pinNext_ += bytes;
  pinLeft_ -= bytes;
  return out;
}

// The plan in device memory, copied there on first use (its connections made, if a lone call
// did not prepare them).
DeviceExec::OnDevice& DeviceExec::ready(const std::shared_ptr<CachedPlan>& cp, bool ll, const Op& op) {
  auto it = plans_.find(cp.get());
  if (it == plans_.end()) {
    FlatPlanBlock flat(cp->plan);
    auto d = std::make_unique<OnDevice>();
    d->keep = cp;
    d->channels = static_cast<int>(cp->plan.channels.size());
    d->scratchBytes = cp->plan.scratchBytes;
    d->plan = deviceCopy(flat.data(), flat.bytes(), &d->pending);
    if (net_) d->netSteps = recvSteps(flat.plan(), op.count, op.eltSize, slotBytes_, remote_);
    it = plans_.emplace(cp.get(), std::move(d)).first;
  }
  OnDevice& d = *it->second;
  if (d.fifos[ll]) return d;
  const std::vector<loomCudaFifo> table = fifoTable(cp->plan, ll);
  d.nFifos = static_cast<int>(table.size());
  if (!table.empty()) d.fifos[ll] = deviceCopy(table.data(), table.size() * sizeof(loomCudaFifo), &d.pending);
  else d.fifos[ll] = d.plan;  // no ends: any valid address
  return d;
}

// The FIFO ends `plan` uses, connected (if a lone call did not prepare them), as the kernel's
// table holds them: its sends, then its receives.
std::vector<loomCudaFifo> DeviceExec::fifoTable(const Plan& plan, bool ll) const {
  std::vector<std::pair<int, int>> sends, recvs;
  plan.peers(&sends, &recvs);
  fifos_->connect(sends, recvs, ll);
  std::vector<loomCudaFifo> table;
  for (auto [p, c] : sends) table.push_back(fifos_->end(p, c, true, ll));
  for (auto [p, c] : recvs) table.push_back(fifos_->end(p, c, false, ll));
  if (table.size() > LOOM_CUDA_INTERP_MAX_TABLE)
    LOOM_THROW(kInternalError, "rank %d: a %s plan uses %zu FIFO ends; the device executor's kernel takes at most %d",
               rank_, algorithmName(plan.algo), table.size(), LOOM_CUDA_INTERP_MAX_TABLE);
  return table;
}

// A group's sends and receives in device memory: their plan and FIFO table in one block, a
// free one (its last launch ended) or a new one; during a capture, memory of their own, kept
// for the graph's life (the executor's).
void DeviceExec::readyP2p(Launch& l) {
  const Plan& plan = *l.p2pPlan;
  FlatPlanBlock flat(plan);
  const std::vector<loomCudaFifo> table = fifoTable(plan, false);
  const size_t at = (flat.bytes() + 63) / 64 * 64;
  std::vector<char> bytes(at + table.size() * sizeof(loomCudaFifo));
  memcpy(bytes.data(), flat.data(), flat.bytes());
  if (!table.empty()) memcpy(bytes.data() + at, table.data(), table.size() * sizeof(loomCudaFifo));
  auto d = std::make_shared<OnDevice>();
  d->channels = static_cast<int>(plan.channels.size());
  d->nFifos = static_cast<int>(table.size());
  if (net_) d->netSteps = recvSteps(flat.plan(), l.op->count, 1, slotBytes_, remote_);  // as launch() counts
  if (l.capture) {
    d->plan = deviceCopy(bytes.data(), bytes.size(), &d->pending);
  } else {
    // A free block that holds these very bytes (a training loop's groups repeat) needs no
    // upload; else the first free block large enough.
    Block* b = nullptr;
    bool same = false;
    for (Block& x : blocks_) {
      if (x.state == Block::kLaunched && drv_.kernel.eventQuery(x.done) == cuda::kCudaSuccess) x.state = Block::kFree;
      if (x.state != Block::kFree || x.bytes < bytes.size() || same) continue;
      if (x.valid && x.used == bytes.size() && memcmp(x.host, bytes.data(), bytes.size()) == 0) {
        b = &x;
        same = true;
      } else if (!b) {
        b = &x;
      }
    }
    if (!b) {
      Block nb;
      nb.bytes = std::max<size_t>(bytes.size(), 4096);
      nb.host = static_cast<char*>(pinned(nb.bytes));  // kept by the executor if what follows fails
      check(drv_.streams.eventCreate(&nb.done, cuda::kEventDisableTiming), "cuEventCreate");
      if (const cuda::CuResult r = drv_.api.memAlloc(&nb.p, nb.bytes); r != cuda::kCudaSuccess) {
        if (drv_.streams.eventDestroy) drv_.streams.eventDestroy(nb.done);
        check(r, "cuMemAlloc (a send/receive plan)");
      }
      blocks_.push_back(nb);
      b = &blocks_.back();
    }
    if (!same) {  // free: its last copy and kernel have run
      b->valid = false;  // until launch queues the copy
      memcpy(b->host, bytes.data(), bytes.size());
      b->used = bytes.size();
      d->pending.push_back({b->p, b->host, bytes.size()});
    }
    b->state = Block::kPrepared;
    d->plan = b->p;
    l.block = static_cast<int>(b - blocks_.data());
  }
  d->fifos[0] = table.empty() ? d->plan : d->plan + at;
  l.own = d;
  l.d = d.get();
}

// Device memory for a copy of `bytes`, kept until the executor goes; the copy is added to
// `pending`.
cuda::CuDevicePtr DeviceExec::deviceCopy(const void* src, size_t bytes, std::vector<Upload>* pending) {
  void* host = pinned(bytes);
  memcpy(host, src, bytes);
  cuda::CuDevicePtr p = 0;
  check(drv_.api.memAlloc(&p, std::max<size_t>(bytes, 1)), "cuMemAlloc");
  kept_.push_back(p);
  pending->push_back({p, host, bytes});
  return p;
}

// A buffer of at least `bytes` in `buf`: when it holds less, a new one of `alloc` bytes;
// the outgrown one is kept until the executor goes (a queued kernel may still use it).
void DeviceExec::atLeast(Growing& buf, size_t bytes, size_t alloc, const char* what) {
  if (bytes <= buf.bytes) return;
  cuda::CuDevicePtr p = 0;
  check(drv_.api.memAlloc(&p, alloc), what);
  if (buf.p) retired_.push_back(buf.p);
  buf = {p, alloc};
}

size_t DeviceExec::llStageBytes() const { return (llCapacity(slotBytes_) + 15) / 16 * 16; }

// LL for small collectives (a rule of the call's arguments and the job's knobs, alike on
// every rank): LOOM_DEVICE_LL_BYTES or less per rank (0: never, as no collective has 0
// bytes to move), where NCCL_PROTO allows LL.
bool DeviceExec::useLL(const Op& op) const {
  return !net_ && op.bytes() <= llMostBytes_ && llAllowed_[static_cast<size_t>(op.coll)];
}

void DeviceExec::setDevice(cuda::ScopedDevice& sd) const {
  std::string why;
  if (!sd.set(device_, &why))
    LOOM_THROW(kUnhandledCudaError, "rank %d: the device executor cannot make device %d current: %s", rank_, device_,
               why.c_str());
}

bool DeviceExec::capturing(const Op& op) const {
  int capture = cuda::kStreamCaptureStatusNone;
  check(drv_.streams.streamIsCapturing(op.stream, &capture), "cuStreamIsCapturing");
  return capture != cuda::kStreamCaptureStatusNone;
}

std::vector<DeviceExec::Launch> DeviceExec::prepare(std::span<const Op* const> ops) {
  std::lock_guard<std::mutex> lock(mu_);
  cuda::ScopedDevice sd;
  setDevice(sd);
  std::vector<Launch> out;
  std::vector<std::pair<int, int>> sends[2], recvs[2];
  size_t scratchBytes = 64;
  int channels = 0;  // the most of an LL plan's
  Launch p2p;  // of the sends and receives: after the collectives (as the host engine runs them)
  // A block prepared for a launch that never came (an error between) is free again: this
  // executor's prepare and launches run one call at a time.
  for (Block& b : blocks_)
    if (b.state == Block::kPrepared) b.state = Block::kFree;
  group_.clear();
  groupLast_ = nullptr;
  int groupCapture = -1;  // of the group's first stream
  for (const Op* op : ops) {
    // The group's streams are joined (launch, finishGroup): a graph cannot take some of
    // them and leave others.
    const int c = capturing(*op) ? 1 : 0;
    if (groupCapture < 0) groupCapture = c;
    LOOM_CHECK_USAGE(c == groupCapture,
                     "rank %d: a group's calls on device buffers join their streams, but stream %p is %s "
                     "captured into a CUDA graph and stream %p is %s: capture all of them or none",
                     rank_, ops[0]->stream, groupCapture ? "being" : "not being", op->stream,
                     c ? "being" : "not being");
    if (std::find(group_.begin(), group_.end(), op->stream) == group_.end()) group_.push_back(op->stream);
    if (op->isP2p()) {
      if (p2p.p2p.empty()) {
        p2p.op = op;
        p2p.capture = c != 0;
      }
      p2p.p2p.push_back(op);
      continue;
    }
    Launch l;
    l.op = op;
    l.cp = cache_.get({op->coll, op->count, op->eltSize, op->root}, ctx_);
    l.ll = useLL(*op);
    l.capture = c != 0;
    scratchBytes = std::max(scratchBytes, l.cp->plan.scratchBytes);
    if (l.ll) channels = std::max(channels, static_cast<int>(l.cp->plan.channels.size()));
    auto it = plans_.find(l.cp.get());
    if (it == plans_.end() || !it->second->fifos[l.ll]) l.cp->plan.peers(&sends[l.ll], &recvs[l.ll]);
    out.push_back(std::move(l));
  }
  if (!p2p.p2p.empty()) {
    p2p.p2pPlan = p2pPlan(rank_, p2p.p2p);
    p2p.p2pPlan->peers(&sends[0], &recvs[0]);
    out.push_back(std::move(p2p));
  }
  // Allocations and waits on the executor's own stream: legal during a capture in the
  // relaxed mode only.
  cuda::RelaxedCapture relaxed(drv_.streams, groupCapture == 1 && drv_.hasCapture);
  for (int ll = 0; ll < 2; ++ll)  // one exchange with each peer for every plan
    if (!sends[ll].empty() || !recvs[ll].empty()) fifos_->connect(sends[ll], recvs[ll], ll != 0);
  for (Launch& l : out)
    if (l.p2p.empty()) l.d = &ready(l.cp, l.ll, *l.op);
    else readyP2p(l);
  atLeast(scratch_, scratchBytes, std::max(scratchBytes, scratch_.bytes * 2), "cuMemAlloc (scratch)");
  // LL staging: two regions of llCapacity(slot), rounded to 16, per channel.
  const size_t stage = static_cast<size_t>(channels) * 2 * llStageBytes();
  atLeast(llStaging_, stage, stage, "cuMemAlloc (LL staging)");
  return out;
}

void DeviceExec::launch(const Launch& l) {
  std::lock_guard<std::mutex> lock(mu_);
  cuda::ScopedDevice sd;
  setDevice(sd);
  const Op& op = *l.op;
  OnDevice* d = l.d;
  const bool ll = l.ll, capture = l.capture;
  if (!watchdog_.joinable()) {
    comm_ = op.comm;
    watchdog_ = std::thread([this] { watch(); });
  }
  if (d->channels == 0) {  // nothing to move (sends and receives of 0 bytes)
    if (l.block >= 0) blocks_[static_cast<size_t>(l.block)].state = Block::kFree;
    return;
  }
  // The group's streams joined: its first kernel waits for what every other stream of the
  // group queued before it; each kernel for the one before (on another stream: inside a
  // capture too, where last_ does not order them); finishGroup makes every stream wait for
  // the last.
  if (!groupLast_) {
    for (cuda::CuStream s : group_)
      if (s != op.stream) {
        check(drv_.streams.eventRecord(join_, s), "cuEventRecord");
        check(drv_.streams.streamWaitEvent(op.stream, join_, 0), "cuStreamWaitEvent");
      }
  } else if (groupLast_ != op.stream) {
    check(drv_.streams.eventRecord(join_, groupLast_), "cuEventRecord");
    check(drv_.streams.streamWaitEvent(op.stream, join_, 0), "cuStreamWaitEvent");
  }
  // The last kernel of this communicator hands its FIFO counters on: the next one starts
  // after it, whatever its stream (on the same stream the wait costs nothing; a default
  // stream's handle may name another thread's stream). A captured launch is not ordered
  // against launches outside its graph: the README says so.
  if (eagerLaunched_.load(std::memory_order_relaxed) && !capture) check(drv_.streams.streamWaitEvent(op.stream, last_, 0), "cuStreamWaitEvent");
  Block* block = l.block >= 0 ? &blocks_[static_cast<size_t>(l.block)] : nullptr;
  // The plan's bytes first, on the kernel's stream (deviceCopy). Once a copy is queued, a
  // block that fails to launch is never reused (the copy may still read its mirror).
  bool copied = false;
  for (const Upload& u : d->pending) {
    if (cuda::CuResult r = drv_.streams.memcpyAsync(u.dst, reinterpret_cast<cuda::CuDevicePtr>(u.src), u.bytes,
                                                    op.stream);
        r != cuda::kCudaSuccess) {
      if (block) block->state = copied ? Block::kLost : Block::kFree;  // not valid: copied again if reused
      check(r, "cuMemcpyAsync (a plan to the device)");
    }
    copied = true;
  }
  const cuda::CuDevicePtr words = deviceWords_;
  loomCudaInterpArgs a{};
  a.plan = reinterpret_cast<const void*>(d->plan);
  const bool p2p = !l.p2p.empty();
  a.count = op.count;
  a.elt = p2p ? 1 : op.eltSize;  // a send/receive plan counts bytes, at addresses of its own
  a.sendbuf = p2p ? nullptr : op.sendbuff;
  a.recvbuf = p2p ? nullptr : op.recvbuff;
  a.scratch = reinterpret_cast<void*>(scratch_.p);
  a.fifos = reinterpret_cast<const loomCudaFifo*>(d->fifos[ll]);
  a.nFifos = d->nFifos;
  a.dtype = p2p ? 0 /* int8 */ : op.red.dtype;
  a.kind = p2p ? static_cast<int>(RedKind::kSum) : static_cast<int>(op.red.kind);
  a.scalarBits = p2p ? 0 : op.red.scalarBits;
  a.abortWord = reinterpret_cast<const uint32_t*>(words);
  a.status = reinterpret_cast<uint32_t*>(words) + 1;
  a.proto = ll ? LOOM_CUDA_INTERP_PROTO_LL : LOOM_CUDA_INTERP_PROTO_SIMPLE;
  a.llStaging = ll ? reinterpret_cast<void*>(llStaging_.p) : nullptr;
  a.llStageBytes = llStageBytes();
  if (int rc = kernels_.interpLaunch(&a, d->channels, static_cast<loomCudaStream_t>(op.stream)); rc != 0) {
    if (block) block->state = copied ? Block::kLost : Block::kFree;  // kFree: nothing queued reads it
    LOOM_THROW(kUnhandledCudaError, "rank %d: %s on device buffers: loomCudaInterpLaunch failed (CUDA error %d)",
               rank_, p2p ? "SendRecv" : collectiveName(op.coll), rc);
  }
  launched_ = true;
  if (capture) capturedLaunched_.store(true, std::memory_order_release);
  if (net_) {  // what the network must still deliver (DeviceNet::failure)
    if (capture) net_->captured();
    else
      for (const auto& [end, steps] : d->netSteps) net_->expect(end.first, end.second, steps);
  }
  if (!capture) d->pending.clear();  // a graph's copies run at its replays only
  if (block) {  // reused once this has passed; never, if it cannot be recorded
    block->valid = true;
    block->state = Block::kLost;
    check(drv_.streams.eventRecord(block->done, op.stream), "cuEventRecord");
    block->state = Block::kLaunched;
  }
  if (!capture) {
    check(drv_.streams.eventRecord(last_, op.stream), "cuEventRecord");
    eagerLaunched_.store(true, std::memory_order_release);
  }
  groupLast_ = op.stream;
  if (p2p)
    LOOM_INFO(kLogColl, "SendRecv: %zu send(s)/receive(s) on %d channel(s), by the device executor's kernel on "
              "stream %p", l.p2p.size(), d->channels, op.stream);
  else
    LOOM_INFO(kLogColl, "%s: %zu bytes per rank, %s/%s on %d channel(s), by the device executor's kernel on stream %p",
              collectiveName(op.coll), op.bytes(), algorithmName(l.cp->plan.algo), ll ? "LL" : "Simple",
              d->channels, op.stream);
}

void DeviceExec::finishGroup() {
  std::lock_guard<std::mutex> lock(mu_);
  const cuda::CuStream last = groupLast_;
  std::vector<cuda::CuStream> streams;
  streams.swap(group_);
  groupLast_ = nullptr;
  if (!last || streams.size() < 2) return;
  cuda::ScopedDevice sd;
  setDevice(sd);
  check(drv_.streams.eventRecord(join_, last), "cuEventRecord");
  for (cuda::CuStream s : streams)
    if (s != last) check(drv_.streams.streamWaitEvent(s, join_, 0), "cuStreamWaitEvent");
}

// The abort word: every kernel of this executor stops at its next look at it.
void DeviceExec::stopKernels() {
  stopped_.store(true);
  __atomic_store_n(&words_[0], 1u, __ATOMIC_RELEASE);
}

void DeviceExec::report(Code code, const std::string& what) {
  std::lock_guard<std::mutex> lock(watchMu_);
  if (reported_ || detached_) return;
  reported_ = true;
  LOOM_WARN("%s", what.c_str());
  if (comm_.onFailure) comm_.onFailure(comm_.owner, Error(code, what));
}

// Every 10 ms: the communicator's abort reaches the kernels, a kernel's failure reaches the
// communicator; every 100 ms, a peer process that exited stops them too. Once detached (the
// communicator's API object is going), only the last.
void DeviceExec::watch() {
  cuda::ScopedDevice sd;  // for cuEventQuery (inFlight)
  std::string why;
  sd.set(device_, &why);
  for (unsigned tick = 0;; ++tick) {
    bool detached;
    {
      std::unique_lock<std::mutex> lock(watchMu_);
      if (watchCv_.wait_for(lock, std::chrono::milliseconds(10), [&] { return stop_; })) return;
      detached = detached_;
    }
    if (!detached && comm_.interrupted()) stopKernels();
    poll();
    if (net_) {  // a network connection that failed under a kernel (device_net.h)
      if (std::optional<Error> e = net_->failure(inFlight())) {
        report(e->code(), strprintf("rank %d: the device executor's kernels of this communicator are stopped: %s",
                                    rank_, e->what()));
        stopKernels();
      }
    }
    if (tick % 10 != 9) continue;
    // A peer process of this host that exited: a failure only while a kernel of ours stays
    // in flight for kPeerGoneGraceSec (a peer that finished its work and left is gone before
    // our last kernels, which no longer need it, end: 16 rank processes on 2 CPUs showed
    // it). A kernel that waits on it never ends, and is stopped.
    size_t gone = peers_.size();
    for (size_t r = 0; r < peers_.size() && gone == peers_.size(); ++r) {
      const PeerInfo& p = peers_[r];
      const PeerInfo& me = peers_[rank_];
      if (static_cast<int>(r) != rank_ && p.hostHash == me.hostHash && p.pidNs == me.pidNs && p.pid != me.pid &&
          p.pid > 0 && processGone(p.pid))
        gone = r;
    }
    if (gone == peers_.size() || !inFlight()) {
      peerGoneSince_.reset();
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!peerGoneSince_) peerGoneSince_ = now;
    if (std::chrono::duration<double>(now - *peerGoneSince_).count() < kPeerGoneGraceSec) continue;
    // Reported before the kernels stop: a caller that sees its stream go on then finds the
    // error in ncclCommGetAsyncError.
    report(Code::kRemoteError, strprintf("rank %d: rank %zu (pid %d) exited while a kernel of this communicator "
                                         "waited; the device executor's kernels of this communicator are stopped",
                                         rank_, gone, peers_[gone].pid));
    stopKernels();
  }
}

// Whether a kernel of this executor may be queued or running: the last one queued outside a
// capture has not ended, or one was captured into a graph (whose replays are not known here).
bool DeviceExec::inFlight() const {
  if (eagerLaunched_.load(std::memory_order_acquire) && drv_.kernel.eventQuery(last_) != cuda::kCudaSuccess)
    return true;
  return capturedLaunched_.load(std::memory_order_acquire);
}

void DeviceExec::poll() {
  if (const uint32_t s = __atomic_load_n(&words_[1], __ATOMIC_ACQUIRE); s != 0 && s != LOOM_CUDA_INTERP_ABORTED)
    report(s == LOOM_CUDA_INTERP_SIZE_MISMATCH ? Code::kInvalidUsage : Code::kInternalError,
           strprintf("rank %d: a collective on device buffers failed in the device executor's kernel: %s", rank_,
                     statusText(s)));
}

void DeviceExec::detach() {
  std::lock_guard<std::mutex> lock(watchMu_);
  if (detached_) return;
  // An aborted communicator's kernels stop at their next wait (its destroy comes next).
  if (comm_.interrupted()) stopKernels();
  detached_ = true;
}

void DeviceExec::stopWatchdog() {
  {
    std::lock_guard<std::mutex> lock(watchMu_);
    stop_ = true;
  }
  watchCv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

}  // namespace loom
