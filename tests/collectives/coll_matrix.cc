#include "collectives/coll_matrix.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "algo/select.h"
#include "api/comm.h"
#include "collectives/coll_buffers.h"

namespace colltest {

const char* collName(Coll c) {
  static const char* const kNames[] = {"allreduce",     "broadcast", "reduce",
                                       "allgather",     "reducescatter", "alltoall",
                                       "gather",        "scatter",   "sendrecv"};
  return kNames[static_cast<int>(c)];
}

bool isReduction(Coll c) {
  return c == Coll::kAllReduce || c == Coll::kReduce || c == Coll::kReduceScatter;
}

const char* algoName(Algo a) {
  static const char* const kNames[] = {"default", "ring", "tree", "hd", "direct"};
  return kNames[static_cast<int>(a)];
}

std::string configName(const MatrixConfig& cfg) {
  return std::string(loomtest::modeName(cfg.mode)) + "_" + std::to_string(cfg.nranks) + "_" +
         algoName(cfg.algo) + (cfg.socket ? "_socket" : "") +
         (*cfg.cma ? std::string("_cma") + cfg.cma : "") + (*cfg.streamMin ? "_stream" : "");
}

std::string describe(const Case& c, int nranks, Algo algo, int rank) {
  char buf[256];
  int n = snprintf(buf, sizeof(buf), "%s %s", collName(c.coll), typeName(c.type));
  if (isReduction(c.coll)) n += snprintf(buf + n, sizeof(buf) - n, " %s", opName(c.op));
  n += snprintf(buf + n, sizeof(buf) - n, " %s count=%zu", c.inPlace ? "in-place" : "out-of-place",
                c.count);
  if (c.coll == Coll::kSendRecv) n += snprintf(buf + n, sizeof(buf) - n, " shift=%d", c.root);
  else if (c.coll == Coll::kBroadcast || c.coll == Coll::kReduce || c.coll == Coll::kGather ||
           c.coll == Coll::kScatter)
    n += snprintf(buf + n, sizeof(buf) - n, " root=%d", c.root);
  snprintf(buf + n, sizeof(buf) - n, " nranks=%d algo=%s rank=%d", nranks, algoName(algo), rank);
  return buf;
}

size_t largeCount(ncclDataType_t t) {
  size_t sz = typeSize(t);
  return sz == 4 ? 600000 : 2400000 / sz + 1;
}

// The count above the staging buffers is the matrix's most expensive: all-reduce runs it
// for float32 with every op and for two other widths with two ops; the other
// collectives for float32 (the reductions with two ops).
bool runsLarge(Coll coll, ncclDataType_t t, Op op) {
  if (coll == Coll::kAllReduce) {
    if (t == ncclFloat32) return true;
    if (t == ncclBfloat16) return op == Op::kSum || op == Op::kAvg;
    return t == ncclInt8 && (op == Op::kSum || op == Op::kMin);
  }
  return t == ncclFloat32 && (op == Op::kNone || op == Op::kSum || op == Op::kAvg);
}

std::vector<Case> buildCases(const MatrixConfig& cfg) {
  std::vector<Coll> colls;
  if (cfg.algo == Algo::kDefault)
    colls = {Coll::kBroadcast, Coll::kReduce, Coll::kAllGather, Coll::kReduceScatter,
             Coll::kAlltoAll,  Coll::kGather, Coll::kScatter,   Coll::kSendRecv,
             Coll::kAllReduce};
  else
    colls = {Coll::kAllReduce};
  std::vector<ncclDataType_t> types(std::begin(kTypes), std::end(kTypes));
  if (!cfg.allTypes) types = {ncclFloat32, ncclBfloat16, ncclInt8};
  const Op kReduceOps[] = {Op::kSum, Op::kProd, Op::kMax, Op::kMin, Op::kAvg, Op::kPreMulSum};

  std::vector<Case> cases;
  int idx = 0, rooted = 0;
  for (Coll coll : colls)
    for (ncclDataType_t t : types) {
      std::vector<Op> ops = {Op::kNone};
      // Under the size rule all-reduce is here for the selection, not the arithmetic.
      if (isReduction(coll)) ops.assign(std::begin(kReduceOps), std::end(kReduceOps));
      if (coll == Coll::kAllReduce && cfg.algo == Algo::kDefault) ops = {Op::kSum};
      // NCCL defines no in-place all-to-all or send/recv.
      std::vector<bool> places = {false, true};
      if (coll == Coll::kAlltoAll || coll == Coll::kSendRecv) places = {false};
      for (Op op : ops)
        for (bool inPlace : places)
          for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, kMidCount, largeCount(t)}) {
            if (count == largeCount(t) && !runsLarge(coll, t, op)) continue;
            Case c{coll, t, op, inPlace, count, 0, fmix64(0x51ed270b + idx), idx};
            if (coll == Coll::kSendRecv) c.root = cfg.nranks > 1 ? 1 + idx % (cfg.nranks - 1) : 0;
            else c.root = rooted++ % cfg.nranks;
            cases.push_back(c);
            ++idx;
          }
    }
  return cases;
}

namespace {

// One case on one rank. An NCCL error sets `fatal`: the ranks are out of step after it.
class CaseRunner {
 public:
  // `check` false: no output is compared with the reference (a run whose digests are
  // compared with a checked run's instead); `hash`: digest() is wanted.
  CaseRunner(int rank, int nranks, ncclComm_t comm, const Case& c, bool check, bool hash)
      : rank_(rank), n_(nranks), comm_(comm), c_(c), t_(c.type), sz_(typeSize(c.type)),
        check_(check), hash_(hash) {}

  std::string run();
  bool fatal() const { return fatal_; }
  // A hash of every byte of the case's buffers on this rank after the call, guards
  // included (0: the case ended early).
  uint64_t digest() const { return digest_; }

 private:
  std::string allReduce();
  std::string broadcast();
  std::string reduce();
  std::string allGather();
  std::string reduceScatter();
  std::string alltoAll();
  std::string gather();
  std::string scatter();
  std::string sendRecv();

  // Records an NCCL failure; returns its message.
  std::string nccl(ncclResult_t r, const char* call) {
    if (r == ncclSuccess) return "";
    fatal_ = true;
    return std::string(call) + " returned " + ncclGetErrorString(r) + ": " +
           ncclGetLastError(comm_);
  }
  GuardedBuffer buffer(size_t elems) {
    return GuardedBuffer(elems * sz_, 64 + sz_ * (c_.variant % 4));
  }
  static std::vector<uint8_t> snapshot(const GuardedBuffer& b) {
    return std::vector<uint8_t>(b.data(), b.data() + b.bytes());
  }
  // The op to pass for this case: built in, or a PreMulSum created for the call.
  std::string makeOp(const ReduceInputs& in);
  std::string dropOp();
  std::string finish(std::initializer_list<std::pair<const GuardedBuffer*, const char*>> bufs);

  int rank_, n_;
  ncclComm_t comm_;
  const Case& c_;
  ncclDataType_t t_;
  size_t sz_;
  ncclRedOp_t op_ = ncclSum;
  bool userOp_ = false;
  bool check_;
  bool hash_;
  bool fatal_ = false;
  uint64_t digest_ = 0;
};

#define TRY(expr)                 \
  do {                            \
    std::string e_ = (expr);      \
    if (!e_.empty()) return e_;   \
  } while (0)
#define NCCL(call) TRY(nccl((call), #call))
// A comparison with the reference, made when the runner checks.
#define CHECK(expr)            \
  do {                         \
    if (check_) TRY(expr);     \
  } while (0)

std::string CaseRunner::run() {
  switch (c_.coll) {
    case Coll::kAllReduce: return allReduce();
    case Coll::kBroadcast: return broadcast();
    case Coll::kReduce: return reduce();
    case Coll::kAllGather: return allGather();
    case Coll::kReduceScatter: return reduceScatter();
    case Coll::kAlltoAll: return alltoAll();
    case Coll::kGather: return gather();
    case Coll::kScatter: return scatter();
    case Coll::kSendRecv: return sendRecv();
  }
  return "unknown collective";
}

std::string CaseRunner::makeOp(const ReduceInputs& in) {
  userOp_ = c_.op == Op::kPreMulSum;
  if (!userOp_) {
    op_ = builtinOp(c_.op);
    return "";
  }
  uint64_t scalar = in.scalarBits();  // little-endian: the element is at its start
  return nccl(ncclRedOpCreatePreMulSum(&op_, &scalar, t_, ncclScalarHostImmediate, comm_),
              "ncclRedOpCreatePreMulSum");
}

std::string CaseRunner::dropOp() {
  if (!userOp_) return "";
  userOp_ = false;
  return nccl(ncclRedOpDestroy(op_, comm_), "ncclRedOpDestroy");
}

// The end of every case: the digest of all its buffers if wanted; when checking, every buffer's
// guards (the first broken one is reported).
std::string CaseRunner::finish(
    std::initializer_list<std::pair<const GuardedBuffer*, const char*>> bufs) {
  if (hash_) {
    uint64_t h = 0;
    for (auto& [b, name] : bufs) h = fmix64(h ^ b->hash());
    digest_ = h | 1;
  }
  for (auto& [b, name] : bufs) CHECK(b->checkGuards(name));
  return "";
}

std::string CaseRunner::allReduce() {
  const size_t n = c_.count;
  ReduceInputs in(t_, c_.op, c_.seed);
  GuardedBuffer send = buffer(n), recv = buffer(n);
  in.fill(rank_, 0, n, send.data());
  auto orig = snapshot(send);
  uint8_t* out = c_.inPlace ? send.data() : recv.data();
  TRY(makeOp(in));
  NCCL(ncclAllReduce(send.data(), out, n, t_, op_, comm_, nullptr));
  TRY(dropOp());
  // Every rank must hold the same bytes (the hashes show it), so each checks only its
  // share of blocks against the reference: every element is still checked by some rank.
  // A rank whose bytes differ checks all of its own, to say where it is wrong.
  std::vector<uint64_t> hashes(n_);
  const uint64_t mine = hashBytes(out, n * sz_);
  NCCL(ncclAllGather(&mine, hashes.data(), 1, ncclUint64, comm_, nullptr));
  int odd = -1;
  for (int r = 0; r < n_; ++r)
    if (hashes[r] != mine) odd = r;
  if (odd >= 0) {
    CHECK(checkReduced("recvbuff", t_, out, n, in, n_, 0));
    return GuardedBuffer::fmt("recvbuff holds different bytes on rank %d than on this rank, "
                              "though both are within tolerance of the reference", odd);
  }
  constexpr size_t kBlock = 4096;
  for (size_t b = rank_ * kBlock; b < n; b += n_ * kBlock)
    CHECK(checkReduced("recvbuff", t_, out + b * sz_, std::min(kBlock, n - b), in, n_, b, b));
  if (!c_.inPlace) CHECK(checkUnchanged("sendbuff", t_, send.data(), orig.data(), send.bytes()));
  else CHECK(checkPoison("unused recvbuff", t_, recv.data(), recv.bytes()));
  return finish({{&send, "sendbuff"}, {&recv, "recvbuff"}});
}

std::string CaseRunner::broadcast() {
  const size_t n = c_.count;
  const int root = c_.root;
  RawInputs in(t_, c_.seed);
  GuardedBuffer send = buffer(n), recv = buffer(n);
  if (c_.inPlace) {
    if (rank_ == root) in.fill(root, 0, n, send.data());
    if (c_.variant % 2) NCCL(ncclBcast(send.data(), n, t_, root, comm_, nullptr));
    else NCCL(ncclBroadcast(send.data(), send.data(), n, t_, root, comm_, nullptr));
    CHECK(checkBits("buff", t_, send.data(), n, [&](size_t j) { return in.bits(root, j); }));
    CHECK(checkPoison("unused recvbuff", t_, recv.data(), recv.bytes()));
  } else {
    // A non-root's sendbuff is ignored: NULL, or a decoy that must not reach anyone.
    in.fill(rank_, 0, n, send.data());
    auto orig = snapshot(send);
    const void* sendp = rank_ != root && c_.variant % 2 ? nullptr : send.data();
    NCCL(ncclBroadcast(sendp, recv.data(), n, t_, root, comm_, nullptr));
    CHECK(checkBits("recvbuff", t_, recv.data(), n, [&](size_t j) { return in.bits(root, j); }));
    CHECK(checkUnchanged("sendbuff", t_, send.data(), orig.data(), send.bytes()));
  }
  return finish({{&send, "sendbuff"}, {&recv, "recvbuff"}});
}

std::string CaseRunner::reduce() {
  const size_t n = c_.count;
  const int root = c_.root;
  ReduceInputs in(t_, c_.op, c_.seed);
  GuardedBuffer send = buffer(n), recv = buffer(n);
  in.fill(rank_, 0, n, send.data());
  auto orig = snapshot(send);
  TRY(makeOp(in));
  if (c_.inPlace) {
    NCCL(ncclReduce(send.data(), send.data(), n, t_, op_, root, comm_, nullptr));
    TRY(dropOp());
    if (rank_ == root)
      CHECK(checkReduced("buff (root)", t_, send.data(), n, in, n_, 0));
    else
      CHECK(checkUnchanged("buff (non-root)", t_, send.data(), orig.data(), send.bytes()));
  } else {
    // recvbuff is only used on the root: a non-root passes NULL, or a buffer left alone.
    void* recvp = rank_ != root && c_.variant % 2 ? nullptr : recv.data();
    NCCL(ncclReduce(send.data(), recvp, n, t_, op_, root, comm_, nullptr));
    TRY(dropOp());
    if (rank_ == root)
      CHECK(checkReduced("recvbuff", t_, recv.data(), n, in, n_, 0));
    else
      CHECK(checkPoison("recvbuff (non-root)", t_, recv.data(), recv.bytes()));
    CHECK(checkUnchanged("sendbuff", t_, send.data(), orig.data(), send.bytes()));
  }
  return finish({{&send, "sendbuff"}, {&recv, "recvbuff"}});
}

std::string CaseRunner::allGather() {
  const size_t n = c_.count;
  RawInputs in(t_, c_.seed);
  auto want = [&](int r, size_t j) { return in.bits(r, j); };
  GuardedBuffer recv = buffer(n * n_);
  if (c_.inPlace) {
    in.fill(rank_, 0, n, recv.data() + rank_ * n * sz_);
    NCCL(ncclAllGather(recv.data() + rank_ * n * sz_, recv.data(), n, t_, comm_, nullptr));
    CHECK(checkBlocks("recvbuff", t_, recv.data(), n, n_, want));
    return finish({{&recv, "recvbuff"}});
  }
  GuardedBuffer send = buffer(n);
  in.fill(rank_, 0, n, send.data());
  auto orig = snapshot(send);
  NCCL(ncclAllGather(send.data(), recv.data(), n, t_, comm_, nullptr));
  CHECK(checkBlocks("recvbuff", t_, recv.data(), n, n_, want));
  CHECK(checkUnchanged("sendbuff", t_, send.data(), orig.data(), send.bytes()));
  return finish({{&send, "sendbuff"}, {&recv, "recvbuff"}});
}

std::string CaseRunner::reduceScatter() {
  const size_t n = c_.count;
  ReduceInputs in(t_, c_.op, c_.seed);
  GuardedBuffer send = buffer(n * n_);
  in.fill(rank_, 0, n * n_, send.data());
  auto orig = snapshot(send);
  TRY(makeOp(in));
  if (c_.inPlace) {
    uint8_t* out = send.data() + rank_ * n * sz_;
    NCCL(ncclReduceScatter(send.data(), out, n, t_, op_, comm_, nullptr));
    TRY(dropOp());
    CHECK(checkReduced("recvbuff", t_, out, n, in, n_, rank_ * n));
    // The other ranks' blocks are input only.
    CHECK(checkUnchanged("sendbuff before recvbuff", t_, send.data(), orig.data(), rank_ * n * sz_));
    size_t after = (rank_ + 1) * n * sz_;
    CHECK(checkUnchanged("sendbuff after recvbuff", t_, send.data() + after, orig.data() + after,
                       send.bytes() - after));
    return finish({{&send, "sendbuff"}});
  }
  GuardedBuffer recv = buffer(n);
  NCCL(ncclReduceScatter(send.data(), recv.data(), n, t_, op_, comm_, nullptr));
  TRY(dropOp());
  CHECK(checkReduced("recvbuff", t_, recv.data(), n, in, n_, rank_ * n));
  CHECK(checkUnchanged("sendbuff", t_, send.data(), orig.data(), send.bytes()));
  return finish({{&send, "sendbuff"}, {&recv, "recvbuff"}});
}

std::string CaseRunner::alltoAll() {
  const size_t n = c_.count;
  RawInputs in(t_, c_.seed);
  GuardedBuffer send = buffer(n * n_), recv = buffer(n * n_);
  in.fill(rank_, 0, n * n_, send.data());
  auto orig = snapshot(send);
  NCCL(ncclAlltoAll(send.data(), recv.data(), n, t_, comm_, nullptr));
  // Block p of my recvbuff is block `rank` of p's sendbuff.
  CHECK(checkBlocks("recvbuff", t_, recv.data(), n, n_,
                  [&](int p, size_t j) { return in.bits(p, rank_ * n + j); }));
  CHECK(checkUnchanged("sendbuff", t_, send.data(), orig.data(), send.bytes()));
  return finish({{&send, "sendbuff"}, {&recv, "recvbuff"}});
}

std::string CaseRunner::gather() {
  const size_t n = c_.count;
  const int root = c_.root;
  RawInputs in(t_, c_.seed);
  auto want = [&](int r, size_t j) { return in.bits(r, j); };
  GuardedBuffer recv = buffer(n * n_);
  if (c_.inPlace) {
    // Every rank's block sits at its offset of an n*nranks buffer; only the root's is
    // the gather's output, the others must stay as they are.
    in.fill(rank_, 0, n, recv.data() + rank_ * n * sz_);
    auto orig = snapshot(recv);
    NCCL(ncclGather(recv.data() + rank_ * n * sz_, recv.data(), n, t_, root, comm_, nullptr));
    if (rank_ == root) CHECK(checkBlocks("recvbuff (root)", t_, recv.data(), n, n_, want));
    else CHECK(checkUnchanged("buffer (non-root)", t_, recv.data(), orig.data(), recv.bytes()));
    return finish({{&recv, "recvbuff"}});
  }
  GuardedBuffer send = buffer(n);
  in.fill(rank_, 0, n, send.data());
  auto orig = snapshot(send);
  void* recvp = rank_ != root && c_.variant % 2 ? nullptr : recv.data();
  NCCL(ncclGather(send.data(), recvp, n, t_, root, comm_, nullptr));
  if (rank_ == root) CHECK(checkBlocks("recvbuff (root)", t_, recv.data(), n, n_, want));
  else CHECK(checkPoison("recvbuff (non-root)", t_, recv.data(), recv.bytes()));
  CHECK(checkUnchanged("sendbuff", t_, send.data(), orig.data(), send.bytes()));
  return finish({{&send, "sendbuff"}, {&recv, "recvbuff"}});
}

std::string CaseRunner::scatter() {
  const size_t n = c_.count;
  const int root = c_.root;
  RawInputs in(t_, c_.seed);
  auto want = [&](size_t j) { return in.bits(root, rank_ * n + j); };
  GuardedBuffer send = buffer(n * n_);
  if (c_.inPlace) {
    if (rank_ == root) in.fill(root, 0, n * n_, send.data());
    auto orig = snapshot(send);
    uint8_t* out = send.data() + rank_ * n * sz_;
    NCCL(ncclScatter(send.data(), out, n, t_, root, comm_, nullptr));
    CHECK(checkBits("recvbuff", t_, out, n, want));
    // Outside its own block a rank's buffer is either the root's input or not in play.
    CHECK(checkUnchanged("sendbuff before recvbuff", t_, send.data(), orig.data(), rank_ * n * sz_));
    size_t after = (rank_ + 1) * n * sz_;
    CHECK(checkUnchanged("sendbuff after recvbuff", t_, send.data() + after, orig.data() + after,
                       send.bytes() - after));
    return finish({{&send, "sendbuff"}});
  }
  // A non-root's sendbuff is ignored: NULL, or a decoy that must not reach anyone.
  in.fill(rank_, 0, n * n_, send.data());
  auto orig = snapshot(send);
  GuardedBuffer recv = buffer(n);
  const void* sendp = rank_ != root && c_.variant % 2 ? nullptr : send.data();
  NCCL(ncclScatter(sendp, recv.data(), n, t_, root, comm_, nullptr));
  CHECK(checkBits("recvbuff", t_, recv.data(), n, want));
  CHECK(checkUnchanged("sendbuff", t_, send.data(), orig.data(), send.bytes()));
  return finish({{&send, "sendbuff"}, {&recv, "recvbuff"}});
}

std::string CaseRunner::sendRecv() {
  // One group: a message to rank+shift and one from rank-shift, and one to itself.
  const size_t n = c_.count;
  const int to = (rank_ + c_.root) % n_, from = (rank_ - c_.root + n_) % n_;
  RawInputs peerIn(t_, c_.seed), selfIn(t_, c_.seed ^ 0x5e1f);
  GuardedBuffer sendP = buffer(n), recvP = buffer(n), sendS = buffer(n), recvS = buffer(n);
  peerIn.fill(rank_, 0, n, sendP.data());
  selfIn.fill(rank_, 0, n, sendS.data());
  auto origP = snapshot(sendP), origS = snapshot(sendS);
  NCCL(ncclGroupStart());
  std::string err;
  auto call = [&](ncclResult_t r, const char* what) {
    if (err.empty()) err = nccl(r, what);
  };
  if (c_.variant % 2) {  // receives first: the order inside a group must not matter
    call(ncclRecv(recvP.data(), n, t_, from, comm_, nullptr), "ncclRecv(peer)");
    call(ncclRecv(recvS.data(), n, t_, rank_, comm_, nullptr), "ncclRecv(self)");
  }
  call(ncclSend(sendP.data(), n, t_, to, comm_, nullptr), "ncclSend(peer)");
  call(ncclSend(sendS.data(), n, t_, rank_, comm_, nullptr), "ncclSend(self)");
  if (c_.variant % 2 == 0) {
    call(ncclRecv(recvP.data(), n, t_, from, comm_, nullptr), "ncclRecv(peer)");
    call(ncclRecv(recvS.data(), n, t_, rank_, comm_, nullptr), "ncclRecv(self)");
  }
  call(ncclGroupEnd(), "ncclGroupEnd");
  TRY(err);
  CHECK(checkBits("recvbuff from peer", t_, recvP.data(), n,
                [&](size_t j) { return peerIn.bits(from, j); }));
  CHECK(checkBits("recvbuff from self", t_, recvS.data(), n,
                [&](size_t j) { return selfIn.bits(rank_, j); }));
  CHECK(checkUnchanged("sendbuff to peer", t_, sendP.data(), origP.data(), sendP.bytes()));
  CHECK(checkUnchanged("sendbuff to self", t_, sendS.data(), origS.data(), sendS.bytes()));
  return finish({{&sendP, "sendbuff to peer"}, {&recvP, "recvbuff from peer"},
                 {&sendS, "sendbuff to self"}, {&recvS, "recvbuff from self"}});
}

std::optional<loom::Algorithm> forcedAlgorithm(Algo a) {
  switch (a) {
    case Algo::kRing: return loom::Algorithm::kRing;
    case Algo::kTree: return loom::Algorithm::kTree;
    case Algo::kHalvingDoubling: return loom::Algorithm::kHalvingDoubling;
    case Algo::kDirect: return loom::Algorithm::kDirect;
    default: return std::nullopt;
  }
}

// Under a forced algorithm, the communicator must pick it whenever it can serve the
// call: otherwise the matrix would silently test another algorithm.
std::string checkSelection(ncclComm_t comm, Algo algo, const Case& c) {
  auto forced = forcedAlgorithm(algo);
  if (!forced || c.coll != Coll::kAllReduce || c.count == 0 || comm->nranks == 1) return "";
  loom::CollRequest req{loom::Collective::kAllReduce, c.count, typeSize(c.type), 0};
  const loom::PlanContext& ctx = comm->core->planContext();
  loom::Algorithm got = loom::selectAlgorithm(req, ctx);
  if (loom::canServe(*forced, req, ctx) && got != *forced)
    return std::string("the communicator selects ") + loom::algorithmName(got) +
           ", not the forced " + loom::algorithmName(*forced);
  return "";
}

}  // namespace

std::string runCases(int rank, int nranks, ncclComm_t comm, Algo algo,
                     const std::vector<Case>& cases, std::vector<uint64_t>* digests, bool check) {
  if (digests) digests->assign(cases.size(), 0);
  constexpr size_t kShown = 6;
  const bool profile = getenv("COLLTEST_PROFILE") != nullptr;  // per-case times on stderr
  std::vector<std::string> shown;
  size_t failed = 0;
  for (const Case& c : cases) {
    std::string err = checkSelection(comm, algo, c);
    CaseRunner runner(rank, nranks, comm, c, check, digests != nullptr);
    auto t0 = std::chrono::steady_clock::now();
    if (err.empty()) err = runner.run();
    if (digests) (*digests)[&c - cases.data()] = runner.digest();
    if (profile && rank == 0) {
      std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - t0;
      fprintf(stderr, "PROFILE %.3f ms %s\n", ms.count(), describe(c, nranks, algo, rank).c_str());
    }
    if (!err.empty()) {
      ++failed;
      if (shown.size() < kShown) shown.push_back(describe(c, nranks, algo, rank) + ": " + err);
    }
    if (runner.fatal()) {
      shown.push_back("stopped after this NCCL error (the ranks are out of step)");
      break;
    }
  }
  std::string out;
  for (const auto& s : shown) out += "\n  " + s;
  if (failed > kShown)
    out += "\n  ... and " + std::to_string(failed - kShown) + " more failing cases";
  if (failed)
    out = std::to_string(failed) + " of " + std::to_string(cases.size()) + " cases failed:" + out;
  return out;
}

}  // namespace colltest
