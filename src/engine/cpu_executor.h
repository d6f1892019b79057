// The CPU executor: runs host-memory tasks (engine/executor.h's runTasks) either on the
// calling thread (the C API's host semantics: complete before return) or on a worker
// thread that the communicator owns (asynchronous launches: the PyTorch backend's works).
// One worker per communicator keeps each communicator's operations in issue order.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/work.h"

namespace loom {

class CpuExecutor : public Executor {
 public:
  CpuExecutor() = default;
  ~CpuExecutor() override;  // waits for the queued work (aborted work fails fast)

  std::shared_ptr<Work> launch(std::unique_ptr<Batch> batch, Completion completion) override;
  // Blocks until every asynchronous launch queued so far has completed (successfully or
  // not). A launch that completes before return calls this first: work stays in order.
  void drain();

 private:
  struct Item;
  void workerLoop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Item>> queue_;
  std::atomic<size_t> busy_{0};  // queued or running; changed under mu_
  bool stop_ = false;
  std::thread worker_;  // started by the first asynchronous launch
};

}  // namespace loom
