// kernels/ is the bottom layer: it depends on nothing in src/ (the CUDA module and the
// tools build it too), so its few argument checks cannot throw loom::Error. They throw
// KernelError, whose code has ncclResult_t's numbering; the C boundary (api/guard.cc)
// reports it exactly as it reports a loom::Error.
#pragma once

#include <stdexcept>
#include <string>

namespace loom {

enum class KernelErrc : int { kInternalError = 3, kInvalidArgument = 4, kInvalidUsage = 5 };

class KernelError : public std::runtime_error {
 public:
  KernelError(KernelErrc code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  KernelErrc code() const { return code_; }

 private:
  KernelErrc code_;
};

}  // namespace loom
