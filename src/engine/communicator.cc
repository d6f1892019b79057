#include "engine/communicator.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/config.h"
#include "base/error.h"
#include "base/hmac.h"
#include "base/host.h"
#include "base/log.h"
#include "base/shm.h"
#include "engine/direct_moves.h"
#include "engine/interp_executor.h"
#include "engine/job_status.h"
#include "engine/knob_agreement.h"
#include "engine/metrics.h"
#include "kernels/ll.h"
#include "topo/load.h"

namespace loom {
namespace {

SizeKnob kSlotBytes("LOOM_SLOT_BYTES", "", "256K",
                    "Bytes per connection FIFO slot (one pipeline step)", KnobScope::kJob);
IntKnob kDepth("LOOM_FIFO_DEPTH", "", 8, "Slots per connection FIFO (pipeline depth)",
               KnobScope::kJob);
FifoShape fifoShape() {
  int64_t depth = kDepth.get();
  if (depth < 2 || depth > kMaxFifoDepth)
    LOOM_THROW(kInvalidArgument, "LOOM_FIFO_DEPTH=%lld: expected 2..%d",
               static_cast<long long>(depth), kMaxFifoDepth);
  uint64_t slot = kSlotBytes.get();
  if (slot < 4096 || slot > (256ull << 20) || slot % 64 != 0)
    LOOM_THROW(kInvalidArgument, "LOOM_SLOT_BYTES=%llu: expected a multiple of 64 in [4K, 256M]",
               static_cast<unsigned long long>(slot));
  return {static_cast<size_t>(slot), static_cast<int>(depth)};
}

const KnobBase* knob(const char* name) {
  const KnobBase* k = findKnob(name);
  LOOM_ASSERT(k != nullptr);
  return k;
}

// The job-wide settings (knob_agreement.h) as this rank will run them.
std::vector<JobSetting> jobSettings(FifoShape shape, uint8_t interp, const PlanContext& ctx,
                                    const JobSettingsReader& read) {
  auto bits = [](const auto& table) {
    std::string s;
    for (const auto& row : table)
      for (bool b : row) s += b ? '1' : '0';
    return s;
  };
  std::vector<JobSetting> v = {
      {knob("LOOM_ALGO"), bits(ctx.allowed)},
      {knob("LOOM_PROTO"), bits(ctx.allowedProtocols)},
      {&kSlotBytes, std::to_string(shape.slotBytes)},
      {&kDepth, std::to_string(shape.depth)},
      {knob("LOOM_EXECUTOR"), interp == Task::kCpu ? "cpu" : "interp"},
      {knob("LOOM_INTERP_PROTO"), interp == Task::kInterpLL       ? "ll"
                                  : interp == Task::kInterpSimple ? "simple"
                                                                  : ""},
  };
  // The CTA bounds as they apply (the knob's, else ncclConfig_t's), so that a rank setting
  // the variable and one setting the config to the same bound agree.
  for (const KnobBase* k : channelBoundKnobs()) {
    const bool isMin = strcmp(k->name(), "LOOM_MIN_CTAS") == 0, isMax = strcmp(k->name(), "LOOM_MAX_CTAS") == 0;
    if (!isMin && !isMax) {
      v.push_back({k, k->canonical()});
      continue;
    }
    const int bound = isMin ? ctx.minCtas : ctx.maxCtas;
    const bool fromConfig = isMin ? ctx.minCtasFromConfig : ctx.maxCtasFromConfig;
    v.push_back({k, std::to_string(bound), fromConfig ? std::to_string(bound) : "",
                 fromConfig ? (isMin ? "ncclConfig_t minCTAs" : "ncclConfig_t maxCTAs") : ""});
  }
  for (JobSetting& s : v) s = read.published(s);
  return v;
}

HostLayout hostLayout(const std::vector<PeerInfo>& peers, int rank) {
  HostLayout l;
  std::vector<uint64_t> hashes;
  for (const PeerInfo& p : peers) {
    size_t h = 0;
    while (h < hashes.size() && hashes[h] != p.hostHash) ++h;
    if (h == hashes.size()) {
      hashes.push_back(p.hostHash);
      l.hosts.emplace_back();
    }
    if (p.rank == rank) {
      l.host = static_cast<int>(h);
      l.local = static_cast<int>(l.hosts[h].size());
    }
    l.hosts[h].push_back(p.rank);
  }
  return l;
}

}  // namespace

// The cost model of the hosts, the same on every rank: each rank models its own host, and
// the ranks agree on the slowest network any of them reported. The same exchange says
// which ranks have a tuner plugin, and fails every rank alike when one's did not start.
algo::NodeModel Communicator::tuningModel(const std::optional<Error>& tunerError, bool* anyTuner) {
  const int perHost = planCtx_.layout.maxLocal();
  algo::NodeModel node = algo::buildNodeModel(topo::loadLocalSystem(), perHost, true);
  // Every rank must rank the algorithms alike, or they would run different plans: the
  // network is taken to be the slowest any rank reported (ties: the lowest rank's), the
  // only part of a host-memory model that depends on the host.
  struct Net {
    double bw;
    int rails;
    int inter;
    int tuner;  // 0: none, 1: a tuner plugin, 2: its init failed
  };
  std::vector<Net> nets(nranks_);
  nets[rank_] = {node.netBw, node.rails, static_cast<int>(node.inter),
                 tunerError ? 2 : tuner_ ? 1 : 0};
  bootstrap_->allGather(nets.data(), sizeof(Net));
  const Net* slowest = &nets[0];
  for (const Net& n : nets)
    if (n.bw < slowest->bw) slowest = &n;
  node.netBw = slowest->bw;
  node.rails = slowest->rails;
  node.inter = static_cast<algo::LinkClass>(slowest->inter);
  if (tunerError) throwError(tunerError->code(), "rank %d: %s", rank_, tunerError->what());
  *anyTuner = false;
  for (int r = 0; r < nranks_; ++r) {
    if (nets[r].tuner == 2)
      LOOM_THROW(kRemoteError, "rank %d: rank %d's NCCL tuner plugin failed to initialise (its error says why)",
                 rank_, r);
    *anyTuner |= nets[r].tuner == 1;
  }
  return node;
}

void Communicator::agreeOnRanking() {
  struct Seen {
    uint64_t digest;
    char tuner[256];  // "none" or the plugin's describe()
  };
  std::vector<Seen> all(nranks_);
  all[rank_].digest = planCtx_.digest();
  snprintf(all[rank_].tuner, sizeof(all[rank_].tuner), "%s", tuner_ ? tuner_->describe().c_str() : "none");
  bootstrap_->allGather(all.data(), sizeof(Seen));
  for (int r = 1; r < nranks_; ++r)
    if (all[r].digest != all[0].digest)
      LOOM_THROW(kInvalidUsage,
                 "rank %d: rank %d ranks the algorithms differently from rank 0 (tuner plugin: rank 0 %s, rank %d "
                 "%s): every rank must load the same NCCL tuner plugin (NCCL_TUNER_PLUGIN) and get the same "
                 "answers from it, or the ranks would run different plans",
                 rank_, r, all[0].tuner, r, all[r].tuner);
}

// A failed init (a peer died while connections were being set up) may leave behind a
// name the dead peer created and nobody mapped: sweep once our own segments are gone.
Communicator::Communicator(const JobId& job, int rank, int nranks, const std::atomic<bool>* abortFlag,
                           int configMinCtas, int configMaxCtas) try
    : rank_(rank), nranks_(nranks), abort_(abortFlag) {
  Digest d = sha256(job.secret, sizeof(job.secret));
  memcpy(&commHash_, d.data(), sizeof(commHash_));
  recorder_ = std::make_unique<FlightRecorder>(commHash_, rank, nranks,
                                               FlightRecorder::configuredCapacity());
  // The job-wide settings, read before the exchange that compares them. A malformed one is
  // raised after it, so that the peers learn which knob is wrong instead of waiting for
  // this rank until the bootstrap time-out; meanwhile the knobs' defaults stand in.
  JobSettingsReader read;
  FifoShape shape{size_t{256} << 10, 8};
  read.read({&kSlotBytes, &kDepth}, [&] { shape = fifoShape(); });
  read.read({knob("LOOM_EXECUTOR"), knob("LOOM_INTERP_PROTO")},
            [&] { interp_ = interpExecutorSelected(); });
  read.read({knob("LOOM_ALGO"), knob("LOOM_PROTO")}, [&] { planCtx_.loadAlgoFilter(); });
  read.read(channelBoundKnobs(), [&] { planCtx_.loadChannelBounds(configMinCtas, configMaxCtas); });
  const std::vector<JobSetting> settings = jobSettings(shape, interp_, planCtx_, read);
  ShmSegment::sweepDead();
  bootstrap_ = std::make_unique<Bootstrap>(job, rank, nranks, abortFlag);
  // The transports exist before the peer exchange: each publishes its own section of the
  // peer info (the TCP listener's address, ...).
  transports_ = std::make_unique<TransportManager>(*bootstrap_, shape, commHash_);
  peers_.resize(nranks);
  peers_[rank] = transports_->localInfo();
  peers_[rank].jobKnobs = jobDigest(settings);
  bootstrap_->allGather(peers_.data(), sizeof(PeerInfo));
  for (int r = 0; r < nranks; ++r)
    if (peers_[r].rank != r)
      LOOM_THROW(kInternalError, "rank %d: peer exchange returned rank %d in slot %d", rank,
                 peers_[r].rank, r);
  // NCCL_ALGO, the FIFO shape, ... alike on every rank; this rank's malformed value raised.
  checkJobSettings(*bootstrap_, peers_, settings, read.error());
  transports_->setPeers(peers_);
  // Out-of-band waits on a local peer that has died end at once instead of timing out.
  pidfds_.assign(nranks, -1);
  for (int r = 0; r < nranks; ++r)
    if (r != rank && peers_[r].hostHash == peers_[rank].hostHash &&
        peers_[r].pidNs == peers_[rank].pidNs && peers_[r].pid != getpid())
      pidfds_[r] = static_cast<int>(syscall(SYS_pidfd_open, peers_[r].pid, 0));
  bootstrap_->setLivenessCheck([this](int peer) {
    if (pidfds_[peer] < 0) return;
    pollfd p{pidfds_[peer], POLLIN, 0};
    if (::poll(&p, 1, 0) > 0)
      LOOM_THROW(kRemoteError, "rank %d: rank %d (%s pid %d) has exited", rank_, peer,
                 peers_[peer].hostname, peers_[peer].pid);
  });
  planCtx_.rank = rank;
  planCtx_.nranks = nranks;
  planCtx_.layout = hostLayout(peers_, rank);
  // Plans count on a step's pieces fitting the FIFOs: LL pieces carry half a slot.
  localDirect_ = staged::localDirect();
  planCtx_.slotBytes = interp_ == Task::kInterpLL ? llCapacity(shape.slotBytes) : shape.slotBytes;
  planCtx_.depth = shape.depth;
  // An NCCL tuner plugin, if one loads, adjusts the model's ranking.
  std::optional<Error> tunerError;
  try {
    tuner_ = TunerPlugin::open(commHash_, nranks, planCtx_.layout.nhosts(), planCtx_.layout.minLocal(),
                               planCtx_.layout.maxLocal());
  } catch (const Error& e) {
    tunerError = e;
  } catch (const std::exception& e) {  // every rank must reach the exchange below
    tunerError = Error(Code::kInternalError, strprintf("NCCL tuner plugin: %s", e.what()));
  }
  bool anyTuner = false;
  algo::NodeModel model = tuningModel(tunerError, &anyTuner);
  if (tuner_)
    LOOM_INFO(kLogInit | kLogTuning, "rank %d: tuner plugin %s ranks the algorithms", rank, tuner_->describe().c_str());
  planCtx_.loadTuning(model, tuner_.get());
  // Channel rings visit each host's ranks in a row, so they cross between hosts only once
  // per host; within a host they follow the topology search's rings.
  planCtx_.loadRings();
  if (anyTuner) agreeOnRanking();
  oversubscribed_ = localRanks() > hostCpus();
  if (nranks > 1) connect({{ring().next(), 0}}, {{ring().prev(), 0}});
  startMetricsExporter(planCtx_.layout.local);
  bootstrap_->setStatusSource([this](uint64_t detail) { return statusPayload(*this, detail); });
  publishStatusAddress(*this);
} catch (...) {
  ShmSegment::sweepDead();
}

Communicator::~Communicator() {
  if (bootstrap_) {
    bootstrap_->setStatusSource(nullptr);  // status queries stop reaching this object
    unpublishStatusAddress(*this);
  }
  stopStaged();
  deviceExec_.reset();  // its kernels end before the FIFOs they use go
  executor_.reset();  // its worker may still be running tasks over the transports
  transports_.reset();
  for (int fd : pidfds_)
    if (fd >= 0) ::close(fd);
  // A peer killed while connecting may have left a name behind; we may be the last local
  // process of the job to notice.
  ShmSegment::sweepDead();
}

StagedProxy& Communicator::staged() {
  if (StagedProxy* p = staged_.load(std::memory_order_acquire)) return *p;
  std::lock_guard<std::mutex> lock(stagedMu_);
  if (!staged_.load()) staged_.store(new StagedProxy(abort_), std::memory_order_release);
  return *staged_.load();
}

int Communicator::localRanks() const {
  int n = 0;
  for (const auto& p : peers_) n += p.hostHash == peers_[rank_].hostHash;
  return n;
}

void Communicator::connect(const std::vector<TransportManager::ConnKey>& sends,
                           const std::vector<TransportManager::ConnKey>& recvs) {
  transports_->connect(sends, recvs);
}

void* Communicator::scratch(size_t bytes) {
  if (bytes > scratchBytes_) {
    scratch_.reset();  // the old buffer goes first: both at once could exhaust memory
    scratchBytes_ = 0;
    scratch_.reset(new char[bytes]);  // left uninitialized: plans write before they read
    scratchBytes_ = bytes;
  }
  return scratch_.get();
}

std::string Communicator::initSummary() const {
  return strprintf("rank %d nranks %d host %s pid %d localRanks %d transports [%s]%s", rank_,
                   nranks_, peers_[rank_].hostname, peers_[rank_].pid, localRanks(),
                   transports_->summary().c_str(),
                   interp_ == Task::kInterpLL       ? " executor interp/LL (LOOM_EXECUTOR)"
                   : interp_ == Task::kInterpSimple ? " executor interp (LOOM_EXECUTOR)"
                                                    : "");
}

}  // namespace loom
