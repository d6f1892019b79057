#include "api/guard.h"

#include <new>

#include "api/comm.h"
#include "base/log.h"
#include "kernels/kernel_error.h"

namespace loom::api {
namespace {
thread_local std::string tlsLastError;
}

void recordError(ncclComm_t comm, ncclResult_t code, const std::string& msg) {
  tlsLastError = msg;
  // An abort on another thread may be freeing comm as its stuck call returns here.
  if (comm) setCommLastError(comm, msg);
}

void clearThreadError() { tlsLastError.clear(); }
const char* threadLastError() { return tlsLastError.c_str(); }

ncclResult_t handleException(const char* fn, ncclComm_t comm) {
  ncclResult_t code;
  std::string msg;
  try {
    throw;
  } catch (const Error& e) {
    code = static_cast<ncclResult_t>(e.code());
    msg = e.what();
  } catch (const KernelError& e) {
    code = static_cast<ncclResult_t>(e.code());
    msg = e.what();
  } catch (const std::bad_alloc&) {
    code = ncclSystemError;
    msg = "out of memory";
  } catch (const std::exception& e) {
    code = ncclInternalError;
    msg = std::string("unexpected exception: ") + e.what();
  } catch (...) {
    code = ncclInternalError;
    msg = "unknown exception";
  }
  // Prefix the entry point unless the message already names it.
  if (msg.rfind(fn, 0) != 0) msg = std::string(fn) + ": " + msg;
  recordError(comm, code, msg);
  LOOM_WARN("%s", msg.c_str());
  return code;
}

}  // namespace loom::api
