#include "bench/common/bench_error.h"

#include <cstdarg>
#include <cstdio>

namespace loom::bench {

namespace {
std::string vformat(const char* fmt, va_list ap) {
  va_list copy;
  va_copy(copy, ap);
  int n = vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? n : 0, '\0');
  if (n > 0) vsnprintf(out.data(), out.size() + 1, fmt, ap);
  return out;
}
}  // namespace

std::string formatString(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  return s;
}

void benchFail(Status status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  throw BenchError(status, s);
}

void checkNccl(ncclResult_t res, const char* what, ncclComm_t comm) {
  if (res == ncclSuccess) return;
  const char* last = ncclGetLastError(comm);
  benchFail(Status::kNcclError, "%s failed: %s (%d)%s%s", what, ncclGetErrorString(res),
            static_cast<int>(res), last && *last ? ": " : "", last && *last ? last : "");
}

}  // namespace loom::bench
