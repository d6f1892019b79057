// The executor seam. The engine turns operations into tasks (a plan bound to buffers) and
// hands them to an Executor, which returns a Work handle. The CPU executor runs host
// buffers; a CUDA executor will run device buffers on the caller's stream behind the same
// interface, and the PyTorch backend waits on the same handles.
#pragma once

#include <memory>
#include <vector>

#include "base/error.h"
#include "engine/executor.h"
#include "engine/op.h"

namespace loom {

// One launched batch of work. test() and wait() rethrow the failure (loom::Error) of the
// work they report on; both may be called again after completion.
class Work {
 public:
  virtual ~Work() = default;
  // True once the work has completed.
  virtual bool test() = 0;
  // Blocks until the work has completed.
  virtual void wait() = 0;
};

// Everything a launch owns until its tasks complete: the tasks and the plans they run.
struct Batch {
  std::vector<Task> tasks;  // per communicator in issue order
  std::vector<std::shared_ptr<const Plan>> plans;
  std::vector<OpComm> comms;  // the communicators the tasks run on
};

// What every executor does when a batch fails: the API records the error on each
// communicator and their connections close, so peers blocked on this rank fail promptly.
void failBatch(const Batch& batch, const Error& e);

// When the caller gets control back.
enum class Completion {
  kBeforeReturn,  // the C API on host buffers: the call returns once the work is done
  kAsync,         // launch returns at once; the Work handle reports completion
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual std::shared_ptr<Work> launch(std::unique_ptr<Batch> batch, Completion completion) = 0;
};

// A Work that is already complete (successful launches that finished before returning).
std::shared_ptr<Work> completedWork();

}  // namespace loom
