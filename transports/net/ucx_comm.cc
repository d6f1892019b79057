#include "transports/net/ucx_comm.h"

#ifdef LOOM_UCX_HEADERS
namespace loom::ucxnet {

bool UcxSender::test(NetRequest* req, size_t* bytes) {
  std::lock_guard<std::mutex> lk(w_->mu);
  UcxRequest* r = check(req);
  if (r->ucx || r->ucx2) {
    w_->progress();
    if (!reap(*r)) {
      failIfBroken(kGraceSec);
      return false;
    }
  }
  r->busy = false;
  *bytes = r->bytes;
  return true;
}

void UcxSender::close() {
  std::lock_guard<std::mutex> lk(w_->mu);
  Deadline d = Deadline::in(peerMode_ ? kCloseSec : kDrainSec);
  try {
    while (pending() && !err_->first && !controlEnded() && !d.expired()) {
      w_->progress();
      for (UcxRequest& r : reqs_) reap(r);
    }
  } catch (const Error&) {
    // A send failed or the stream broke: the endpoint is closed as it is.
  }
  bool clean = !err_->first && !pending();
  for (UcxRequest& r : reqs_) {  // UCP releases them when they complete
    if (r.ucx) api_.requestFree(r.ucx);
    if (r.ucx2) api_.requestFree(r.ucx2);
    r.ucx = r.ucx2 = nullptr;
  }
  releaseRemote(clean);
  w_->retire(ep_, clean, peerMode_);
  // Clean: every message posted is on its way. Else only those UCP completed are.
  sayGoodbye(clean ? posted_ : completed_);
}

bool UcxSender::reap(UcxRequest& r) {
  if (!r.ucx && !r.ucx2) return true;
  for (void** q : {&r.ucx, &r.ucx2}) {
    if (!*q) continue;
    ucs_status_t s = api_.requestCheckStatus(*q);
    if (s == UCS_INPROGRESS) return false;
    api_.requestFree(*q);
    *q = nullptr;
    if (s != UCS_OK)
      LOOM_THROW(kRemoteError, "%s: a send failed: %s (the receiver's process exited or its "
                 "host is unreachable)", who_.c_str(), api_.statusText(s).c_str());
  }
  ++completed_;
  return true;
}

void UcxSender::failIfBroken(double grace) {
  if (err_->first)
    LOOM_THROW(kRemoteError, "%s: the endpoint failed: %s (the receiver's process exited or "
               "its host is unreachable)", who_.c_str(), api_.statusText(err_->second).c_str());
  if (controlEnded() && endedFor(grace))
    LOOM_THROW(kRemoteError, "%s: the receiver closed the connection (process exited?)",
               who_.c_str());
}

}  // namespace loom::ucxnet
#endif
