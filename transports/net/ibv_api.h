// libibverbs as Loom reaches it: a table of the calls, filled through dlopen
// (libibverbs.so.1; nothing links against it, so libloom loads where there is no RDMA
// stack). The data-path calls that verbs.h inlines (post_send, post_recv, poll_cq) are
// entries too, so that tests can hand the backend a copy of the real table with failures
// injected (a QP that cannot be created, a completion with an error status).
#pragma once

#include <cstdint>
#include <string>

#if __has_include(<infiniband/verbs.h>)
#include <infiniband/verbs.h>
#define LOOM_VERBS_HEADERS 1
#endif

namespace loom {

// Whether this Loom was built with libibverbs' headers; if not, why it has no verbs.
bool verbsBuiltIn();
std::string verbsUnavailable();

#ifdef LOOM_VERBS_HEADERS
struct IbvApi {
  ibv_device** (*getDeviceList)(int*) = nullptr;
  void (*freeDeviceList)(ibv_device**) = nullptr;
  const char* (*getDeviceName)(ibv_device*) = nullptr;
  ibv_context* (*openDevice)(ibv_device*) = nullptr;
  int (*closeDevice)(ibv_context*) = nullptr;
  int (*queryDevice)(ibv_context*, ibv_device_attr*) = nullptr;
  int (*queryPort)(ibv_context*, uint8_t, ibv_port_attr*) = nullptr;
  int (*queryGid)(ibv_context*, uint8_t, int, ibv_gid*) = nullptr;
  ibv_pd* (*allocPd)(ibv_context*) = nullptr;
  int (*deallocPd)(ibv_pd*) = nullptr;
  ibv_mr* (*regMr)(ibv_pd*, void*, size_t, int) = nullptr;
  int (*deregMr)(ibv_mr*) = nullptr;
  ibv_cq* (*createCq)(ibv_context*, int, void*, ibv_comp_channel*, int) = nullptr;
  int (*destroyCq)(ibv_cq*) = nullptr;
  ibv_qp* (*createQp)(ibv_pd*, ibv_qp_init_attr*) = nullptr;
  int (*modifyQp)(ibv_qp*, ibv_qp_attr*, int) = nullptr;
  int (*destroyQp)(ibv_qp*) = nullptr;
  int (*postSend)(ibv_qp*, ibv_send_wr*, ibv_send_wr**) = nullptr;
  int (*postRecv)(ibv_qp*, ibv_recv_wr*, ibv_recv_wr**) = nullptr;
  int (*pollCq)(ibv_cq*, int, ibv_wc*) = nullptr;
  const char* (*wcStatusStr)(ibv_wc_status) = nullptr;
  int (*getAsyncEvent)(ibv_context*, ibv_async_event*) = nullptr;
  void (*ackAsyncEvent)(ibv_async_event*) = nullptr;
  const char* (*eventTypeStr)(ibv_event_type) = nullptr;
  // Optional (IBVERBS_1.8, rdma-core 28 and later): registration taking the optional access
  // flags, IBV_ACCESS_RELAXED_ORDERING among them (NCCL_IB_PCI_RELAXED_ORDERING).
  ibv_mr* (*regMrIova2)(ibv_pd*, void*, size_t, uint64_t iova, unsigned int access) = nullptr;
  // Optional (rdma-core 34 and later): GPU memory by its DMA-BUF.
  ibv_mr* (*regDmabufMr)(ibv_pd*, uint64_t offset, size_t length, uint64_t iova, int fd, int access) = nullptr;
};

// The process's table (loaded once); null with `*why` set when libibverbs is not there.
const IbvApi* ibvApi(std::string* why);
#endif

}  // namespace loom
