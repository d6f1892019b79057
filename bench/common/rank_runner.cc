#include "bench/common/rank_runner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bench/common/report.h"

namespace loom::bench {

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, std::max<size_t>(bytes, 64)) != 0)
    benchFail(Status::kInternalError, "cannot allocate %zu bytes of host memory", bytes);
  data_ = static_cast<char*>(p);
}

HostBuffer::~HostBuffer() { free(data_); }

RankRunner::RankRunner(BenchProcess& proc, int thread, ncclComm_t comm, ncclComm_t ctl)
    : proc_(proc),
      o_(proc.opts()),
      coll_(proc.coll()),
      thread_(thread),
      worldRank_(proc.rankOf(thread)),
      worldRanks_(proc.nranks()),
      comm_(comm),
      ctl_(ctl) {
  BENCH_NCCL(ncclCommUserRank(comm_, &rank_), comm_);
  BENCH_NCCL(ncclCommCount(comm_, &nranks_), comm_);
  // nccl-tests pads by the widest element so -u can shift any type.
  bufBytes_ = proc_.maxBytes() + 8 * static_cast<size_t>(o_.unalign);
  if (const CudaDriver* cuda = proc_.cuda()) {
    cuda->makeCurrent(proc_.deviceOf(thread_));
    const bool windows = o_.localRegister == 2;  // from ncclMemAlloc, as nccl-tests'
    sendDev_ = std::make_unique<DeviceBuffer>(*cuda, bufBytes_, windows);
    recvDev_ = std::make_unique<DeviceBuffer>(*cuda, bufBytes_, windows);
    sendBase_ = sendDev_->mirror();
    recvBase_ = recvDev_->mirror();
    if (!o_.streamNull) stream_ = cuda->createStream();
  } else {
    sendBuf_ = std::make_unique<HostBuffer>(bufBytes_);
    recvBuf_ = std::make_unique<HostBuffer>(bufBytes_);
    sendBase_ = sendBuf_->data();
    recvBase_ = recvBuf_->data();
  }
  send_ = sendBase_;
  recv_ = recvBase_;
}

RankRunner::~RankRunner() {
  deregisterBuffers();
  if (const CudaDriver* cuda = proc_.cuda()) {
    syncStream();
    cuda->destroyStream(stream_);
  }
}

void* RankRunner::onDevice(void* p) const {
  if (!sendDev_) return p;
  char* c = static_cast<char*>(p);
  if (c >= sendBase_ && c < sendBase_ + bufBytes_) return sendDev_->onDevice(c);
  return recvDev_->onDevice(c);
}

// What a checked call reads and writes: the send buffer's first sendBytes_, and the
// receive buffer's first max(send, receive) bytes (in-place inputs live there too).
void RankRunner::upload() const {
  if (!sendDev_) return;
  sendDev_->upload(send_, sendBytes_);
  recvDev_->upload(recv_, std::max(sendBytes_, recvBytes_));
}

void RankRunner::download() const {
  if (!sendDev_) return;
  syncStream();
  recvDev_->download(recv_, std::max(sendBytes_, recvBytes_));
}

void RankRunner::syncStream() const {
  if (const CudaDriver* cuda = proc_.cuda()) cuda->sync(stream_);
}

// -R 1: ncclCommRegister; -R 2 (device buffers): symmetric windows, as nccl-tests registers
// them (each rank's, in a group). Registration is an optimisation: where it fails, the run
// goes on without, saying why.
void RankRunner::registerBuffers() {
  if (!o_.localRegister) return;
  ncclResult_t a, b;
  const char* call = "ncclCommRegister";
  if (o_.localRegister == 2 && sendDev_) {
    call = "ncclCommWindowRegister";
    ncclGroupStart();
    a = ncclCommWindowRegister(comm_, onDevice(sendBase_), bufBytes_, &sendWin_,
                               NCCL_WIN_COLL_SYMMETRIC);
    b = ncclCommWindowRegister(comm_, onDevice(recvBase_), bufBytes_, &recvWin_,
                               NCCL_WIN_COLL_SYMMETRIC);
    if (ncclResult_t e = ncclGroupEnd(); a == ncclSuccess && b == ncclSuccess) a = e;
  } else {
    a = ncclCommRegister(comm_, onDevice(send_), proc_.maxBytes(), &sendHandle_);
    b = ncclCommRegister(comm_, onDevice(recv_), proc_.maxBytes(), &recvHandle_);
  }
  if (a != ncclSuccess || b != ncclSuccess) {
    proc_.print(thread_, formatString("# -R %d: %s failed (%s: %s); running without "
                                      "registration\n",
                                      o_.localRegister, call,
                                      ncclGetErrorString(a != ncclSuccess ? a : b),
                                      ncclGetLastError(comm_)));
    deregisterBuffers();
  }
}

void RankRunner::deregisterBuffers() {
  if (sendHandle_) ncclCommDeregister(comm_, sendHandle_);
  if (recvHandle_) ncclCommDeregister(comm_, recvHandle_);
  if (sendWin_) ncclCommWindowDeregister(comm_, sendWin_);
  if (recvWin_) ncclCommWindowDeregister(comm_, recvWin_);
  sendHandle_ = recvHandle_ = nullptr;
  sendWin_ = recvWin_ = nullptr;
}

void RankRunner::barrier() {
  Watchdog::Busy busy(proc_.watchdog(), thread_);
  int32_t one = 1, all = 0;
  BENCH_NCCL(ncclAllReduce(&one, &all, 1, ncclInt32, ncclSum, ctl_, nullptr), ctl_);
  if (all != worldRanks_)
    benchFail(Status::kInternalError, "barrier all-reduce returned %d instead of %d ranks", all,
              worldRanks_);
}

double RankRunner::reduceScalar(double v, int mode) {
  Watchdog::Busy busy(proc_.watchdog(), thread_);
  double in = mode == 0 ? (worldRank_ == 0 ? v : 0.0) : v, out = 0;
  ncclRedOp_t op = mode == 2 ? ncclMin : mode == 3 ? ncclMax : ncclSum;
  BENCH_NCCL(ncclAllReduce(&in, &out, 1, ncclFloat64, op, ctl_, nullptr), ctl_);
  return mode == 1 ? out / worldRanks_ : out;
}

int64_t RankRunner::sumAll(int64_t v) {
  Watchdog::Busy busy(proc_.watchdog(), thread_);
  int64_t out = 0;
  BENCH_NCCL(ncclAllReduce(&v, &out, 1, ncclInt64, ncclSum, ctl_, nullptr), ctl_);
  return out;
}

void RankRunner::maxAll(std::vector<double>& v) {
  Watchdog::Busy busy(proc_.watchdog(), thread_);
  std::vector<double> in = v;
  BENCH_NCCL(ncclAllReduce(in.data(), v.data(), v.size(), ncclFloat64, ncclMax, ctl_, nullptr),
             ctl_);
}

void RankRunner::run() {
  registerBuffers();
  std::vector<const TypeInfo*> types =
      o_.type ? std::vector<const TypeInfo*>{o_.type} : sweepTypes();
  std::vector<const OpInfo*> ops;
  if (!coll_.sweepsOps())
    ops = {&noOp()};
  else if (o_.op)
    ops = {o_.op};
  else
    for (const OpInfo& op : allOps()) ops.push_back(&op);
  int firstRoot = -1, lastRoot = -1;
  if (coll_.sweepsRoots()) {
    firstRoot = o_.root == -1 ? 0 : o_.root;
    lastRoot = o_.root == -1 ? nranks_ - 1 : o_.root;
    if (lastRoot >= nranks_)
      benchFail(Status::kInvalidUsage, "root %d is not a rank of this %d-rank run (-r)", lastRoot,
                nranks_);
  }
  for (const TypeInfo* type : types)
    for (const OpInfo* op : ops)
      for (int root = firstRoot; root <= lastRoot; ++root) timeTest(*type, *op, root);
}

void RankRunner::setupSize(size_t bytes) {
  size_t es = type_->size;
  counts_ = coll_.counts(bytes / es, es, nranks_);
  sendBytes_ = counts_.sendCount * es;
  recvBytes_ = counts_.recvCount * es;
}

DataContext RankRunner::dataContext(bool inPlace, uint64_t seed) const {
  return DataContext{type_, op_, rank_, nranks_, root_, inPlace, seed, counts_, send_, recv_};
}

void RankRunner::timeTest(const TypeInfo& type, const OpInfo& op, int root) {
  type_ = &type;
  op_ = &op;
  root_ = root;
  barrier();

  ncclOp_ = op.op;
  opCreated_ = false;
  if (op.preMulSum && coll_.usesOp()) {
    // The premultiplier is a value of the reduced type, passed by host pointer.
    alignas(8) unsigned char scalar[8] = {};
    storeValue(type.type, scalar, 0, preMulScalar(rank_));
    BENCH_NCCL(
        ncclRedOpCreatePreMulSum(&ncclOp_, scalar, type.type, ncclScalarHostImmediate, comm_),
        comm_);
    opCreated_ = true;
  } else if (op.preMulSum) {
    ncclOp_ = ncclSum;
  }

  send_ = sendBase_ + o_.unalign * type.size;
  recv_ = recvBase_ + o_.unalign * type.size;
  prepareBuffers(type);

  // Warm-up over every size, doubling as nccl-tests does.
  for (size_t size = o_.minBytes; size <= proc_.maxBytes(); size = size ? size * 2 : 1) {
    setupSize(size);
    for (int iter = 0; iter < o_.warmupIters; ++iter) startColl(false, iter);
  }
  syncStream();

  long cycles = o_.runCycles;
  do {
    for (size_t size = o_.minBytes; size <= proc_.maxBytes(); size = nextSize(size)) {
      setupSize(size);
      const char* opName = coll_.sweepsOps() ? op.name : "none";
      size_t rowBytes = std::max(sendBytes_, recvBytes_);
      proc_.print(thread_,
                  formatRowPreamble(rowBytes, counts_.paramCount, type.name, opName, root));
      if (proc_.isPrinter(thread_))
        proc_.json().beginRow(rowBytes, counts_.paramCount, type.name, opName, root);
      benchTime(false);
      benchTime(true);
      proc_.print(thread_, "\n");
      if (proc_.isPrinter(thread_)) proc_.json().endRow(o_.iters);
      if (nextSize(size) <= size) break;  // -b 0 -f 2 or -i 0 would never grow
    }
  } while (--cycles != 0);

  if (opCreated_) BENCH_NCCL(ncclRedOpDestroy(ncclOp_, comm_), comm_);
  opCreated_ = false;
}

// Before the warm-up, whatever -c says (with -c 0 nothing else writes the buffers): every
// byte of both buffers becomes data, so no page is first touched inside a timed call, and
// that data is ones of the type under test. Not zeros: under memory pressure Linux (6.12+)
// splits a huge page that holds only zeros and maps the shared zero page in its place, so
// reads measure no memory and the next write faults. Not another type's data: its bits
// may be denormals or NaNs in this type, whose arithmetic is slower.
void RankRunner::prepareBuffers(const TypeInfo& type) {
  fillOnes(type, sendBase_, bufBytes_);
  fillOnes(type, recvBase_, bufBytes_);
  if (sendDev_) {
    sendDev_->upload(sendBase_, bufBytes_);
    recvDev_->upload(recvBase_, bufBytes_);
  }
}

// Test hook: LOOM_BENCH_INJECT_WRONG=<rank>:<n> flips the bits of the first n result
// elements on that rank after each checked call, so tests can prove #wrong counts real
// mismatches end to end.
void RankRunner::injectWrong(const DataContext& c) const {
  const char* spec = getenv("LOOM_BENCH_INJECT_WRONG");
  int rank = -1;
  long n = 0;
  if (!spec || sscanf(spec, "%d:%ld", &rank, &n) != 2 || rank != worldRank_ || n <= 0) return;
  size_t elts = std::min<size_t>(n, counts_.recvCount);
  if (!coll_.checksInPlace() && c.inPlace) return;
  for (size_t i = 0; i < elts * type_->size; ++i) c.result()[i] ^= 0x5a;
}

size_t RankRunner::nextSize(size_t size) const {
  return o_.stepFactor > 1 ? size * o_.stepFactor : size + o_.stepBytes;
}

void RankRunner::startColl(bool inPlace, int iter) {
  const size_t es = type_->size;
  // Move through the buffer from one iteration to the next, as nccl-tests does, so
  // consecutive calls do not hit the same cache lines.
  size_t total = std::max(sendBytes_, recvBytes_);
  size_t steps = total ? proc_.maxBytes() / total : 1;
  size_t shift = total * (static_cast<size_t>(iter) % std::max<size_t>(steps, 1));
  char* send = send_ + shift;
  char* recv = recv_ + shift;
  CallArgs a{send, recv, counts_.paramCount, type_->type, ncclOp_, root_, comm_};
  if (inPlace) {
    a.send = recv + counts_.sendInplaceOffset * rank_ * es;
    a.recv = recv + counts_.recvInplaceOffset * rank_ * es;
  }
  a.send = onDevice(const_cast<void*>(a.send));
  a.recv = onDevice(a.recv);
  a.stream = static_cast<cudaStream_t>(stream_);
  {
    Watchdog::Busy busy(proc_.watchdog(), thread_);
    ncclResult_t res = coll_.run(a);
    if (res != ncclSuccess)
      checkNccl(res,
                formatString("%s (%zu x %s, rank %d)", coll_.name(), counts_.paramCount,
                             type_->name, rank_)
                    .c_str(),
                comm_);
  }
  // Host calls return complete, so -z's "wait" is already done; device calls wait for
  // their stream. -z 1 adds the barrier (after the group when -m aggregates calls: a
  // barrier cannot run inside a group).
  if (o_.blocking && o_.aggIters == 1) syncStream();
  if (o_.blocking == 1 && o_.aggIters == 1) barrier();
}

void RankRunner::benchTime(bool inPlace) {
  const int totalIters = o_.iters * o_.aggIters;
  if (o_.datacheck) {
    coll_.fill(dataContext(inPlace, 99));
    upload();
  }
  startColl(inPlace, 0);
  syncStream();
  barrier();

  std::vector<double> iterTimes;
  double collOnly = 0;
  if (o_.cudaGraphLaunches > 0) {  // nccl-tests' -G: the iterations as one graph, replayed
    timeGraph(inPlace);
    return;
  }
  const double t0 = now();
  // Per-call clock reads only where per-call times are asked for: at 8 B two of them
  // would be a tenth of the time measured, and MPI's loop has none.
  const bool perIter = o_.perIterTiming || o_.blocking == 3;
  for (int iter = 0; iter < o_.iters; ++iter) {
    double ti = perIter ? now() : 0;
    if (o_.aggIters > 1) BENCH_NCCL(ncclGroupStart(), comm_);
    for (int a = 0; a < o_.aggIters; ++a) startColl(inPlace, iter * o_.aggIters + a);
    if (o_.aggIters > 1) {
      {
        Watchdog::Busy busy(proc_.watchdog(), thread_);
        BENCH_NCCL(ncclGroupEnd(), comm_);
      }
      if (o_.blocking) syncStream();
      if (o_.blocking == 1) barrier();
    }
    if (!perIter) continue;
    syncStream();  // a time per call is the call's completion
    double dt = now() - ti;
    if (o_.perIterTiming) iterTimes.push_back(dt / o_.aggIters);
    if (o_.blocking == 3) {
      collOnly += dt;
      barrier();
    }
  }
  const double cpuEnd = now();  // device calls: the caller's time ends before the stream's
  syncStream();
  double elapsed = o_.blocking == 3 ? collOnly : now() - t0;
  double deltaSec = elapsed / totalIters;
  double cpuSec = o_.blocking == 3 ? deltaSec : (cpuEnd - t0) / totalIters;  // host: equal
  report(inPlace, deltaSec, cpuSec, iterTimes);
}

// -G: every iteration captured once into a CUDA graph on the rank's stream, the graph
// launched -G times, the time per call over all of them (device buffers; BenchProcess
// turns -G off where it cannot apply).
void RankRunner::timeGraph(bool inPlace) {
  const CudaDriver& cuda = *proc_.cuda();
  cuda.beginCapture(stream_);
  try {
    for (int iter = 0; iter < o_.iters; ++iter) {
      if (o_.aggIters > 1) BENCH_NCCL(ncclGroupStart(), comm_);
      for (int a = 0; a < o_.aggIters; ++a) startColl(inPlace, iter * o_.aggIters + a);
      if (o_.aggIters > 1) BENCH_NCCL(ncclGroupEnd(), comm_);
    }
  } catch (...) {
    cuda.discardCapture(stream_);  // the stream must not stay capturing: it is synced later
    throw;
  }
  void* exec = cuda.endCapture(stream_);
  barrier();
  const double t0 = now();
  for (int l = 0; l < o_.cudaGraphLaunches; ++l) cuda.launchGraph(exec, stream_);
  const double cpuEnd = now();
  {
    Watchdog::Busy busy(proc_.watchdog(), thread_);
    syncStream();
  }
  const double calls = double(o_.iters) * o_.aggIters * o_.cudaGraphLaunches;
  const double deltaSec = (now() - t0) / calls;
  cuda.destroyGraph(exec);
  report(inPlace, deltaSec, (cpuEnd - t0) / calls, {});
}

// The row's second half: times and bandwidths (averaged over ranks as -a says), then the
// data check (-c) and the output.
void RankRunner::report(bool inPlace, double deltaSec, double cpuSec,
                        std::vector<double> iterTimes) {
  deltaSec = reduceScalar(deltaSec, o_.average);
  const double bytes = double(counts_.paramCount) * type_->size * coll_.algBytesFactor(nranks_);
  const double algBw = bytes / 1.0e9 / deltaSec;
  const double busBw = algBw * coll_.busBwFactor(nranks_);

  IterStats stats;
  if (o_.perIterTiming) {
    maxAll(iterTimes);
    stats =
        computeIterStats(std::vector<double>(iterTimes.begin() + o_.perIterSkip, iterTimes.end()));
  }
  barrier();

  int64_t wrong = 0;
  for (int c = 0; c < o_.datacheck; ++c) {
    uint64_t seed = ++rep_;
    DataContext ctx = dataContext(inPlace, seed);
    coll_.fill(ctx);
    upload();
    startColl(inPlace, 0);
    download();
    injectWrong(ctx);
    int64_t local = coll_.check(ctx);
    if (local && (!inPlace || coll_.checksInPlace())) ++errors_;
    wrong = sumAll(local);
    if (wrong) break;
  }
  const bool reportErrors = o_.datacheck && (!inPlace || coll_.checksInPlace());
  double timeUs = (o_.reportCputime ? cpuSec : deltaSec) * 1e6;
  std::string line = formatRowBody(timeUs, algBw, busBw, reportErrors ? wrong : -1);
  if (o_.perIterTiming) line += formatIterStats(stats);
  if (inPlace && o_.reportTimestamps) line += formatTimestamp();
  proc_.print(thread_, line);
  if (proc_.isPrinter(thread_))
    proc_.json().placement(!inPlace, o_.reportCputime, timeUs, algBw, busBw,
                           reportErrors ? wrong : -1, o_.perIterTiming ? &stats : nullptr,
                           o_.perIterTiming ? &iterTimes : nullptr, o_.perIterSkip);
  bwSum_ += busBw;
  ++bwCount_;
}

}  // namespace loom::bench
