// UCP (UCX's protocol layer), reached only through dlopen: libloom loads where UCX is not
// installed, and loads libucp only when a communicator uses the UCX backend (loading it
// installs UCX's memory hooks in the process). The header (Debian's libucx-dev) is
// needed to build it; a build without it offers no UCX backend and says so.
#pragma once

#include <functional>
#include <string>

// Not in sanitizer builds: UCX's memory hooks (libucm) break the sanitizers' interceptors.
#if __has_include(<ucp/api/ucp.h>) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define LOOM_UCX_HEADERS 1
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#include "base/dl.h"

namespace loom {

struct UcxApi {
  DynLib lib;
  std::string version;  // ucp_get_version_string()
  decltype(&ucp_config_read) configRead = nullptr;
  decltype(&ucp_config_modify) configModify = nullptr;
  decltype(&ucp_config_release) configRelease = nullptr;
  decltype(&ucp_init_version) initVersion = nullptr;
  decltype(&ucp_cleanup) cleanup = nullptr;
  decltype(&ucp_worker_create) workerCreate = nullptr;
  decltype(&ucp_worker_destroy) workerDestroy = nullptr;
  decltype(&ucp_worker_get_address) workerGetAddress = nullptr;
  decltype(&ucp_worker_release_address) workerReleaseAddress = nullptr;
  decltype(&ucp_worker_progress) workerProgress = nullptr;
  decltype(&ucp_ep_create) epCreate = nullptr;
  decltype(&ucp_ep_close_nbx) epCloseNbx = nullptr;
  decltype(&ucp_ep_flush_nbx) epFlushNbx = nullptr;
  decltype(&ucp_tag_send_nbx) tagSendNbx = nullptr;
  decltype(&ucp_tag_recv_nbx) tagRecvNbx = nullptr;
  decltype(&ucp_tag_recv_request_test) tagRecvRequestTest = nullptr;
  decltype(&ucp_mem_map) memMap = nullptr;
  decltype(&ucp_mem_unmap) memUnmap = nullptr;
  decltype(&ucp_rkey_pack) rkeyPack = nullptr;
  decltype(&ucp_rkey_buffer_release) rkeyBufferRelease = nullptr;
  decltype(&ucp_ep_rkey_unpack) epRkeyUnpack = nullptr;
  decltype(&ucp_rkey_destroy) rkeyDestroy = nullptr;
  decltype(&ucp_put_nbx) putNbx = nullptr;
  decltype(&ucp_worker_fence) workerFence = nullptr;
  decltype(&ucp_request_check_status) requestCheckStatus = nullptr;
  decltype(&ucp_request_cancel) requestCancel = nullptr;
  decltype(&ucp_request_free) requestFree = nullptr;
  decltype(&ucs_status_string) statusString = nullptr;

  decltype(&ucs_log_push_handler) logPush = nullptr;  // optional
  decltype(&ucs_log_pop_handler) logPop = nullptr;

  std::string statusText(ucs_status_t s) const;  // "Connection reset by remote peer (-25)"
  // Runs `fn` with UCX's log lines from this thread dropped: for a probe whose failure is
  // expected and handled (UCX prints an ERROR line for it otherwise).
  void quietly(const std::function<void()>& fn) const;
};

// The process's UCP, loaded once (LOOM_UCX_LIBRARY, default libucp.so.0); null with
// `*why` set when it cannot be used.
const UcxApi* ucxApi(std::string* why);

}  // namespace loom
#endif

namespace loom {
// Empty when this process can offer the UCX backend; else why it cannot.
std::string ucxUnavailable();
// Whether this process has looked for libucp yet (the result is kept for its life).
bool ucxProbed();
// Whether this build has the UCX backend (UCX's headers were there to build it, and it is
// not a sanitizer build).
constexpr bool ucxBuiltIn() {
#ifdef LOOM_UCX_HEADERS
  return true;
#else
  return false;
#endif
}
}  // namespace loom
