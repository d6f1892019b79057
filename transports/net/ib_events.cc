#include "transports/net/ib_events.h"

#ifdef LOOM_VERBS_HEADERS
#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "base/time.h"

namespace loom::ibnet {
namespace {

constexpr uint64_t kEveryNs = 10'000'000;  // pending events are read at most this often

const char* eventId(ibv_event_type t) {
  switch (t) {
    case IBV_EVENT_DEVICE_FATAL: return "DEVICE_FATAL";
    case IBV_EVENT_QP_FATAL: return "QP_FATAL";
    case IBV_EVENT_QP_REQ_ERR: return "QP_REQ_ERR";
    case IBV_EVENT_QP_ACCESS_ERR: return "QP_ACCESS_ERR";
    case IBV_EVENT_CQ_ERR: return "CQ_ERR";
    case IBV_EVENT_PORT_ERR: return "PORT_ERR";
    case IBV_EVENT_PORT_ACTIVE: return "PORT_ACTIVE";
    case IBV_EVENT_GID_CHANGE: return "GID_CHANGE";
    case IBV_EVENT_LID_CHANGE: return "LID_CHANGE";
    default: return nullptr;
  }
}

}  // namespace

IbEvents::IbEvents(const IbvApi& api, ibv_context* ctx, int port, std::string label, bool failComms)
    : api_(api), ctx_(ctx), port_(port), label_(std::move(label)), failComms_(failComms) {
  int flags = fcntl(ctx_->async_fd, F_GETFL);
  if (flags < 0 || fcntl(ctx_->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    LOOM_WARN("NET/IB: %s: its asynchronous events cannot be read without blocking (%s); they are not read",
              label_.c_str(), strerror(errno));
    readable_ = false;
  }
}

void IbEvents::drainLocked() {
  nextNs_.store(nowNs() + kEveryNs, std::memory_order_relaxed);
  while (readable_) {
    ibv_async_event e{};
    if (api_.getAsyncEvent(ctx_, &e) != 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        LOOM_WARN("NET/IB: %s: reading its asynchronous events failed (%s); no more are read", label_.c_str(),
                  strerror(errno));
        readable_ = false;
      }
      return;
    }
    take(e);
    api_.ackAsyncEvent(&e);  // last: the event's QP or CQ may go once acknowledged
  }
}

void IbEvents::take(const ibv_async_event& e) {
  const char* name = api_.eventTypeStr(e.event_type);
  const char* id = eventId(e.event_type);
  std::string what = id ? strprintf("%s (IBV_EVENT_%s)", name, id)
                        : strprintf("%s (asynchronous event %d)", name, static_cast<int>(e.event_type));
  bool fatal = true;
  switch (e.event_type) {
    case IBV_EVENT_DEVICE_FATAL:
      deviceFatal_ = what;
      break;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
      qps_[e.element.qp->qp_num] = strprintf("%s on QP %u", what.c_str(), e.element.qp->qp_num);
      break;
    case IBV_EVENT_CQ_ERR:
      cqs_[e.element.cq] = what + " on a completion queue";
      break;
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_PORT_ACTIVE:
      fatal = false;
      if (e.element.port_num != port_) return;
      if (e.event_type == IBV_EVENT_PORT_ERR) {
        portDown_ = what;
        portDownAt_ = nowNs();
      } else {
        portDown_.clear();
      }
      break;
    case IBV_EVENT_COMM_EST:
      return;  // a QP's first message arrived: nothing to tell
    default:
      fatal = false;
      break;
  }
  if (fatal && failComms_) anyFatal_.store(true, std::memory_order_release);
  LOOM_WARN("NET/IB: %s: %s%s", label_.c_str(), what.c_str(),
            !fatal ? "" : failComms_ ? ": what it names fails" : " (NCCL_IB_RETURN_ASYNC_EVENTS=0: ignored)");
}

std::string IbEvents::fatalFor(ibv_qp* const* qps, int n, const ibv_cq* cq) {
  const bool due = nowNs() >= nextNs_.load(std::memory_order_relaxed);
  const bool fatal = anyFatal_.load(std::memory_order_acquire);
  if (!due && !fatal) return "";
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  if (due && lock.try_lock()) {
    drainLocked();
  } else {
    if (!fatal) return "";  // another thread is reading the events
    lock.lock();
  }
  if (!failComms_ || !anyFatal_.load(std::memory_order_acquire)) return "";
  if (!deviceFatal_.empty()) return label_ + " reported " + deviceFatal_;
  if (auto it = cqs_.find(cq); it != cqs_.end()) return label_ + " reported " + it->second;
  for (int i = 0; i < n; ++i)
    if (auto it = qps_.find(qps[i]->qp_num); it != qps_.end()) return label_ + " reported " + it->second;
  return "";
}

std::string IbEvents::portNote() {
  std::lock_guard<std::mutex> lock(mu_);
  drainLocked();
  if (portDown_.empty()) return "";
  const double ago = static_cast<double>(nowNs() - portDownAt_) * 1e-9;
  return strprintf("; %s reported its port down, %s, read %.1f s before", label_.c_str(), portDown_.c_str(), ago);
}

}  // namespace loom::ibnet
#endif
