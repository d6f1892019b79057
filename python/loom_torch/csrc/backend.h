// torch.distributed backend "loom": a c10d::Backend over Loom's C API. Each process group
// has one Loom communicator (its unique id travels through the group's store) and one
// worker thread that runs the group's operations in the order they were issued; the
// Python thread only enqueues and gets a Work back at once.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom_api.h"

// The oldest torch this builds against is 2.0. Virtuals that later torches added to
// c10d::Backend (coalesced tensor variants, abort, shutdown) are declared without
// `override` before 2.9, where the base may lack them: there they are plain members.
#define LOOM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
#if LOOM_TORCH_AT_LEAST(2, 9)
#define LOOM_NEWER_OVERRIDE override
#define LOOM_OP_COALESCED c10d::OpType::COALESCED
#else
#define LOOM_NEWER_OVERRIDE
#define LOOM_OP_COALESCED c10d::OpType::UNKNOWN
#endif

namespace loom_torch {

// A tensor for Loom to work on: the caller's own when contiguous, else a contiguous
// stand-in that copyBack() copies into the caller's. `keep`: the stand-in starts with the
// caller's values (in-place operations); else it starts empty (outputs).
struct Dense {
  explicit Dense(const at::Tensor& t, bool keep = true)
      : user(t), work(t.is_contiguous() ? t
                      : keep ? t.contiguous()
                             : at::empty_like(t, at::MemoryFormat::Contiguous)) {}
  void copyBack() {
    if (!work.is_same(user)) user.copy_(work);
  }
  at::Tensor user, work;
};
inline Dense output(const at::Tensor& t) { return Dense(t, false); }

class LoomWork : public c10d::Work {
 public:
  LoomWork(int rank, c10d::OpType type, std::string what, std::vector<at::Tensor> outputs,
           std::chrono::milliseconds timeout);
  // Called by the worker: completes the work and its future, with an error or without.
  void done(std::exception_ptr error);
  // kNoTimeout waits the process group's timeout; a wait that runs out throws naming the
  // rank and the operation.
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  const std::string& what() const { return what_; }

 private:
  std::string what_;
  std::vector<at::Tensor> outputs_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class LoomBackend : public c10d::Backend {
 public:
  LoomBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
              std::chrono::milliseconds timeout);
  // A backend over a communicator split() made.
  LoomBackend(ncclComm_t comm, int rank, int size, std::chrono::milliseconds timeout);
  ~LoomBackend() override;

  const std::string getBackendName() const override { return "loom"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) LOOM_NEWER_OVERRIDE;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) LOOM_NEWER_OVERRIDE;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

#if LOOM_TORCH_AT_LEAST(2, 9)
  // torch.distributed.split_group: every rank of this group calls it, each with the ranks
  // (of this group) of the group it joins; ranks outside `ranks` join none and get null.
  // One ncclCommSplit of this communicator, run on the worker after the work queued before
  // it: no new rendezvous, the store is not used.
  bool supportsSplitting() const override { return true; }
  // What split_group clones for the child (the backend's name and timeout).
  c10::intrusive_ptr<Options> getBackendOptions() override {
    if (!options_) options_ = c10::make_intrusive<Options>("loom", timeout_);
    return options_;
  }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
#endif

#if LOOM_TORCH_AT_LEAST(2, 10)
  // torch.distributed.shrink_group (torch >= 2.10): the ranks that stay call it, each with
  // the same ranks (of this group) to leave out; one ncclCommShrink of this communicator,
  // which never waits for the excluded ranks (dead ones, typically). SHRINK_DEFAULT runs on
  // the worker after the work queued before it; SHRINK_ABORT runs at once, and the work in
  // flight (waiting on a dead rank) fails first. The new backend has the survivors, in order.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranksToExclude,
                                           int shrinkFlags,
                                           const c10::intrusive_ptr<Options>& opts) override;
#endif

  // Aborts the communicator: operations in flight fail, later ones fail at once.
  void abort() LOOM_NEWER_OVERRIDE;
  // Finishes what was issued, then destroys the communicator.
  void shutdown() LOOM_NEWER_OVERRIDE;

 private:
  // Queues `run` for the worker; its Work completes when it returns or throws.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::string what,
                                         std::vector<at::Tensor> outputs, std::function<void()> run);
  void worker();
  // Runs `post` (Loom calls, returning the first failure) inside one ncclGroupStart/End;
  // throws naming `what` when any of it fails.
  void grouped(const char* what, const std::function<ncclResult_t()>& post);
  // One group of sends and receives (null pointers: none with that rank); runs on the worker.
  void exchange(const std::vector<std::pair<const void*, size_t>>& send,
                const std::vector<std::pair<void*, size_t>>& recv, const char* what);
  void stop(bool drain);
  // Throws std::runtime_error naming the rank, the operation and Loom's message.
  void check(ncclResult_t rc, const std::string& what) const;

  const LoomApi& api_;
  ncclComm_t comm_ = nullptr;
  std::chrono::milliseconds timeout_;
#if LOOM_TORCH_AT_LEAST(2, 9)
  c10::intrusive_ptr<Options> options_;
#endif
  uint64_t seq_ = 0;
  struct Item {
    c10::intrusive_ptr<LoomWork> work;
    std::function<void()> run;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  bool aborted_ = false;
  std::thread thread_;
};

}  // namespace loom_torch
