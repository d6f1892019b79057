#include "transports/net/ucx_api.h"

#include <atomic>
#include <mutex>

#include "base/config.h"
#include "base/error.h"

namespace loom {

#ifdef LOOM_UCX_HEADERS
namespace {

StringKnob kUcxLibrary("LOOM_UCX_LIBRARY", "", "libucp.so.0",
                       "UCP library the UCX network backend dlopens (path or soname), read "
                       "once per process");

UcxApi* load(std::string* why) {
  std::string err;
  DynLib lib = DynLib::open({kUcxLibrary.get()}, &err);
  if (!lib.loaded()) {
    *why = "UCX is not loadable: " + err;
    return nullptr;
  }
  auto* u = new UcxApi{std::move(lib), {}};
  const char* missing = nullptr;
  auto need = [&](auto*& fn, const char* sym) {
    if (!missing && !u->lib.bind(fn, sym)) missing = sym;
  };
  need(u->configRead, "ucp_config_read");
  need(u->configModify, "ucp_config_modify");
  need(u->configRelease, "ucp_config_release");
  need(u->initVersion, "ucp_init_version");
  need(u->cleanup, "ucp_cleanup");
  need(u->workerCreate, "ucp_worker_create");
  need(u->workerDestroy, "ucp_worker_destroy");
  need(u->workerGetAddress, "ucp_worker_get_address");
  need(u->workerReleaseAddress, "ucp_worker_release_address");
  need(u->workerProgress, "ucp_worker_progress");
  need(u->epCreate, "ucp_ep_create");
  need(u->epCloseNbx, "ucp_ep_close_nbx");
  need(u->epFlushNbx, "ucp_ep_flush_nbx");
  need(u->tagSendNbx, "ucp_tag_send_nbx");
  need(u->tagRecvNbx, "ucp_tag_recv_nbx");
  need(u->tagRecvRequestTest, "ucp_tag_recv_request_test");
  need(u->memMap, "ucp_mem_map");
  need(u->memUnmap, "ucp_mem_unmap");
  need(u->rkeyPack, "ucp_rkey_pack");
  need(u->rkeyBufferRelease, "ucp_rkey_buffer_release");
  need(u->epRkeyUnpack, "ucp_ep_rkey_unpack");
  need(u->rkeyDestroy, "ucp_rkey_destroy");
  need(u->putNbx, "ucp_put_nbx");
  need(u->workerFence, "ucp_worker_fence");
  need(u->requestCheckStatus, "ucp_request_check_status");
  need(u->requestCancel, "ucp_request_cancel");
  need(u->requestFree, "ucp_request_free");
  need(u->statusString, "ucs_status_string");  // libucs, a dependency of libucp
  u->lib.bind(u->logPush, "ucs_log_push_handler");
  u->lib.bind(u->logPop, "ucs_log_pop_handler");
  const char* (*versionString)() = nullptr;
  if (!missing && !u->lib.bind(versionString, "ucp_get_version_string"))
    missing = "ucp_get_version_string";
  if (missing) {
    *why = u->lib.path() + " lacks " + missing + ", which the UCX backend needs (UCX >= 1.10)";
    delete u;
    return nullptr;
  }
  u->version = versionString();
  return u;
}

thread_local bool tQuiet = false;

ucs_log_func_rc_t dropWhenQuiet(const char*, unsigned, const char*, ucs_log_level_t,
                                const ucs_log_component_config_t*, const char*, va_list) {
  return tQuiet ? UCS_LOG_FUNC_RC_STOP : UCS_LOG_FUNC_RC_CONTINUE;
}

}  // namespace

void UcxApi::quietly(const std::function<void()>& fn) const {
  if (!logPush || !logPop) return fn();
  static std::mutex mu;  // UCX's handler stack is process-wide
  {
    std::lock_guard<std::mutex> lk(mu);
    logPush(dropWhenQuiet);
  }
  tQuiet = true;
  try {
    fn();
  } catch (...) {
    tQuiet = false;
    std::lock_guard<std::mutex> lk(mu);
    logPop();
    throw;
  }
  tQuiet = false;
  std::lock_guard<std::mutex> lk(mu);
  logPop();
}

std::string UcxApi::statusText(ucs_status_t s) const {
  return strprintf("%s (%d)", statusString(s), static_cast<int>(s));
}

static std::atomic<bool> gProbed{false};

const UcxApi* ucxApi(std::string* why) {
  static std::once_flag once;
  static UcxApi* api = nullptr;  // kept for the process's life: UCX has no safe unload
  static std::string* absence = nullptr;
  std::call_once(once, [] {
    std::string w;
    api = load(&w);
    if (!api) absence = new std::string(w);
    gProbed = true;
  });
  if (!api && why) *why = *absence;
  return api;
}

std::string ucxUnavailable() {
  std::string why;
  return ucxApi(&why) ? std::string() : why;
}

bool ucxProbed() { return gProbed; }

#else

bool ucxProbed() { return false; }

std::string ucxUnavailable() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return "sanitizer builds of Loom have no UCX backend (UCX's memory hooks break the "
         "sanitizer's interceptors)";
#else
  return "this Loom was built without UCX's headers (Debian: libucx-dev), so it has no UCX "
         "backend";
#endif
}

#endif

}  // namespace loom
