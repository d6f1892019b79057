// NCCL's RAS client socket: `ncclras` (or `echo status | nc localhost 28028`) asks any
// process of a job how the job's communicators stand. Loom answers NCCL 2.28's protocol
// (CLIENT PROTOCOL, TIMEOUT, SET FORMAT text|json, STATUS, VERBOSE STATUS) with NCCL's
// report, made from what the answering process and those it shares communicators with
// say (api/ras_gather.h).
#pragma once

#include <string>

namespace loom::ras {

// At every communicator init: installs this process's answer to its peers' RAS queries and,
// the first time in a process (again in a forked child), listens for RAS clients at
// NCCL_RAS_ADDR (localhost:28028) unless NCCL_RAS_ENABLE=0. Processes of one user share
// the port (SO_REUSEPORT, as NCCL's do). Never throws: a port it cannot have is logged.
void startServer();

// Where this process listens ("" : it does not), for loom-info and tests.
std::string serverAddress();

}  // namespace loom::ras
