#include "backend.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstring>
#include <stdexcept>

namespace loom_torch {

ncclDataType_t ncclTypeOf(const at::Tensor& t);

namespace {

using c10d::OpType;

ncclDataType_t ncclType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    case at::kBool: return ncclUint8;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
#if LOOM_TORCH_AT_LEAST(2, 1)
    case at::kFloat8_e4m3fn: return ncclFloat8e4m3;
    case at::kFloat8_e5m2: return ncclFloat8e5m2;
#endif
    default:
      TORCH_CHECK(false, "loom: tensors of type ", t, " are not supported (Loom moves the ",
                  "types NCCL has; complex tensors go as pairs of reals)");
  }
}

// A contiguous tensor as Loom sees it: complex as pairs of reals.
struct Buf {
  void* ptr;
  size_t count;
  ncclDataType_t type;
};
Buf buf(const at::Tensor& c) {
  at::Tensor r = c.is_complex() ? at::view_as_real(c) : c;
  return {r.data_ptr(), static_cast<size_t>(r.numel()), ncclType(r.scalar_type())};
}

void checkTensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), "loom: ", what, ": a ", t.device(), " tensor; the loom ",
              "backend moves CPU tensors (for CUDA tensors use backend \"nccl\" with Loom's ",
              "libnccl.so.2 preloaded: LD_PRELOAD=<prefix>/lib/nccl/libnccl.so.2)");
  TORCH_CHECK(!t.is_sparse(), "loom: ", what, ": sparse tensors are not supported");
  (void)ncclTypeOf(t);
}

void checkOne(const std::vector<at::Tensor>& ts, const char* what) {
  TORCH_CHECK(ts.size() == 1, "loom: ", what, " takes one tensor per process, got ", ts.size());
  checkTensor(ts[0], what);
}

// The reduction: Loom's built-in operator, or a PreMulSum made for the call (destroyed after).
struct Reduction {
  ncclRedOp_t op = ncclSum;
  bool premul = false;
  double factor = 1;
};

Reduction reduction(const c10d::ReduceOp& op, const at::Tensor& t) {
  Reduction r;
  bool complex = t.is_complex();
  switch (op.op_) {
    case c10d::ReduceOp::SUM: r.op = ncclSum; break;
    case c10d::ReduceOp::AVG: r.op = ncclAvg; break;
    case c10d::ReduceOp::PRODUCT: r.op = ncclProd; break;
    case c10d::ReduceOp::MIN: r.op = ncclMin; break;
    case c10d::ReduceOp::MAX: r.op = ncclMax; break;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(s, "loom: PREMUL_SUM without its factor");
      r.premul = true;
      r.factor = s->tensor_factor.defined() ? s->tensor_factor.item<double>() : s->double_factor;
      break;
    }
    default:
      TORCH_CHECK(false, "loom: ReduceOp ", static_cast<int>(op.op_), " (BAND, BOR, BXOR) is ",
                  "not supported, as in NCCL");
  }
  TORCH_CHECK(!complex || r.op == ncclSum || r.op == ncclAvg || r.premul,
              "loom: complex tensors reduce with SUM, AVG or PREMUL_SUM only");
  TORCH_CHECK(t.scalar_type() != at::kBool || r.op == ncclMin || r.op == ncclMax,
              "loom: bool tensors reduce with MIN or MAX only");
  return r;
}

}  // namespace

ncclDataType_t ncclTypeOf(const at::Tensor& t) {
  return t.is_complex() ? ncclType(at::view_as_real(t.contiguous()).scalar_type())
                        : ncclType(t.scalar_type());
}

ncclRedOp_t ncclOpOf(const c10d::ReduceOp& op, const at::Tensor& t) {
  Reduction r = reduction(op, t);
  TORCH_CHECK(!r.premul, "loom: PREMUL_SUM is supported by all_reduce only");
  return r.op;
}

// ---- Work ----

LoomWork::LoomWork(int rank, OpType type, std::string what, std::vector<at::Tensor> outputs,
                   std::chrono::milliseconds timeout)
    : Work(rank, type), what_(std::move(what)), outputs_(std::move(outputs)), timeout_(timeout),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

void LoomWork::done(std::exception_ptr error) {
  if (error) future_->setError(error);
  else future_->markCompleted(c10::IValue(outputs_));
  finish(error);
}

bool LoomWork::wait(std::chrono::milliseconds timeout) {
  auto limit = timeout == kNoTimeout ? timeout_ : timeout;
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, limit, [&] { return completed_; }))
    TORCH_CHECK(false, "loom rank ", rank_, ": ", what_, " did not complete within ",
                limit.count(), " ms (the process group's timeout); a peer is stuck or gone");
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

// ---- Backend ----

LoomBackend::LoomBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout)
    : Backend(rank, size), api_(loomApi()), timeout_(timeout) {
  ncclUniqueId id;
  const std::string key = "loom/unique_id";
  if (rank == 0) {
    check(api_.getUniqueId(&id), "ncclGetUniqueId");
    store->set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    std::vector<uint8_t> v = store->get(key);
    TORCH_CHECK(v.size() == sizeof(id.internal), "loom rank ", rank, ": the store holds a ",
                v.size(), "-byte unique id, expected ", sizeof(id.internal));
    memcpy(id.internal, v.data(), v.size());
  }
  check(api_.commInitRank(&comm_, size, id, rank), "ncclCommInitRank");
  thread_ = std::thread(&LoomBackend::worker, this);
}

LoomBackend::LoomBackend(ncclComm_t comm, int rank, int size, std::chrono::milliseconds timeout)
    : Backend(rank, size), api_(loomApi()), comm_(comm), timeout_(timeout) {
  thread_ = std::thread(&LoomBackend::worker, this);
}

#if LOOM_TORCH_AT_LEAST(2, 9)
c10::intrusive_ptr<c10d::Backend> LoomBackend::split(const c10::intrusive_ptr<c10d::Store>&,
                                                     const std::vector<int>& ranks,
                                                     const c10::intrusive_ptr<Options>& opts) {
  int key = -1;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == rank_) key = static_cast<int>(i);
  // Members of one group pass the same list: its hash is their color (NCCL's are >= 0).
  uint64_t h = 1469598103934665603ull;
  for (int r : ranks) h = (h ^ static_cast<uint64_t>(r)) * 1099511628211ull;
  const int color = key < 0 ? NCCL_SPLIT_NOCOLOR : static_cast<int>(h & 0x7fffffff);
  ncclComm_t child = nullptr;
  auto work = enqueue(OpType::UNKNOWN, "split", {}, [&] {
    check(api_.commSplit(comm_, color, key < 0 ? 0 : key, &child, nullptr), "ncclCommSplit");
  });
  work->wait(kNoTimeout);
  if (key < 0) return nullptr;
  TORCH_CHECK(child, "loom rank ", rank_, ": ncclCommSplit made no communicator");
  return c10::make_intrusive<LoomBackend>(child, key, static_cast<int>(ranks.size()),
                                          opts ? opts->timeout : timeout_);
}
#endif

#if LOOM_TORCH_AT_LEAST(2, 10)
c10::intrusive_ptr<c10d::Backend> LoomBackend::shrink(const std::vector<int64_t>& ranksToExclude,
                                                      int shrinkFlags,
                                                      const c10::intrusive_ptr<Options>& opts) {
  std::vector<int> excluded(ranksToExclude.begin(), ranksToExclude.end());
  int newRank = rank_, newSize = size_;
  for (int r : excluded) {
    TORCH_CHECK(r >= 0 && r < size_, "loom rank ", rank_, ": shrink: rank ", r,
                " is not in this group of ", size_);
    TORCH_CHECK(r != rank_, "loom rank ", rank_, ": shrink: an excluded rank calls shrink");
    newRank -= r < rank_;
    --newSize;
  }
  ncclComm_t child = nullptr;
  auto run = [&] {
    check(api_.commShrink(comm_, excluded.data(), static_cast<int>(excluded.size()), &child,
                          nullptr, shrinkFlags),
          "ncclCommShrink");
  };
  if (shrinkFlags == NCCL_SHRINK_ABORT) {
    run();  // beside the worker: the call it may be stuck in fails first
  } else {
    enqueue(OpType::UNKNOWN, "shrink", {}, run)->wait(kNoTimeout);
  }
  TORCH_CHECK(child, "loom rank ", rank_, ": ncclCommShrink made no communicator");
  return c10::make_intrusive<LoomBackend>(child, newRank, newSize, opts ? opts->timeout : timeout_);
}
#endif

LoomBackend::~LoomBackend() {
  stop(true);
  if (comm_) api_.commDestroy(comm_);
}

void LoomBackend::check(ncclResult_t rc, const std::string& what) const {
  if (rc == ncclSuccess) return;
  std::string last = api_.getLastError(comm_);
  throw std::runtime_error(c10::str("loom rank ", rank_, ": ", what, " failed: ",
                                    api_.getErrorString(rc), last.empty() ? "" : ": ", last));
}

c10::intrusive_ptr<c10d::Work> LoomBackend::enqueue(OpType type, std::string what,
                                                    std::vector<at::Tensor> outputs,
                                                    std::function<void()> run) {
  auto work = c10::make_intrusive<LoomWork>(rank_, type, what + " #" + std::to_string(++seq_),
                                            std::move(outputs), timeout_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    TORCH_CHECK(!stopping_, "loom rank ", rank_, ": ", what, " after shutdown");
    queue_.push_back({work, std::move(run)});
  }
  cv_.notify_one();
  return work;
}

void LoomBackend::worker() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      if (aborted_)
        throw std::runtime_error(c10::str("loom rank ", rank_, ": ", item.work->what(),
                                          ": the process group was aborted"));
      item.run();
      item.work->done(nullptr);
    } catch (...) {
      item.work->done(std::current_exception());
    }
  }
}

void LoomBackend::stop(bool drain) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!drain) aborted_ = true;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LoomBackend::grouped(const char* what, const std::function<ncclResult_t()>& post) {
  check(api_.groupStart(), "ncclGroupStart");
  ncclResult_t rc = post();
  ncclResult_t end = api_.groupEnd();
  check(rc != ncclSuccess ? rc : end, what);
}

void LoomBackend::abort() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    aborted_ = true;
  }
  if (comm_) api_.commAbort(comm_);  // unblocks the worker's call in flight
  stop(false);
  comm_ = nullptr;
}

void LoomBackend::shutdown() {
  stop(true);
  if (comm_) api_.commDestroy(comm_);
  comm_ = nullptr;
}

// ---- collectives ----

c10::intrusive_ptr<c10d::Work> LoomBackend::allreduce(std::vector<at::Tensor>& ts,
                                                      const c10d::AllreduceOptions& opts) {
  checkOne(ts, "all_reduce");
  Reduction red = reduction(opts.reduceOp, ts[0]);
  at::Tensor t = ts[0];
  return enqueue(OpType::ALLREDUCE, "all_reduce", {t}, [this, t, red] {
    Dense d(t);
    Buf b = buf(d.work);
    ncclRedOp_t op = red.op;
    at::Tensor scalar;
    if (red.premul) {
      at::ScalarType st = t.is_complex() ? at::view_as_real(d.work).scalar_type() : t.scalar_type();
      scalar = at::scalar_tensor(red.factor, at::TensorOptions().dtype(st));
      check(api_.redOpCreatePreMulSum(&op, scalar.data_ptr(), b.type, ncclScalarHostImmediate, comm_),
            "ncclRedOpCreatePreMulSum");
    }
    ncclResult_t rc = api_.allReduce(b.ptr, b.ptr, b.count, b.type, op, comm_, nullptr);
    if (red.premul) api_.redOpDestroy(op, comm_);
    check(rc, "all_reduce");
    d.copyBack();
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::allreduce_coalesced(
    std::vector<at::Tensor>& ts, const c10d::AllreduceCoalescedOptions& opts) {
  for (const at::Tensor& t : ts) checkTensor(t, "all_reduce_coalesced");
  TORCH_CHECK(opts.reduceOp != c10d::ReduceOp::PREMUL_SUM,
              "loom: all_reduce_coalesced with PREMUL_SUM is not supported");
  std::vector<Reduction> reds;
  for (const at::Tensor& t : ts) reds.push_back(reduction(opts.reduceOp, t));
  std::vector<at::Tensor> list = ts;
  return enqueue(LOOM_OP_COALESCED, "all_reduce_coalesced", list, [this, list, reds] {
    std::vector<Dense> ds;
    for (const at::Tensor& t : list) ds.emplace_back(t);
    grouped("all_reduce_coalesced", [&] {
      ncclResult_t rc = ncclSuccess;
      for (size_t i = 0; i < ds.size() && rc == ncclSuccess; ++i) {
        Buf b = buf(ds[i].work);
        rc = api_.allReduce(b.ptr, b.ptr, b.count, b.type, reds[i].op, comm_, nullptr);
      }
      return rc;
    });
    for (Dense& d : ds) d.copyBack();
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::broadcast(std::vector<at::Tensor>& ts,
                                                      const c10d::BroadcastOptions& opts) {
  checkOne(ts, "broadcast");
  at::Tensor t = ts[0];
  int root = static_cast<int>(opts.rootRank);
  return enqueue(OpType::BROADCAST, "broadcast", {t}, [this, t, root] {
    Dense d(t);
    Buf b = buf(d.work);
    check(api_.broadcast(b.ptr, b.ptr, b.count, b.type, root, comm_, nullptr), "broadcast");
    d.copyBack();
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::reduce(std::vector<at::Tensor>& ts,
                                                   const c10d::ReduceOptions& opts) {
  checkOne(ts, "reduce");
  Reduction red = reduction(opts.reduceOp, ts[0]);
  TORCH_CHECK(!red.premul, "loom: reduce with PREMUL_SUM is not supported (all_reduce has it)");
  at::Tensor t = ts[0];
  int root = static_cast<int>(opts.rootRank);
  return enqueue(OpType::REDUCE, "reduce", {t}, [this, t, root, red] {
    Dense d(t);
    Buf b = buf(d.work);
    check(api_.reduce(b.ptr, b.ptr, b.count, b.type, red.op, root, comm_, nullptr), "reduce");
    d.copyBack();
  });
}

}  // namespace loom_torch
