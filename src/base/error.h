// Loom's one error idiom: internal code throws loom::Error; the C boundary (api/guard.h)
// converts it to ncclResult_t and records the message for ncclGetLastError.
#pragma once

#include <cstdarg>
#include <stdexcept>
#include <string>

namespace loom {

// Mirrors ncclResult_t's numeric values; kept here so lower layers need not include nccl.h.
enum class Code : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

class Error : public std::runtime_error {
 public:
  Error(Code code, std::string msg) : std::runtime_error(std::move(msg)), code_(code) {}
  Code code() const { return code_; }

 private:
  Code code_;
};

std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vstrprintf(const char* fmt, va_list ap);

[[noreturn]] void throwError(Code code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// Throws kSystemError with strerror(errno) appended.
[[noreturn]] void throwErrno(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace loom

#define LOOM_THROW(code, ...) ::loom::throwError(::loom::Code::code, __VA_ARGS__)

// Argument check: both the condition and the message reach the user.
#define LOOM_CHECK_ARG(cond, ...) \
  do {                            \
    if (!(cond)) LOOM_THROW(kInvalidArgument, __VA_ARGS__); \
  } while (0)
#define LOOM_CHECK_USAGE(cond, ...) \
  do {                              \
    if (!(cond)) LOOM_THROW(kInvalidUsage, __VA_ARGS__); \
  } while (0)
#define LOOM_ASSERT(cond)                                                                  \
  do {                                                                                     \
    if (!(cond))                                                                           \
      ::loom::throwError(::loom::Code::kInternalError, "internal error: %s (%s:%d)", #cond, \
                         __FILE__, __LINE__);                                              \
  } while (0)
