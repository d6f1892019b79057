#include "engine/cpu_executor.h"

#include <exception>

namespace loom {
namespace {

class DoneWork : public Work {
 public:
  bool test() override { return true; }
  void wait() override {}
};

void run(const Batch& batch) {
  std::vector<Task*> tasks;
  tasks.reserve(batch.tasks.size());
  for (const Task& t : batch.tasks) tasks.push_back(const_cast<Task*>(&t));
  try {
    runTasks(tasks);
  } catch (const Error& e) {
    failBatch(batch, e);
    throw;
  }
}

}  // namespace

std::shared_ptr<Work> completedWork() {
  static const std::shared_ptr<Work> done = std::make_shared<DoneWork>();
  return done;
}

// An asynchronous launch: its batch until it ran, then its outcome.
struct CpuExecutor::Item : public Work {
  std::unique_ptr<Batch> batch;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  bool test() override {
    std::lock_guard<std::mutex> lock(mu);
    if (done && error) std::rethrow_exception(error);
    return done;
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    if (error) std::rethrow_exception(error);
  }
  void finish(std::exception_ptr e) {
    batch.reset();  // plans and tasks go before anyone is told
    std::lock_guard<std::mutex> lock(mu);
    error = e;
    done = true;
    cv.notify_all();
  }
};

CpuExecutor::~CpuExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::shared_ptr<Work> CpuExecutor::launch(std::unique_ptr<Batch> batch, Completion completion) {
  if (completion == Completion::kBeforeReturn) {
    drain();
    run(*batch);
    return completedWork();
  }
  auto item = std::make_shared<Item>();
  item->batch = std::move(batch);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { workerLoop(); });
    queue_.push_back(item);
    ++busy_;
  }
  cv_.notify_all();
  return item;
}

void CpuExecutor::drain() {
  if (busy_.load() == 0) return;  // the common case: nothing was launched asynchronously
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return busy_ == 0; });
}

void CpuExecutor::workerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Queued work runs even after stop_: its owners wait on it, and an aborted
    // communicator's tasks fail at once.
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    std::shared_ptr<Item> item = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::exception_ptr error;
    try {
      run(*item->batch);
    } catch (...) {
      error = std::current_exception();
    }
    item->finish(error);
    lock.lock();
    --busy_;
    cv_.notify_all();
  }
}

}  // namespace loom
