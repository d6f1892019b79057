#include "base/error.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace loom {

std::string vstrprintf(const char* fmt, va_list ap) {
  va_list copy;
  va_copy(copy, ap);
  int n = vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (n < 0) return fmt;
  std::string out(static_cast<size_t>(n), '\0');
  vsnprintf(out.data(), out.size() + 1, fmt, ap);
  return out;
}

std::string strprintf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrprintf(fmt, ap);
  va_end(ap);
  return s;
}

void throwError(Code code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrprintf(fmt, ap);
  va_end(ap);
  throw Error(code, std::move(s));
}

void throwErrno(const char* fmt, ...) {
  int err = errno;
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrprintf(fmt, ap);
  va_end(ap);
  s += ": ";
  s += strerror(err);
  throw Error(Code::kSystemError, std::move(s));
}

}  // namespace loom
