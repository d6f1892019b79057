// The network seam: a NetBackend moves messages between two ranks, shaped like NCCL's
// ncclNet (v8) so that TCP, InfiniBand verbs, UCX and NCCL net plugins all fit behind it:
// devices and their properties, listen → an opaque handle the peer connects to, connect
// and accept (non-blocking: null means "call again"), memory registration, isend/irecv
// returning requests that test() completes, iflush for data a NIC wrote to GPU memory.
// One generic transport (net_transport.h) pumps FIFO slots through any backend.
//
// Differences from ncclNet, all C++ idiom: comms and registrations are objects whose
// destructors are close*/deregMr; errors are loom::Error (a dead peer is kRemoteError);
// the calls that act on a comm are its methods.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/socket.h"
#include "bootstrap/unique_id.h"

namespace loom {

// ncclNet's NCCL_PTR_* bits: which memory a backend can send from and receive into.
enum NetPtrSupport : int { kNetPtrHost = 1, kNetPtrCuda = 2, kNetPtrDmaBuf = 4 };

struct NetProperties {
  std::string name;     // the device ("eth0", "mlx5_0")
  std::string pciPath;  // sysfs path of the device, empty where there is none
  uint64_t guid = 0;
  int ptrSupport = kNetPtrHost;
  int speedMbps = 0;
  int port = 0;
  int latencyUs = 0;
  int maxComms = 65536;
  int maxRecvs = 1;  // receives that one irecv may group (Loom posts one)
  size_t maxMessageBytes = SIZE_MAX;
};

// What a receiver's listen() publishes and a sender's connect() reads: a peer's copy, so
// backends check it. As large as NCCL_NET_HANDLE_MAXSIZE.
constexpr size_t kNetHandleBytes = 128;
struct NetHandle {
  uint8_t bytes[kNetHandleBytes];
};

// A backend's progress between the calls of a non-blocking connect() or accept().
class NetStage {
 public:
  virtual ~NetStage() = default;
};

// Memory registered with a comm (regMr); destroying it is deregMr. Must not outlive its comm.
class NetMr {
 public:
  virtual ~NetMr() = default;
};

// An operation in flight. Owned by the comm that made it; invalid once test() said done.
class NetRequest {
 public:
  virtual ~NetRequest() = default;
};

enum class NetMemType { kHost, kCuda };

// regMrDmaBuf of a backend whose devices do not offer kNetPtrDmaBuf (TCP, UCX; verbs and
// plugins override it): throws kInternalError naming `what`. DeviceNet registers a DMA-BUF
// only with a device that offers it, so this answers a caller that did not ask.
[[noreturn]] void netNoDmaBuf(const char* what);

class NetSendComm {
 public:
  virtual ~NetSendComm() = default;  // closeSend
  virtual std::unique_ptr<NetMr> regMr(void* data, size_t bytes, NetMemType type) = 0;
  // GPU memory by its DMA-BUF file descriptor (`offset` into it), for a backend whose
  // device has kNetPtrDmaBuf.
  virtual std::unique_ptr<NetMr> regMrDmaBuf(void* data, size_t bytes, int fd, uint64_t offset) {
    (void)data, (void)bytes, (void)fd, (void)offset;
    netNoDmaBuf("a send comm");
  }
  // Starts sending `bytes` at `data` (inside `mr`). Null: too many requests in flight,
  // call again later. Messages arrive in the order they were posted.
  virtual NetRequest* isend(const void* data, size_t bytes, int tag, NetMr* mr) = 0;
  // Moves the request on; true once it is complete (`*bytes` = its size) and `data` may
  // be reused. Throws kRemoteError when the peer is gone.
  virtual bool test(NetRequest* req, size_t* bytes) = 0;
};

class NetRecvComm {
 public:
  virtual ~NetRecvComm() = default;  // closeRecv
  virtual std::unique_ptr<NetMr> regMr(void* data, size_t bytes, NetMemType type) = 0;
  virtual std::unique_ptr<NetMr> regMrDmaBuf(void* data, size_t bytes, int fd, uint64_t offset) {
    (void)data, (void)bytes, (void)fd, (void)offset;
    netNoDmaBuf("a receive comm");
  }
  // Posts a receive of at most `capacity` bytes into `data`; matched with sends in order.
  // Null: call again later.
  virtual NetRequest* irecv(void* data, size_t capacity, int tag, NetMr* mr) = 0;
  // Makes data received into GPU memory visible to the GPU. Null: nothing to flush
  // (host memory, or a NIC that writes in order).
  virtual NetRequest* iflush(void* data, size_t bytes, NetMr* mr) = 0;
  // As NetSendComm::test; `*bytes` is what the sender sent. A sender that closed its
  // comm between messages is reported (kRemoteError) only by a request that needs it.
  virtual bool test(NetRequest* req, size_t* bytes) = 0;
};

class NetListenComm {
 public:
  virtual ~NetListenComm() = default;  // closeListen
  // The next connection made to this listener's handle. Non-blocking: null while it is
  // not here yet; call again with the same `stage`.
  virtual std::unique_ptr<NetRecvComm> accept(std::unique_ptr<NetStage>& stage) = 0;
  // Whether a connection may still be on its way to accept() even though its sender is
  // known to be gone (it connected, then exited). Backends that cannot tell say no.
  virtual bool mayStillArrive() const { return false; }
};

class NetBackend {
 public:
  virtual ~NetBackend() = default;
  virtual int devices() = 0;
  virtual NetProperties properties(int dev) = 0;
  // Starts listening on `dev` for one connection; `*handle` is what the peer needs.
  virtual std::unique_ptr<NetListenComm> listen(int dev, NetHandle* handle) = 0;
  // Connects to the listener `handle` describes. Non-blocking: null while the connection
  // is being made; call again with the same `stage`.
  virtual std::unique_ptr<NetSendComm> connect(int dev, const NetHandle& handle,
                                               std::unique_ptr<NetStage>& stage) = 0;
};

// What a backend instance knows of the ranks it serves (one instance per communicator):
// backends that authenticate connections, as Loom's own do, use the job's secret.
struct NetContext {
  JobId job;
  int rank;
  int nranks;
  NetInterface iface;  // the bootstrap interface (NCCL_SOCKET_IFNAME)
};

struct NetBackendSpec {
  std::string name;  // what NCCL_NET names (compared without case)
  std::function<std::unique_ptr<NetBackend>(const NetContext&)> make;
};

// Every backend this process offers, in order (the first is the default).
std::vector<NetBackendSpec> netBackends();
// The backend `name` names (case-insensitive, as NCCL compares NCCL_NET); throws
// kInvalidArgument naming those that exist when there is none.
NetBackendSpec findNetBackend(const std::string& name);
// NCCL_NET: the backend every network connection uses; empty: the first NCCL net plugin
// that starts, else the built-in socket transport carries them instead of the generic pump.
std::string selectedNetBackend();

struct StartedNet {
  std::unique_ptr<NetBackend> backend;  // null: the built-in socket transport
  std::string name;
};
// The backend one communicator's network connections use: NCCL_NET's (throws if it
// cannot start or has no device); unset, the first plugin whose init succeeds with
// devices (those that fail are logged and skipped, as NCCL does), else none.
StartedNet startNetBackend(const NetContext& ctx);

}  // namespace loom
