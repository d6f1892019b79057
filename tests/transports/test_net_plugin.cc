// An NCCL net plugin of Loom's tests, built once per ABI version (LOOM_TEST_NET_VERSION,
// 6..11) into libnccl-net-loomtest-v<N>.so, exporting only ncclNetPlugin_v<N>. A real
// network: TCP over loopback, non-blocking throughout (connect keeps its progress in the
// handle, as NCCL's own plugins do), each message an 8-byte length and the bytes.
//
// LOOM_TEST_NET_MODE makes it misbehave, read at init:
//   init_fails      init returns ncclSystemError
//   zero_devices    devices() reports 0
//   connect_never   connect never completes (always a null comm)
//   connect_after_accept  connect completes only once the peer's accept has run (it
//                   waits for a byte that accept sends), as IB-style handshakes do
//   null_requests   every other isend/irecv returns a null request ("call again")
//   wrong_sizes     test() reports each receive after a comm's first one byte larger than
//                   its buffer
//   irecv_fails_from  irecv returns ncclSystemError once the comm has posted
//                   LOOM_TEST_NET_FAIL_AT requests (its first, 0, is Loom's authentication)
//   setenv          init calls setenv() many times (as some plugins tune NCCL that way)
//   dmabuf          its devices also take GPU memory through DMA-BUF (NCCL_PTR_CUDA |
//                   NCCL_PTR_DMABUF): regMrDmaBuf maps the descriptor (the stand-in CUDA
//                   driver's device memory is a memfd) and sends reach that memory through
//                   the mapping, as a NIC's DMA would; a receive into it lands in a buffer
//                   of the plugin's own and reaches the memory only when a flush (iflush,
//                   done when tested) covers it, so that a reader who does not flush first
//                   sees stale bytes. It counts "regMrDmaBuf" and "iflush" (below)
// LOOM_TEST_NET_DEVICES=N (default 1) gives it N devices, "rails" of a fabric without
// cross-rail links: a connect on another device than its listener's is refused (unless
// LOOM_TEST_NET_CROSS_RAIL=1 links the rails). It counts
// its inits, finalizes, listens and connects per device ("listen-dev1"), and whether
// Loom's proxy thread or another tested requests, in LOOM_TEST_NET_COUNTS (a file path), if
// set. It listens on loopback, or with LOOM_TEST_NET_ADDR=auto on the first IPv4 address of an
// interface that is up and not loopback (a network namespace's own address).
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "transports/net/plugin_abi.h"

#ifndef LOOM_TEST_NET_VERSION
#error "define LOOM_TEST_NET_VERSION (6..11)"
#endif

// Each version's build uses the signatures of its own version only.
#pragma GCC diagnostic ignored "-Wunused-function"

namespace {

using namespace loom::netabi;  // NOLINT(google-build-using-namespace)
constexpr int V = LOOM_TEST_NET_VERSION;
constexpr uint32_t kMagic = 0x4c4d5450;  // "LMTP"

std::string gMode;

struct Handle {  // inside NCCL's 128-byte handle
  uint32_t magic;
  uint32_t addr;  // IPv4, network order
  uint16_t port;
  uint16_t version;
  int stageFd;  // connect's progress: the socket + 1 while connecting
  int awaitingAck;  // connect_after_accept: connected, waiting for accept's byte
  int dev;          // the listener's device
};
static_assert(sizeof(Handle) <= kHandleMaxSize);

struct Comm;
struct Req {
  Comm* comm = nullptr;
  bool used = false, done = false;
  char* data = nullptr;
  size_t size = 0;  // send: bytes; receive: capacity
  uint64_t len = 0;  // the message's length (from the header on receive)
  size_t moved = 0;  // header + payload bytes moved so far
  char* shadow = nullptr;  // dmabuf mode: a receive's own buffer (data), for ...
  char* target = nullptr;  // ... this place in the registered memory, at the next flush
  uint64_t index = 0;  // the comm's requests before this one (0: Loom's authentication)
};
struct Unflushed {
  char* shadow;
  char* target;
  size_t len;
};
struct Comm {
  int fd = -1;
  bool send = false;
  Req reqs[kMaxRequests];
  int head = 0, count = 0;  // requests in posting order: reqs[head .. head+count)
  int calls = 0;
  uint64_t posted = 0;  // requests posted
  int received = 0;  // receives completed
  bool failed = false;
  Req flush;  // dmabuf mode: the flush in flight
  std::vector<Unflushed> unflushed;  // receives complete, not yet in the registered memory
};
struct Listen {
  int fd = -1;
};
// A DMA-BUF registration (dmabuf mode): the memory at `base` reached through `alias`.
constexpr uint32_t kDmaBufMagic = 0x444d4142;  // "DMAB"
struct DmaBufMr {
  uint32_t magic = kDmaBufMagic;
  char* base = nullptr;
  size_t size = 0;
  char* alias = nullptr;
};
// Where the plugin reads or writes `data`: through the mapping of its DMA-BUF, if any.
void* reach(void* mh, void* data) {
  auto* m = static_cast<DmaBufMr*>(mh);
  if (!m || m->magic != kDmaBufMagic) return data;
  return m->alias + (static_cast<char*>(data) - m->base);
}

void countEvent(const char* what) {
  const char* path = getenv("LOOM_TEST_NET_COUNTS");
  if (!path) return;
  if (FILE* f = fopen(path, "a")) {
    fprintf(f, "%s v%d\n", what, V);
    fclose(f);
  }
}

int nonblock(int fd) { return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Moves the oldest requests on; a request completes only after those before it.
Result progress(Comm* c) {
  while (c->count > 0 && !c->failed) {
    Req& r = c->reqs[c->head];
    for (;;) {
      char* base;
      size_t left;
      if (r.moved < 8) {
        base = reinterpret_cast<char*>(&r.len) + r.moved;
        left = 8 - r.moved;
      } else {
        if (!c->send && r.len > r.size) {
          c->failed = true;  // larger than the receive: an error, nothing written
          return kInvalidUsage;
        }
        size_t at = r.moved - 8;
        if (at == r.len) break;
        base = r.data + at;
        left = static_cast<size_t>(r.len) - at;
      }
      ssize_t k = c->send ? ::send(c->fd, base, left, MSG_NOSIGNAL) : ::recv(c->fd, base, left, 0);
      if (k > 0) {
        r.moved += static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return kOk;
      c->failed = true;  // the peer closed or the connection broke
      return kSystemError;
    }
    r.done = true;
    if (r.shadow) c->unflushed.push_back({r.shadow, r.target, static_cast<size_t>(r.len)});
    r.shadow = nullptr;
    c->head = (c->head + 1) % kMaxRequests;
    --c->count;
  }
  return c->failed ? kSystemError : kOk;
}

Result post(Comm* c, void* data, size_t size, void** request) {
  *request = nullptr;
  if (gMode == "null_requests" && (c->calls++ % 2 == 0)) return kOk;
  if (c->count == kMaxRequests) return kOk;
  int slot = (c->head + c->count) % kMaxRequests;
  Req& r = c->reqs[slot];
  if (r.used) return kOk;  // a completed request not yet tested
  r = Req{};
  r.comm = c;
  r.used = true;
  r.data = static_cast<char*>(data);
  r.size = size;
  r.index = c->posted++;
  if (c->send) r.len = size;
  ++c->count;
  *request = &r;
  return kOk;
}

// ---- the interface, version by version where it differs ----

Result initCommon() {
  // v11 inits run concurrently (a communicator each): the mode is written only when a
  // test changed it between inits, never while other communicators read it.
  static std::mutex mu;
  {
    const char* m = getenv("LOOM_TEST_NET_MODE");
    std::lock_guard<std::mutex> lk(mu);
    if (gMode != (m ? m : "")) gMode = m ? m : "";
  }
  countEvent("init");
  if (gMode == "setenv")
    for (int i = 0; i < 200; ++i)
      setenv("LOOM_TEST_NET_TUNED", std::to_string(i).c_str(), 1);
  return gMode == "init_fails" ? kSystemError : kOk;
}

int deviceCount() {
  const char* d = getenv("LOOM_TEST_NET_DEVICES");
  int n = d ? atoi(d) : 1;
  return n < 1 ? 1 : n > 8 ? 8 : n;
}

Result devices(int* n) {
  *n = gMode == "zero_devices" ? 0 : deviceCount();
  return kOk;
}

template <class Props>
Result getProperties(int dev, Props* p) {
  if (dev < 0 || dev >= deviceCount()) return kInvalidArgument;
  memset(p, 0, sizeof(*p));
  static char names[8][16] = {"loomtest-lo", "loomtest-lo1", "loomtest-lo2", "loomtest-lo3",
                              "loomtest-lo4", "loomtest-lo5", "loomtest-lo6", "loomtest-lo7"};
  p->name = names[dev];
  p->pciPath = nullptr;
  p->guid = 0x4c4f4f4d00000000ull + V;
  p->ptrSupport = gMode == "dmabuf" ? kPtrHost | kPtrCuda | kPtrDmaBuf : kPtrHost;
  p->speed = 10000;
  p->port = 1;
  p->latency = 5.0f;
  p->maxComms = 4096;
  p->maxRecvs = 1;
  if constexpr (requires { p->maxP2pBytes; }) {
    p->vProps.ndevs = 1;
    p->maxP2pBytes = size_t(1) << 40;
    p->maxCollBytes = size_t(1) << 40;
  }
  if constexpr (requires { p->maxMultiRequestSize; }) p->maxMultiRequestSize = 1;
  return kOk;
}

uint32_t listenAddr() {
  const char* want = getenv("LOOM_TEST_NET_ADDR");
  uint32_t addr = htonl(INADDR_LOOPBACK);
  ifaddrs* all = nullptr;
  if (!want || strcmp(want, "auto") != 0 || getifaddrs(&all) != 0) return addr;
  for (ifaddrs* i = all; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
        !(i->ifa_flags & IFF_LOOPBACK)) {
      addr = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
      break;
    }
  freeifaddrs(all);
  return addr;
}

Result listenImpl(int dev, void* handle, void** listenComm) {
  *listenComm = nullptr;
  if (dev < 0 || dev >= deviceCount()) return kInvalidArgument;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return kSystemError;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = listenAddr();
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || nonblock(fd) != 0) {
    close(fd);
    return kSystemError;
  }
  Handle h{kMagic, a.sin_addr.s_addr, ntohs(a.sin_port), static_cast<uint16_t>(V), 0, 0, dev};
  memcpy(handle, &h, sizeof(h));
  countEvent(("listen-dev" + std::to_string(dev)).c_str());
  *listenComm = new Listen{fd};
  return kOk;
}

Comm* makeComm(int fd, bool send) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  nonblock(fd);
  auto* c = new Comm;
  c->fd = fd;
  c->send = send;
  return c;
}

Result connectImpl(int dev, void* handle, void** sendComm) {
  *sendComm = nullptr;
  Handle h;
  memcpy(&h, handle, sizeof(h));
  if (h.magic != kMagic) return kInvalidArgument;
  // No cross-rail links unless LOOM_TEST_NET_CROSS_RAIL=1 links them.
  const char* cross = getenv("LOOM_TEST_NET_CROSS_RAIL");
  if (dev != h.dev && !(cross && strcmp(cross, "1") == 0)) return kInvalidArgument;
  if (gMode == "connect_never") return kOk;
  if (h.stageFd == 0) {
    countEvent(("connect-dev" + std::to_string(dev)).c_str());
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return kSystemError;
    nonblock(fd);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = h.addr;
    a.sin_port = htons(h.port);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
      close(fd);
      return kSystemError;
    }
    h.stageFd = fd + 1;
    memcpy(handle, &h, sizeof(h));
    return kOk;  // call again
  }
  int fd = h.stageFd - 1;
  if (!h.awaitingAck) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, 0) == 0) return kOk;
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      h.stageFd = 0;
      memcpy(handle, &h, sizeof(h));
      close(fd);
      return kSystemError;
    }
    h.awaitingAck = gMode == "connect_after_accept";
    memcpy(handle, &h, sizeof(h));
  }
  if (h.awaitingAck) {
    char ack;
    ssize_t k = recv(fd, &ack, 1, 0);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return kOk;
    if (k != 1) {
      h.stageFd = 0;
      memcpy(handle, &h, sizeof(h));
      close(fd);
      return kSystemError;
    }
  }
  h.stageFd = 0;
  h.awaitingAck = 0;
  memcpy(handle, &h, sizeof(h));
  *sendComm = makeComm(fd, true);
  return kOk;
}

Result acceptImpl(void* listenComm, void** recvComm) {
  *recvComm = nullptr;
  int fd = accept(static_cast<Listen*>(listenComm)->fd, nullptr, nullptr);
  if (fd < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? kOk : kSystemError;
  if (gMode == "connect_after_accept") {
    char ack = 'A';
    if (send(fd, &ack, 1, MSG_NOSIGNAL) != 1) {
      close(fd);
      return kSystemError;
    }
  }
  *recvComm = makeComm(fd, false);
  return kOk;
}

Result regMrImpl(void*, void*, size_t, int type, void** mhandle) {
  if (type != kPtrHost) return kInternalError;
  static int token;
  *mhandle = &token;
  return kOk;
}
Result regMrDmaBuf(void*, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle) {
  if (gMode != "dmabuf" || type != kPtrCuda || fd < 0) return kInternalError;
  void* alias = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (alias == MAP_FAILED) return kSystemError;
  auto* m = new DmaBufMr;
  m->base = static_cast<char*>(data);
  m->size = size;
  m->alias = static_cast<char*>(alias);
  *mhandle = m;
  countEvent("regMrDmaBuf");
  return kOk;
}
Result deregMr(void*, void* mhandle) {
  auto* m = static_cast<DmaBufMr*>(mhandle);
  if (m && m->magic == kDmaBufMagic) {
    munmap(m->alias, m->size);
    delete m;
  }
  return kOk;
}

Result isendImpl(void* comm, void* data, size_t size, void* mh, void** request) {
  return post(static_cast<Comm*>(comm), reach(mh, data), size, request);
}
Result irecvImpl(void* comm, int n, void** data, size_t size, void* mh, void** request) {
  if (n != 1) return kInternalError;  // maxRecvs is 1
  if (gMode == "irecv_fails_from") {
    const char* at = getenv("LOOM_TEST_NET_FAIL_AT");
    if (static_cast<Comm*>(comm)->posted >= strtoull(at ? at : "0", nullptr, 10)) {
      *request = nullptr;
      return kSystemError;
    }
  }
  auto* m = static_cast<DmaBufMr*>(mh);
  if (!m || m->magic != kDmaBufMagic) return post(static_cast<Comm*>(comm), data[0], size, request);
  char* shadow = static_cast<char*>(malloc(size ? size : 1));
  Result rc = post(static_cast<Comm*>(comm), shadow, size, request);
  if (!*request) {
    free(shadow);
    return rc;
  }
  auto* r = static_cast<Req*>(*request);
  r->shadow = shadow;
  r->target = static_cast<char*>(reach(mh, data[0]));
  return rc;
}
// dmabuf mode: the receives' bytes are in the memory already (no NIC caches them): a
// request that is done, one at a time.
Result iflush(void* comm, int n, void**, int*, void** mhandles, void** request) {
  *request = nullptr;
  auto* m = static_cast<DmaBufMr*>(mhandles ? mhandles[0] : nullptr);
  if (gMode != "dmabuf" || n != 1 || !m || m->magic != kDmaBufMagic) return kInternalError;
  auto* c = static_cast<Comm*>(comm);
  if (c->flush.used) return kInternalError;
  c->flush = Req{};
  c->flush.comm = c;
  c->flush.used = c->flush.done = true;
  countEvent("iflush");
  *request = &c->flush;
  return kOk;
}
// Which threads test data requests (not a comm's first, Loom's authentication, which its
// init tests): Loom's proxy thread ("loom-proxy") or another (a rank's own, driving the
// network while it waits), each counted once per process.
void countTestingThread() {
  static std::mutex mu;
  static pid_t pid = 0;  // the process the flags are of (a forked rank starts afresh)
  static bool proxy = false, other = false;
  char name[16] = "";
  pthread_getname_np(pthread_self(), name, sizeof(name));
  bool onProxy = strcmp(name, "loom-proxy") == 0;
  std::lock_guard<std::mutex> g(mu);
  if (pid != getpid()) {
    pid = getpid();
    proxy = other = false;
  }
  bool& seen = onProxy ? proxy : other;
  if (seen) return;
  seen = true;
  countEvent(onProxy ? "test on loom-proxy" : "test on another thread");
}

Result test(void* request, int* done, int* sizes) {
  auto* r = static_cast<Req*>(request);
  *done = 0;
  if (r->index > 0 && r != &r->comm->flush) countTestingThread();
  if (r == &r->comm->flush) {  // the receives completed so far reach the registered memory
    for (const Unflushed& u : r->comm->unflushed) {
      memcpy(u.target, u.shadow, u.len);
      free(u.shadow);
    }
    r->comm->unflushed.clear();
  }
  // A request that completed before the connection broke still reports done.
  Result rc = r->done ? kOk : progress(r->comm);
  if (!r->done) return rc;
  *done = 1;
  bool lie = gMode == "wrong_sizes" && !r->comm->send && r->comm->received++ > 0;
  if (sizes) *sizes = lie ? static_cast<int>(r->size) + 1 : static_cast<int>(r->len);
  r->used = false;
  return kOk;
}
Result closeComm(void* comm) {
  auto* c = static_cast<Comm*>(comm);
  for (const Unflushed& u : c->unflushed) free(u.shadow);
  for (Req& r : c->reqs) free(r.shadow);
  close(c->fd);
  delete c;
  return kOk;
}
Result closeListen(void* listenComm) {
  auto* l = static_cast<Listen*>(listenComm);
  close(l->fd);
  delete l;
  return kOk;
}
Result getDeviceMr(void*, void*, void**) { return kInternalError; }
Result irecvConsumed(void*, int, void*) { return kOk; }

// Signatures that differ per version.
Result init6(Logger) { return initCommon(); }
Result init10(Logger, ProfilerCallback) { return initCommon(); }
Result init11(void** ctx, uint64_t commId, CommConfig* config, Logger, ProfilerCallback) {
  *ctx = reinterpret_cast<void*>(static_cast<uintptr_t>(commId | 1));
  return initCommon();
}
Result finalize11(void* ctx) {
  countEvent(ctx ? "finalize" : "finalize-null");
  return kOk;
}
Result setNetAttr11(void*, NetAttr*) { return kOk; }
Result listen11(void*, int dev, void* h, void** l) { return listenImpl(dev, h, l); }
Result connect6(int dev, void* h, void** s) { return connectImpl(dev, h, s); }
Result connect7(int dev, void* h, void** s, DeviceHandle**) { return connectImpl(dev, h, s); }
Result connect10(int dev, CommConfig*, void* h, void** s, DeviceHandle**) {
  return connectImpl(dev, h, s);
}
Result connect11(void*, int dev, void* h, void** s, DeviceHandle**) {
  return connectImpl(dev, h, s);
}
Result accept6(void* l, void** r) { return acceptImpl(l, r); }
Result accept7(void* l, void** r, DeviceHandle**) { return acceptImpl(l, r); }
Result regMrInt(void* c, void* d, int size, int t, void** m) {
  return regMrImpl(c, d, static_cast<size_t>(size), t, m);
}
Result isendInt(void* c, void* d, int size, int, void* mh, void** r) {
  return isendImpl(c, d, static_cast<size_t>(size), mh, r);
}
Result isend9(void* c, void* d, size_t size, int, void* mh, void** r) {
  return isendImpl(c, d, size, mh, r);
}
Result isend10(void* c, void* d, size_t size, int, void* mh, void*, void** r) {
  return isendImpl(c, d, size, mh, r);
}
Result irecvInt(void* c, int n, void** d, int* sizes, int*, void** mh, void** r) {
  return irecvImpl(c, n, d, static_cast<size_t>(sizes[0]), mh ? mh[0] : nullptr, r);
}
Result irecv9(void* c, int n, void** d, size_t* sizes, int*, void** mh, void** r) {
  return irecvImpl(c, n, d, sizes[0], mh ? mh[0] : nullptr, r);
}
Result irecv10(void* c, int n, void** d, size_t* sizes, int*, void** mh, void**, void** r) {
  return irecvImpl(c, n, d, sizes[0], mh ? mh[0] : nullptr, r);
}

}  // namespace

#define LOOM_TEST_NET_COMMON_TAIL regMrDmaBuf, deregMr

#define LOOM_TEST_NET_EXPORT extern "C" __attribute__((visibility("default")))
#if LOOM_TEST_NET_VERSION == 6
LOOM_TEST_NET_EXPORT const NetV6 ncclNetPlugin_v6 = {
    "LoomTest", init6, devices, getProperties<PropsV6>, listenImpl, connect6, accept6, regMrInt,
    LOOM_TEST_NET_COMMON_TAIL, isendInt, irecvInt, iflush, test, closeComm, closeComm,
    closeListen};
#elif LOOM_TEST_NET_VERSION == 7
LOOM_TEST_NET_EXPORT const NetV7 ncclNetPlugin_v7 = {
    "LoomTest", init6, devices, getProperties<PropsV7>, listenImpl, connect7, accept7, regMrInt,
    LOOM_TEST_NET_COMMON_TAIL, isendInt, irecvInt, iflush, test, closeComm, closeComm,
    closeListen, getDeviceMr, irecvConsumed};
#elif LOOM_TEST_NET_VERSION == 8
LOOM_TEST_NET_EXPORT const NetV8 ncclNetPlugin_v8 = {
    "LoomTest", init6, devices, getProperties<PropsV8>, listenImpl, connect7, accept7, regMrImpl,
    LOOM_TEST_NET_COMMON_TAIL, isendInt, irecvInt, iflush, test, closeComm, closeComm,
    closeListen, getDeviceMr, irecvConsumed};
#elif LOOM_TEST_NET_VERSION == 9
LOOM_TEST_NET_EXPORT const NetV9 ncclNetPlugin_v9 = {
    "LoomTest", init6, devices, getProperties<PropsV9>, listenImpl, connect7, accept7, regMrImpl,
    LOOM_TEST_NET_COMMON_TAIL, isend9, irecv9, iflush, test, closeComm, closeComm,
    closeListen, getDeviceMr, irecvConsumed, nullptr};
#elif LOOM_TEST_NET_VERSION == 10
LOOM_TEST_NET_EXPORT const NetV10 ncclNetPlugin_v10 = {
    "LoomTest", init10, devices, getProperties<PropsV10>, listenImpl, connect10, accept7,
    regMrImpl, LOOM_TEST_NET_COMMON_TAIL, isend10, irecv10, iflush, test, closeComm, closeComm,
    closeListen, getDeviceMr, irecvConsumed, nullptr};
#elif LOOM_TEST_NET_VERSION == 11
#ifdef LOOM_TEST_NET_ALSO_V6
// Also an older interface under another name: loaders must take the newest.
LOOM_TEST_NET_EXPORT const NetV6 ncclNetPlugin_v6 = {
    "LoomTestOld", init6, devices, getProperties<PropsV6>, listenImpl, connect6, accept6,
    regMrInt, LOOM_TEST_NET_COMMON_TAIL, isendInt, irecvInt, iflush, test, closeComm, closeComm,
    closeListen};
#endif
LOOM_TEST_NET_EXPORT const NetV11 ncclNetPlugin_v11 = {
    "LoomTest", init11, devices, getProperties<PropsV11>, listen11, connect11, accept7,
    regMrImpl, LOOM_TEST_NET_COMMON_TAIL, isend10, irecv10, iflush, test, closeComm, closeComm,
    closeListen, getDeviceMr, irecvConsumed, nullptr, finalize11, setNetAttr11};
#endif
