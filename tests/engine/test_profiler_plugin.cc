// Loom's test profiler plugin (an NCCL profiler plugin, engine/profiler_abi.h), built once per
// interface version as libnccl-profiler-loomtest-v<N>.so. It writes every call it gets, a
// line each, to the file LOOM_TEST_PROFILER_LOG names (appended whole by one write, so
// ranks that are processes may share the file):
//   init ctx=C rank=R nranks=N nnodes=K name=S hash=H
//   start ctx=C ev=E type=T parent=P rank=R <the descriptor's fields of that type>
//   state ev=E state=S ptimer=V
//   stop ev=E
//   finalize ctx=C
// Event and context numbers are this process's (P: the parent's number, 0 for none; a
// parent that is not one of this plugin's handles crashes the test, as it would a real
// plugin). LOOM_TEST_PROFILER_MASK sets the activation mask (default: every event);
// LOOM_TEST_PROFILER_FAIL_INIT=<rank> makes that rank's init fail.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "engine/profiler_abi.h"

#ifndef LOOM_TEST_PROFILER_VERSION
#error "LOOM_TEST_PROFILER_VERSION must be 3 (a symbol Loom refuses), 4, 5 or 6"
#endif

namespace {

using namespace loom::profabi;  // NOLINT(google-build-using-namespace)

constexpr uint32_t kMagic = 0x70726f66;
struct Handle {  // a context or an event
  uint32_t magic;
  int id;
  int ctx;
};
std::atomic<int> gNextId{1};
std::mutex gMu;

Handle* make(int ctx) {
  // Every handle, kept reachable: they outlive their stops. Made on first use, so that a
  // library that is only loaded and unloaded (the v3 one) allocates nothing.
  static auto* handles = new std::vector<Handle*>;
  auto* h = new Handle{kMagic, gNextId.fetch_add(1), ctx};
  std::lock_guard<std::mutex> lock(gMu);
  handles->push_back(h);
  return h;
}
int idOf(void* h) {
  if (!h) return 0;
  auto* x = static_cast<Handle*>(h);
  if (x->magic != kMagic) abort();  // not a handle of this plugin
  return x->id;
}

void line(const char* fmt, ...) {
  const char* path = getenv("LOOM_TEST_PROFILER_LOG");
  if (!path) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > static_cast<int>(sizeof(buf)) - 2) n = sizeof(buf) - 2;
  buf[n++] = '\n';
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  ssize_t w = write(fd, buf, static_cast<size_t>(n));
  (void)w;
  close(fd);
}

const char* str(const char* s) { return s ? s : "(null)"; }

Result init(void** context, int* mask, const char* name, uint64_t hash, int nNodes, int nranks, int rank) {
  const char* fail = getenv("LOOM_TEST_PROFILER_FAIL_INIT");
  if (fail && atoi(fail) == rank) return loom::netabi::kInternalError;
  const char* m = getenv("LOOM_TEST_PROFILER_MASK");
  __atomic_store_n(mask, m ? static_cast<int>(strtol(m, nullptr, 0)) : 0xfff, __ATOMIC_RELAXED);
  Handle* ctx = make(0);
  ctx->ctx = ctx->id;
  *context = ctx;
  line("init ctx=%d rank=%d nranks=%d nnodes=%d name=%s hash=%" PRIx64, ctx->id, rank, nranks, nNodes, str(name),
       hash);
  return kOk;
}

void collLine(int ctx, int id, uint64_t type, void* parent, int rank, const CollFields& c, void* parentGroup) {
  line("start ctx=%d ev=%d type=%" PRIu64 " parent=%d rank=%d group=%d seq=%" PRIu64
       " func=%s send=%p recv=%p count=%zu root=%d dtype=%s nch=%d nwarps=%d algo=%s proto=%s",
       ctx, id, type, idOf(parent), rank, idOf(parentGroup), c.seqNumber, str(c.func), c.sendBuff, c.recvBuff,
       c.count, c.root, str(c.datatype), c.nChannels, c.nWarps, str(c.algo), str(c.proto));
}

void p2pLine(int ctx, int id, uint64_t type, void* parent, int rank, const P2pFields& p, void* parentGroup) {
  line("start ctx=%d ev=%d type=%" PRIu64 " parent=%d rank=%d group=%d func=%s buff=%p count=%zu dtype=%s peer=%d "
       "nch=%d",
       ctx, id, type, idOf(parent), rank, idOf(parentGroup), str(p.func), p.buff, p.count, str(p.datatype), p.peer,
       p.nChannels);
}

void kernelChLine(int ctx, int id, uint64_t type, void* parent, int rank, const KernelChFields& k) {
  line("start ctx=%d ev=%d type=%" PRIu64 " parent=%d rank=%d channel=%d ptimer=%" PRIu64, ctx, id, type,
       idOf(parent), rank, k.channelId, k.pTimer);
}

Result stopEvent(void* h) {
  line("stop ev=%d", idOf(h));
  return kOk;
}

Result recordEventState(void* h, int state, StateArgs* args) {
  line("state ev=%d state=%d ptimer=%" PRIu64, idOf(h), state, args ? args->kernelCh.pTimer : 0);
  return kOk;
}

Result finalize(void* context) {
  line("finalize ctx=%d", idOf(context));
  return kOk;
}

#if LOOM_TEST_PROFILER_VERSION == 4
Result startEvent(void* context, void** h, DescrV4* d) {
  const int ctx = idOf(context);
  Handle* e = make(ctx);
  *h = e;
  switch (d->type) {
    case kColl: collLine(ctx, e->id, d->type, d->parentObj, d->rank, d->coll, nullptr); break;
    case kP2p: p2pLine(ctx, e->id, d->type, d->parentObj, d->rank, d->p2p, nullptr); break;
    case kKernelCh: kernelChLine(ctx, e->id, d->type, d->parentObj, d->rank, d->kernelCh); break;
    default:
      line("start ctx=%d ev=%d type=%d parent=%d rank=%d", ctx, e->id, d->type, idOf(d->parentObj), d->rank);
  }
  return kOk;
}

Result initV4(void** context, int* mask, const char* name, uint64_t hash, int nNodes, int nranks, int rank,
              Logger) {
  return init(context, mask, name, hash, nNodes, nranks, rank);
}
#else
Result startEvent(void* context, void** h, DescrV5* d) {
  const int ctx = idOf(context);
  Handle* e = make(ctx);
  *h = e;
  switch (d->type) {
    case kGroupApi:
      line("start ctx=%d ev=%d type=%d parent=%d rank=%d depth=%d captured=%d", ctx, e->id, kGroupApi,
           idOf(d->parentObj), d->rank, d->groupApi.groupDepth, d->groupApi.graphCaptured);
      break;
    case kCollApi:
      line("start ctx=%d ev=%d type=%d parent=%d rank=%d func=%s count=%zu dtype=%s root=%d stream=%p captured=%d",
           ctx, e->id, kCollApi, idOf(d->parentObj), d->rank, str(d->collApi.func), d->collApi.count,
           str(d->collApi.datatype), d->collApi.root, d->collApi.stream, d->collApi.graphCaptured);
      break;
    case kP2pApi:
      line("start ctx=%d ev=%d type=%d parent=%d rank=%d func=%s count=%zu dtype=%s stream=%p captured=%d", ctx,
           e->id, kP2pApi, idOf(d->parentObj), d->rank, str(d->p2pApi.func), d->p2pApi.count,
           str(d->p2pApi.datatype), d->p2pApi.stream, d->p2pApi.graphCaptured);
      break;
    case kColl: collLine(ctx, e->id, d->type, d->parentObj, d->rank, d->coll.c, d->coll.parentGroup); break;
    case kP2p: p2pLine(ctx, e->id, d->type, d->parentObj, d->rank, d->p2p.p, d->p2p.parentGroup); break;
    case kKernelCh: kernelChLine(ctx, e->id, d->type, d->parentObj, d->rank, d->kernelCh); break;
    default:
      line("start ctx=%d ev=%d type=%" PRIu64 " parent=%d rank=%d", ctx, e->id, d->type, idOf(d->parentObj),
           d->rank);
  }
  return kOk;
}

Result initV5(void** context, uint64_t commId, int* mask, const char* name, int nNodes, int nranks, int rank,
              Logger) {
  return init(context, mask, name, commId, nNodes, nranks, rank);
}
#endif

}  // namespace

#define LOOM_CAT2(a, b) a##b
#define LOOM_CAT(a, b) LOOM_CAT2(a, b)
#define LOOM_STR2(x) #x
#define LOOM_STR(x) LOOM_STR2(x)
#if LOOM_TEST_PROFILER_VERSION == 3
// Only a v3 table (its layout is not v5's; nothing calls it): Loom must refuse the library.
extern "C" __attribute__((visibility("default"))) const ProfilerV5 ncclProfiler_v3 = {
    "loomtest-v3", initV5, startEvent, stopEvent, recordEventState, finalize};
#elif LOOM_TEST_PROFILER_VERSION == 4
extern "C" __attribute__((visibility("default"))) const ProfilerV4 ncclProfiler_v4 = {
    "loomtest-v4", initV4, startEvent, stopEvent, recordEventState, finalize};
#else
extern "C" __attribute__((visibility("default"))) const ProfilerV5 LOOM_CAT(ncclProfiler_v,
                                                                             LOOM_TEST_PROFILER_VERSION) = {
    "loomtest-v" LOOM_STR(LOOM_TEST_PROFILER_VERSION), initV5, startEvent, stopEvent, recordEventState, finalize};
#endif
