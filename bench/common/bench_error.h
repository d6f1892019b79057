// Error idiom of the benchmark tools. The tools are clients of the public C API only
// (they link libloom, never Loom's internals), so they cannot use src/base/error.h; they
// follow the same idea: code below main() throws BenchError, and benchMain() is the one
// place that turns it into a message and nccl-tests' exit code.
#pragma once

#include <nccl.h>

#include <stdexcept>
#include <string>

namespace loom::bench {

// nccl-tests' testResult_t values, used as process exit codes.
enum class Status : int {
  kSuccess = 0,
  kInternalError = 1,
  kCudaError = 2,
  kNcclError = 3,
  kTimeout = 4,
  kNotImplemented = 5,
  kInvalidUsage = 6,
  kNumResults = 7,  // wrong results or average bandwidth below NCCL_TESTS_MIN_BW
};

class BenchError : public std::runtime_error {
 public:
  BenchError(Status status, const std::string& msg) : std::runtime_error(msg), status_(status) {}
  Status status() const { return status_; }

 private:
  Status status_;
};

std::string formatString(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void benchFail(Status status, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

// Throws kNcclError naming the call, the NCCL error string and the library's last error
// message (ncclGetLastError) for `comm`.
void checkNccl(ncclResult_t res, const char* what, ncclComm_t comm);

}  // namespace loom::bench

#define BENCH_NCCL(call, comm) ::loom::bench::checkNccl((call), #call, (comm))
