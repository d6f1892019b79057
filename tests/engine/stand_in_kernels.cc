// A stand-in for libloom-cuda-kernels.so (a test aid, with the stand-in driver): the module's
// loomCudaReduce and loomCudaReduceMulti, computed by Loom's CPU reductions (kernels/reduce.h)
// in a host function on the caller's stand-in stream, which reads and writes the stand-in's
// device memory through the stand-in's own hooks (loomStandInReadDevice,
// loomStandInWriteDevice). Selected with LOOM_CUDA_KERNELS_LIBRARY; the real module runs the
// same arithmetic on a GPU (tests/kernels/cuda_parity_test.cc checks it against the CPU loops
// there).
//
// loomCudaInterpLaunch, the device executor's kernel, is the same plan interpreter
// (kernels/interp.h) run as the kernel runs it, with one host thread per channel for its one
// block per channel: one host function on the stream starts them and returns when all have
// ended, so the launch holds its stream as a running kernel does. They work in device memory
// in place, through the stand-in's read-write view of it (loomStandInHostView), since FIFO
// counters and LL lines are polled and written with atomics by the peers' launches on other
// streams (or in other processes, through CUDA IPC). Statuses, the abort word and the step
// counters' write-back are the kernel's; the arithmetic is the CPU loops' (bit-identical).
#include <dlfcn.h>
#include <sched.h>
#include <time.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "kernels/arith.h"
#include "kernels/cpu_step_ops.h"
#include "kernels/cuda/cuda_kernels_abi.h"
#include "kernels/interp.h"
#include "kernels/reduce.h"

namespace {

using HostFn = void (*)(void*);
using MoveFn = void (*)(void* dst, const void* src, size_t n);
int (*gLaunchHostFunc)(void* stream, HostFn fn, void* user) = nullptr;
int (*gIsCapturing)(void* stream, int* status) = nullptr;
MoveFn gRead = nullptr, gWrite = nullptr;
void* (*gHostView)(const void* p) = nullptr;

bool bindDriver() {
  static const bool ok = [] {
    const char* path = getenv("LOOM_CUDA_DRIVER_LIBRARY");
    void* h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return false;
    gLaunchHostFunc = reinterpret_cast<decltype(gLaunchHostFunc)>(dlsym(h, "cuLaunchHostFunc"));
    gRead = reinterpret_cast<MoveFn>(dlsym(h, "loomStandInReadDevice"));
    gWrite = reinterpret_cast<MoveFn>(dlsym(h, "loomStandInWriteDevice"));
    gIsCapturing = reinterpret_cast<decltype(gIsCapturing)>(dlsym(h, "cuStreamIsCapturing"));
    gHostView = reinterpret_cast<decltype(gHostView)>(dlsym(h, "loomStandInHostView"));
    return gLaunchHostFunc && gRead && gWrite && gIsCapturing && gHostView;
  }();
  return ok;
}

struct Call {
  int fn;
  loom::Reducer red;
  void* dst;
  const void* a;
  const void* b;
  size_t n;
};

void run(void* p) {
  std::unique_ptr<Call> c(static_cast<Call*>(p));
  const size_t bytes = c->n * c->red.eltSize;
  std::vector<char> a(bytes), b(bytes), d(bytes);
  gRead(a.data(), c->a, bytes);
  if (c->b) gRead(b.data(), c->b, bytes);
  switch (c->fn) {
    case LOOM_CUDA_FN_REDUCE: c->red.reduce(d.data(), a.data(), b.data(), c->n); break;
    case LOOM_CUDA_FN_REDUCE2: c->red.reduce2(d.data(), a.data(), b.data(), c->n); break;
    case LOOM_CUDA_FN_PRE: c->red.pre(d.data(), a.data(), c->n); break;
    default: c->red.post(d.data(), a.data(), c->n); break;
  }
  gWrite(c->dst, d.data(), bytes);
}

// The reducer that (dtype, kind, scalarBits) name, as kernels/reduce.h builds them.
bool reducerOf(int dtype, int kind, uint64_t scalarBits, loom::Reducer* out) {
  using loom::RedKind;
  try {
    switch (RedKind(kind)) {
      case RedKind::kSum: *out = loom::Reducer::make(dtype, 0, 1); return true;
      case RedKind::kProd: *out = loom::Reducer::make(dtype, 1, 1); return true;
      case RedKind::kMax: *out = loom::Reducer::make(dtype, 2, 1); return true;
      case RedKind::kMin: *out = loom::Reducer::make(dtype, 3, 1); return true;
      case RedKind::kPreMulSum: *out = loom::Reducer::preMulSum(dtype, &scalarBits); return true;
      case RedKind::kSumPostDiv: {
        // The module's post takes scalarBits as it is (integers: the divisor; floats: the
        // factor, one element of dtype), not a rank count: sumPostDiv's loops, its scalar
        // replaced. A zero divisor is refused (the module would divide by it).
        const bool isInt = dtype < int(loom::DataType::kFloat16);
        if (isInt && scalarBits == 0) return false;
        *out = loom::Reducer::sumPostDiv(dtype, 1);
        out->scalarBits = scalarBits;
        if (isInt) out->scalars.u64 = scalarBits;
        else out->scalars = loom::Reducer::preMulSum(dtype, &scalarBits).scalars;
        return true;
      }
    }
  } catch (...) {
  }
  return false;
}

// loomCudaReduceMulti's work: the chain of CPU steps it stands for (pre of input 0, each
// other input reduced in with its own scalar, post), every input read before any output is
// written (an output may be an input).
struct MultiCall {
  int dtype;
  loom::Reducer red;
  loomCudaMulti m;
  size_t n;
};

void runMulti(void* p) {
  std::unique_ptr<MultiCall> c(static_cast<MultiCall*>(p));
  const size_t bytes = c->n * c->red.eltSize;
  std::vector<std::vector<char>> in(static_cast<size_t>(c->m.nin), std::vector<char>(bytes));
  for (int i = 0; i < c->m.nin; ++i) gRead(in[static_cast<size_t>(i)].data(), c->m.in[i], bytes);
  std::vector<char> acc = in[0];
  const bool pre = c->red.hasPre();
  if (pre) loom::Reducer::preMulSum(c->dtype, &c->m.inScalar[0]).pre(acc.data(), in[0].data(), c->n);
  for (int i = 1; i < c->m.nin; ++i) {
    const char* x = in[static_cast<size_t>(i)].data();
    if (pre)
      loom::Reducer::preMulSum(c->dtype, &c->m.inScalar[i]).reduce(acc.data(), acc.data(), x, c->n);
    else
      c->red.reduce2(acc.data(), acc.data(), x, c->n);
  }
  c->red.post(acc.data(), acc.data(), c->n);
  for (int j = 0; j < c->m.nout; ++j) gWrite(c->m.out[j], acc.data(), bytes);
}

// ---- loomCudaInterpLaunch: the plan interpreter (kernels/interp.h), one host thread per
// channel where the module runs one block per channel (kernels/cuda/interp_kernel.cuh).

using HostFifo = loom::FifoEndT<loom::HostAtomics>;
using loom::FifoSlotInfo;
using loom::StepPiece;

// A host function cannot return an error to anyone, and the kernel would fault on memory it
// cannot reach: loud, as the stand-in driver's workers are.
[[noreturn]] void unreachable(const char* what, const void* p) {
  fprintf(stderr,
          "stand-in CUDA kernels: loomCudaInterpLaunch: %s (%p) is null or device memory a "
          "test registered itself, which host threads cannot reach by address\n",
          what, p);
  abort();
}

// Where a host thread reaches a device address (loomStandInHostView); null stays null.
template <typename T>
T* view(T* p, const char* what) {
  if (!p) return nullptr;
  void* v = gHostView(p);
  if (!v) unreachable(what, p);
  return static_cast<T*>(v);
}
// The same for what the kernel dereferences whatever the plan does.
template <typename T>
T* need(T* p, const char* what) {
  if (!p) unreachable(what, p);
  return view(p, what);
}

uint32_t loadWord(const uint32_t* w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }
void setStatus(uint32_t* status, uint32_t code) {
  uint32_t ok = LOOM_CUDA_INTERP_OK;
  __atomic_compare_exchange_n(status, &ok, code, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED);
}

// A launch's arguments as host threads reach them, resolved when the stream runs the launch
// (the FIFO table is device memory that work queued before it may write, and a captured
// launch runs again with whatever is there then).
struct HostArgs {
  loomCudaInterpArgs a;
  std::vector<loomCudaFifo> fifos;

  explicit HostArgs(const loomCudaInterpArgs& dev) : a(dev) {
    a.plan = need(dev.plan, "the plan");
    a.sendbuf = view(dev.sendbuf, "sendbuf");
    a.recvbuf = view(dev.recvbuf, "recvbuf");
    a.scratch = view(dev.scratch, "scratch");
    a.abortWord = need(dev.abortWord, "the abort word");
    a.status = need(dev.status, "the status word");
    a.llStaging = view(dev.llStaging, "the LL staging");
    const loomCudaFifo* table = dev.nFifos ? need(dev.fifos, "the FIFO table") : nullptr;
    fifos.assign(table, table + dev.nFifos);
    for (loomCudaFifo& f : fifos) {
      f.ctrl = need(f.ctrl, "a FIFO's control block");
      f.slots = need(f.slots, "a FIFO's slots");
      f.step = need(f.step, "a FIFO end's step counter");
      f.headAt = view(f.headAt, "a FIFO's head");
    }
    a.fifos = fifos.data();
  }
};

// A GPU polls for free; here every rank's channels share a few CPUs with the peers they
// wait for: spin briefly, then yield, then sleep.
void backoff(unsigned polls) {
  if (polls < 64) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else if (polls < 256) {
    sched_yield();
  } else {
    timespec pause{0, 20000};
    nanosleep(&pause, nullptr);
  }
}

// DeviceEnv on a host thread: the channel's own copies of the FIFO ends it uses, taken from
// the launch's table as it first needs each, at most LOOM_CUDA_INTERP_MAX_FIFOS, with their
// step counters as the launch found them.
struct StandInEnv {
  static constexpr int kMax = LOOM_CUDA_INTERP_MAX_FIFOS;
  const loomCudaInterpArgs* a;  // host views throughout
  size_t channel;
  HostFifo ends[kMax];
  uint64_t start[kMax];
  int at[kMax];  // index in the launch's table
  int n = 0;

  StandInEnv(const loomCudaInterpArgs* args, size_t c) : a(args), channel(c) {}
  // Only the ends this channel moved: the ends of concurrent channels are disjoint.
  void writeBack() const {
    for (int i = 0; i < n; ++i)
      if (ends[i].step != start[i])
        __atomic_store_n(a->fifos[at[i]].step, ends[i].step, __ATOMIC_RELAXED);
  }
  // The sending ends this channel moved, each until its receiver has released every step
  // posted on it (the receiver writes the head into this rank's memory, which its owner may
  // free once the launch has ended); false when the launch must stop instead.
  template <class Stop>
  bool drain(Stop stop) const {
    for (int i = 0; i < n; ++i)
      for (unsigned polls = 0; a->fifos[at[i]].send && ends[i].step != start[i] && !ends[i].drained(); ++polls) {
        if (stop()) return false;
        backoff(polls);
      }
    return true;
  }
  HostFifo* find(int peer, int conn, int send) {
    for (int i = 0; i < n; ++i) {
      const loomCudaFifo& f = a->fifos[at[i]];
      if (f.peer == peer && f.conn == conn && f.send == send) return &ends[i];
    }
    for (int j = 0; j < a->nFifos; ++j) {
      const loomCudaFifo& f = a->fifos[j];
      if (f.peer != peer || f.conn != conn || f.send != send) continue;
      if (n == kMax) {  // as the kernel: the status stops the channel at its next wait
        setStatus(a->status, LOOM_CUDA_INTERP_TOO_MANY_FIFOS);
        return nullptr;
      }
      HostFifo& e = ends[n];
      e.ctrl = static_cast<loom::FifoCtrl*>(f.ctrl);
      e.slots = static_cast<char*>(f.slots);
      e.slotBytes = f.slotBytes;
      e.depth = f.depth;
      // Relaxed: another channel's thread may be writing back an end it moved (not ours).
      e.step = start[n] = __atomic_load_n(f.step, __ATOMIC_RELAXED);
      e.headAt = f.headAt;
      at[n] = j;
      return &ends[n++];
    }
    return nullptr;
  }
  HostFifo* recvFifo(int peer, int conn) { return find(peer, conn, 0); }
  HostFifo* sendFifo(int peer, int conn) { return find(peer, conn, 1); }
  bool llRecv(int, int) const { return true; }  // device connections share their slots
  bool llSend(int, int) const { return true; }
  void* llStage(int which, size_t) const {
    return static_cast<char*>(a->llStaging) + (channel * 2 + which) * a->llStageBytes;
  }
  const char* ptr(loom::BufRef r, size_t off) const {
    // An absolute address is a device address, as the kernel would dereference it.
    if (r.buf == loom::Buf::kAbsolute)
      return view(reinterpret_cast<const char*>(r.offset) + off, "an absolute buffer");
    return loom::bufAt(r, off, a->sendbuf, a->recvbuf, a->scratch);
  }
};

// DeviceOps as one lane: the CPU loops (the same arithmetic, kernels/arith.h), and the
// kernel's statuses, stop condition and fences.
struct StandInOps : loom::CpuStepOps {
  uint32_t* status = nullptr;
  const uint32_t* abortWord = nullptr;

  bool stopRequested() const { return loadWord(abortWord) || loadWord(status); }
  void fence() const { std::atomic_thread_fence(std::memory_order_seq_cst); }
  const void* received(HostFifo& f, StepPiece& p) const {
    const FifoSlotInfo& info = f.recvInfo();
    if (info.bytes != p.bytes) setStatus(status, LOOM_CUDA_INTERP_SIZE_MISMATCH);
    if (info.remote) setStatus(status, LOOM_CUDA_INTERP_REMOTE_PAYLOAD);
    return f.recvSlot();
  }
};

using StandInInterp = loom::ChannelInterp<loom::HostAtomics, StandInEnv>;

// The kernel's wait for a piece: false when the launch must stop (a status, here or on
// another channel, or the abort word).
bool waitReady(const StandInInterp& in, StandInEnv& env, const loomCudaInterpArgs& a) {
  if (loadWord(a.status)) return false;
  for (unsigned polls = 0; !in.ready(env); ++polls) {
    if (loadWord(a.abortWord) || loadWord(a.status)) return false;
    backoff(polls);
  }
  return true;
}

// interpKernel's loop, for channel c.
void runChannel(const loomCudaInterpArgs& a, const loom::Reducer& red, int c) {
  const auto& plan = *static_cast<const loom::FlatPlan*>(a.plan);
  StandInEnv env(&a, static_cast<size_t>(c));
  StandInOps ops;
  ops.red = &red;
  ops.status = a.status;
  ops.abortWord = a.abortWord;
  const bool hasPost = a.kind == int(loom::RedKind::kSumPostDiv);
  StandInInterp in(plan, static_cast<size_t>(c), a.count, a.elt,
                   a.proto == LOOM_CUDA_INTERP_PROTO_LL);
  while (!in.done() && waitReady(in, env, a))
    // A piece of another size, or an LL read the abort word cut short: the status stops the
    // channel at its next wait (and every other channel of the launch).
    if (!in.run(env, ops, hasPost))
      setStatus(a.status, loadWord(a.abortWord) ? LOOM_CUDA_INTERP_ABORTED
                                                : LOOM_CUDA_INTERP_SIZE_MISMATCH);
  env.drain([&a] { return loadWord(a.abortWord) || loadWord(a.status); });
  env.writeBack();
}

struct InterpCall {
  loomCudaInterpArgs args;  // as launched: device addresses, as the kernel's parameters
  int channels;
  loom::Reducer red;
  bool replayed;  // captured into a graph: run again at every launch of it, never freed
};

// The launch: every channel at once, and the stream goes on only when all are done, as a
// kernel occupies its stream until its last block ends (so launches that must meet need
// streams of their own; with CUDA_DEVICE_MAX_CONNECTIONS, queues of their own too).
void runInterp(void* p) {
  auto* c = static_cast<InterpCall*>(p);
  std::unique_ptr<InterpCall> owned(c->replayed ? nullptr : c);
  const HostArgs host(c->args);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(c->channels));
  try {
    for (int ch = 0; ch < c->channels; ++ch)
      threads.emplace_back([&host, c, ch] { runChannel(host.a, c->red, ch); });
  } catch (const std::system_error& e) {
    fprintf(stderr, "stand-in CUDA kernels: no thread for each of %d channels: %s\n",
            c->channels, e.what());
    abort();  // the channels that started would wait for the others for ever
  }
  for (std::thread& t : threads) t.join();
}

// The calls captured into graphs: a graph's host function may run at any replay while the
// process lives, so their arguments stay too (a leak, bounded by what tests capture).
void keepForReplays(InterpCall* c) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::unique_ptr<InterpCall>>();
  std::lock_guard<std::mutex> lock(mu);
  kept->emplace_back(c);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int loomCudaReduceMulti(
    int dtype, int kind, uint64_t postBits, const loomCudaMulti* m, size_t n,
    loomCudaStream_t stream) {
  if (!bindDriver()) return 3;  // cudaErrorInitializationError
  if (getenv("LOOM_STAND_IN_KERNELS_FAIL")) return 209;
  if (!m || m->nin < 1 || m->nin > LOOM_CUDA_MULTI_MAX || m->nout < 0 ||
      m->nout > LOOM_CUDA_MULTI_MAX)
    return 1;
  for (int i = 0; i < m->nin; ++i)
    if (!m->in[i]) return 1;
  for (int j = 0; j < m->nout; ++j)
    if (!m->out[j]) return 1;
  loom::Reducer red;
  if (!reducerOf(dtype, kind, postBits, &red)) return 1;
  if (n == 0 || m->nout == 0) return 0;
  auto c = std::make_unique<MultiCall>(MultiCall{dtype, red, *m, n});
  if (gLaunchHostFunc(stream, runMulti, c.get()) != 0) return 400;
  c.release();
  return 0;
}

extern "C" __attribute__((visibility("default"))) int loomCudaReduce(
    int fn, int dtype, int kind, uint64_t scalarBits, void* dst, const void* a, const void* b,
    size_t n, loomCudaStream_t stream) {
  if (!bindDriver()) return 3;  // cudaErrorInitializationError
  // A module that loads but cannot run here (cudaErrorNoKernelImageForDevice), for tests.
  if (getenv("LOOM_STAND_IN_KERNELS_FAIL")) return 209;
  loom::Reducer red;
  if (fn < LOOM_CUDA_FN_REDUCE || fn > LOOM_CUDA_FN_POST || !reducerOf(dtype, kind, scalarBits, &red))
    return 1;  // cudaErrorInvalidValue
  if (n == 0) return 0;
  const bool binary = fn == LOOM_CUDA_FN_REDUCE || fn == LOOM_CUDA_FN_REDUCE2;
  auto c = std::make_unique<Call>(Call{fn, red, dst, a, binary ? b : nullptr, n});
  if (gLaunchHostFunc(stream, run, c.get()) != 0) return 400;  // cudaErrorInvalidResourceHandle
  c.release();
  return 0;
}

// Refuses what the module's dispatch refuses (kernels/cuda/interp_entry.cu), and an integer
// SumPostDiv by zero, which the module would run (see reducerOf).
extern "C" __attribute__((visibility("default"))) int loomCudaInterpLaunch(
    const loomCudaInterpArgs* args, int channels, loomCudaStream_t stream) {
  if (!args || channels <= 0 || args->nFifos < 0 || args->nFifos > LOOM_CUDA_INTERP_MAX_TABLE)
    return 1;
  if (args->proto != LOOM_CUDA_INTERP_PROTO_SIMPLE &&
      (args->proto != LOOM_CUDA_INTERP_PROTO_LL || !args->llStaging ||
       args->llStageBytes % 16 != 0))
    return 1;
  loom::Reducer red;
  if (!reducerOf(args->dtype, args->kind, args->scalarBits, &red)) return 1;
  if (!bindDriver()) return 3;  // cudaErrorInitializationError
  int capture = 0;
  const bool replayed = gIsCapturing(stream, &capture) == 0 && capture != 0;
  auto c = std::make_unique<InterpCall>(InterpCall{*args, channels, red, replayed});
  if (gLaunchHostFunc(stream, runInterp, c.get()) != 0) return 400;
  if (replayed) keepForReplays(c.get());
  c.release();
  return 0;
}

extern "C" __attribute__((visibility("default"))) int loomCudaKernelsAbiVersion(void) {
  return LOOM_CUDA_KERNELS_ABI_VERSION;
}
