// The device executor's plan interpreter (kernels/interp.h) run on host threads: one
// thread per channel of each task, as a GPU runs one block per channel, over the
// communicator's own connections (host memory, host atomics) and the CPU's reductions. The
// calling thread plays the GPU's host side: it starts the channels, drives connections that
// need progress (sockets), watches for dead peers, aborts and LOOM_TIMEOUT, and raises the
// abort word the channels poll.
//
// LOOM_EXECUTOR=interp selects it for host-memory calls of communicators created while it
// is set: CI runs every collective, algorithm and type through it and compares the bits
// with the CPU executor's, so the interpreter a GPU runs is exercised where no GPU is.
#pragma once

#include <span>

#include "engine/executor.h"

namespace loom {

// As runTasks (engine/executor.h): same order, same errors.
void runTasksInterp(std::span<Task* const> tasks);

// What runs host-memory work of communicators created now (LOOM_EXECUTOR and
// LOOM_INTERP_PROTO): Task::kCpu, kInterpSimple or kInterpLL. Throws kInvalidArgument for
// a value it does not know.
uint8_t interpExecutorSelected();

}  // namespace loom
