#include "transports/net/ibv_api.h"

#include <mutex>

#include "base/dl.h"

namespace loom {

#ifdef LOOM_VERBS_HEADERS
bool verbsBuiltIn() { return true; }
std::string verbsUnavailable() { return ""; }

namespace {
// verbs.h inlines these through the provider's ops table.
int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) { return ibv_post_send(qp, wr, bad); }
int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return ibv_post_recv(qp, wr, bad); }
int pollCq(ibv_cq* cq, int n, ibv_wc* wc) { return ibv_poll_cq(cq, n, wc); }
}  // namespace

const IbvApi* ibvApi(std::string* why) {
  static std::once_flag once;
  static IbvApi* table = nullptr;
  static std::string* absence = nullptr;
  std::call_once(once, [] {
    std::string err;
    static DynLib lib = DynLib::open({"libibverbs.so.1"}, &err);
    if (!lib.loaded()) {
      absence = new std::string("libibverbs is not loadable: " + err);
      return;
    }
    auto* t = new IbvApi;
    // ibv_query_port and ibv_reg_mr are macros over inline helpers in verbs.h; the
    // exported symbols of those names are the plain calls.
    bool ok = lib.bind(t->getDeviceList, "ibv_get_device_list") &&
              lib.bind(t->freeDeviceList, "ibv_free_device_list") &&
              lib.bind(t->getDeviceName, "ibv_get_device_name") &&
              lib.bind(t->openDevice, "ibv_open_device") &&
              lib.bind(t->closeDevice, "ibv_close_device") &&
              lib.bind(t->queryDevice, "ibv_query_device") &&
              lib.bind(t->queryPort, "ibv_query_port") &&
              lib.bind(t->queryGid, "ibv_query_gid") &&
              lib.bind(t->allocPd, "ibv_alloc_pd") && lib.bind(t->deallocPd, "ibv_dealloc_pd") &&
              lib.bind(t->regMr, "ibv_reg_mr") && lib.bind(t->deregMr, "ibv_dereg_mr") &&
              lib.bind(t->createCq, "ibv_create_cq") && lib.bind(t->destroyCq, "ibv_destroy_cq") &&
              lib.bind(t->createQp, "ibv_create_qp") && lib.bind(t->modifyQp, "ibv_modify_qp") &&
              lib.bind(t->destroyQp, "ibv_destroy_qp") &&
              lib.bind(t->wcStatusStr, "ibv_wc_status_str") &&
              lib.bind(t->getAsyncEvent, "ibv_get_async_event") &&
              lib.bind(t->ackAsyncEvent, "ibv_ack_async_event") &&
              lib.bind(t->eventTypeStr, "ibv_event_type_str");
    if (ok) lib.bind(t->regDmabufMr, "ibv_reg_dmabuf_mr");
    if (ok) lib.bind(t->regMrIova2, "ibv_reg_mr_iova2");
    if (!ok) {
      absence = new std::string(lib.path() + " lacks a verbs call Loom needs");
      delete t;
      return;
    }
    t->postSend = postSend;
    t->postRecv = postRecv;
    t->pollCq = pollCq;
    table = t;
  });
  if (!table && why) *why = *absence;
  return table;
}

#else
bool verbsBuiltIn() { return false; }
std::string verbsUnavailable() {
  return "this Loom was built without libibverbs' headers (Debian: libibverbs-dev)";
}
#endif

}  // namespace loom
