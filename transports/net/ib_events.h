// The asynchronous events of an opened RDMA device, handled as NCCL's async thread handles
// them but read without a thread: whoever polls a connection on the device reads what is
// pending (non-blocking, at most every 10 ms), so events are read only while some
// connection of the device is polled. As NCCL (NCCL_IB_RETURN_ASYNC_EVENTS=1, the
// default), a fatal event fails what it names: IBV_EVENT_DEVICE_FATAL every connection of
// the device, IBV_EVENT_QP_FATAL / _QP_REQ_ERR / _QP_ACCESS_ERR the connection of that
// queue pair, IBV_EVENT_CQ_ERR the connection of that completion queue, each with
// kSystemError naming the event; 0 only logs them. Other events (the port going down or
// up, GID changes) are logged; the port's last "down" is added to a failed write's message,
// so that a local link going down is told from a peer that died.
#pragma once

#include "transports/net/ibv_api.h"

#ifdef LOOM_VERBS_HEADERS
#include <atomic>
#include <map>
#include <mutex>
#include <string>

namespace loom::ibnet {

class IbEvents {
 public:
  // Makes the context's async fd non-blocking. `label`: "rxe0:1".
  IbEvents(const IbvApi& api, ibv_context* ctx, int port, std::string label, bool failComms);
  IbEvents(const IbEvents&) = delete;
  IbEvents& operator=(const IbEvents&) = delete;

  // Why a connection with these QPs and this CQ must fail ("" while none): reads pending
  // events first when due (unless another thread is reading them).
  std::string fatalFor(ibv_qp* const* qps, int n, const ibv_cq* cq);
  // "; rxe0:1 reported its port down, port error (IBV_EVENT_PORT_ERR), read 1.2 s before"
  // while the port's last word was "down", else "". Reads pending events first.
  std::string portNote();
  // Forgets what events said of these QPs and CQ and runs `destroy` (which destroys them)
  // under the lock, so that no event about them is taken in between: their QP numbers and
  // the CQ's address may be reused. Every event is acknowledged under the lock, so
  // ibv_destroy_qp waits on no other thread here.
  template <typename F>
  void forget(ibv_qp* const* qps, int n, const ibv_cq* cq, F destroy) {
    std::lock_guard<std::mutex> lock(mu_);
    cqs_.erase(cq);
    for (int i = 0; i < n; ++i) qps_.erase(qps[i]->qp_num);
    destroy();
    anyFatal_.store(failComms_ && (!deviceFatal_.empty() || !qps_.empty() || !cqs_.empty()),
                    std::memory_order_release);
  }

 private:
  void drainLocked();
  void take(const ibv_async_event& e);

  const IbvApi& api_;
  ibv_context* ctx_;
  int port_;
  std::string label_;
  bool failComms_;
  std::mutex mu_;
  std::atomic<uint64_t> nextNs_{0};  // base/time.h nowNs
  std::atomic<bool> anyFatal_{false};
  bool readable_ = true;  // false once reading failed for good
  std::string deviceFatal_;
  std::map<uint32_t, std::string> qps_;  // by QP number
  std::map<const ibv_cq*, std::string> cqs_;
  std::string portDown_;  // the event's name while the port's last event said down
  uint64_t portDownAt_ = 0;  // nowNs
};

}  // namespace loom::ibnet
#endif
