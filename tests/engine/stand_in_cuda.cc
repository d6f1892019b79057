// A stand-in for the CUDA driver (libcuda.so.1), selected with LOOM_CUDA_DRIVER_LIBRARY.
// It exports the driver functions Loom binds, with cuda.h's signatures and values, and
// reports address ranges that a test registers as device, managed or pinned host memory;
// every other address is unregistered host memory, as the real driver reports it. Tests
// reach its hooks (loomStandIn*) with dlopen(path, RTLD_NOLOAD) and dlsym.
//
// It also emulates streams, so that work Loom queues on a caller's stream can be tested
// without a GPU: every stream is a FIFO of operations (copies, host functions, 32-bit waits
// and writes, event waits) that a worker thread of its own runs in order. Device memory is
// host pages kept PROT_NONE, so that a direct host access by Loom faults. Events, the
// legacy stream's implicit ordering and stream capture into linear graphs follow cuda.h,
// as do the per-thread capture interaction mode (cuThreadExchangeStreamCaptureMode) and
// user objects that graphs and execs own (their destroy callbacks run on a thread of the
// stand-in's own, as CUDA runs them on an internal one).
//
// Device memory from cuMemAlloc is a memfd, mapped twice: MAP_SHARED PROT_NONE at the
// address handed out, and read-write at an alias that only the stand-in uses. Its workers
// and hooks reach device memory through the alias; ranges that a test registers as device
// memory (plain PROT_NONE pages of its own) they reach through /proc/self/mem, whose reads
// and writes ignore page protection (the kernel refuses such forced writes to MAP_SHARED
// pages, hence the alias). A hook, loomStandInHostView, hands out the alias's address of a
// device byte, so that the kernels module's stand-in can run a kernel as host code that
// reads and writes device memory in place (with atomics, as a GPU's threads do) rather
// than copy by copy; test-registered ranges have no such address. The memfd makes the
// memory shareable with other processes, as CUDA IPC shares it between processes on one
// GPU: cuIpcGetMemHandle names the memfd (the exporting pid, its descriptor and a serial
// number that its name repeats), and cuIpcOpenMemHandle in another process opens it
// through /proc/<pid>/fd and maps it the same way, as device memory of the opener's
// current device. Interprocess events (CU_EVENT_INTERPROCESS) own a shared page that
// counts their records and marks each one done when its stream reaches it, through which
// events that cuIpcOpenEventHandle opens in other processes wait for the latest record
// (see IpcEventPage).
//
// CUDA does not survive fork(); the stand-in keeps working in a forked child (tests fork
// ranks after loading it), and as before a child's device memory is its own: an atfork
// handler gives the child a private copy of every memfd-backed range at the same
// addresses, so that neither side's writes reach the other. Interprocess event pages are
// left shared.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using CUresult = int;
constexpr CUresult kSuccess = 0;
constexpr CUresult kInvalidValue = 1;
constexpr CUresult kOutOfMemory = 2;
constexpr CUresult kInvalidContext = 201;
constexpr CUresult kInvalidHandle = 400;
constexpr CUresult kIllegalState = 401;
constexpr CUresult kNotFound = 500;
constexpr CUresult kNotReady = 600;
constexpr CUresult kCaptureUnsupported = 900;
constexpr CUresult kCaptureInvalidated = 901;
constexpr CUresult kCaptureMerge = 902;
constexpr CUresult kCaptureUnmatched = 903;
constexpr CUresult kCaptureIsolation = 905;
constexpr CUresult kCaptureImplicit = 906;
constexpr CUresult kCapturedEvent = 907;
constexpr CUresult kCaptureWrongThread = 908;
constexpr int kAttrMemoryType = 2, kAttrIsManaged = 8, kAttrDeviceOrdinal = 9;
constexpr int kNoOrdinal = -2;  // what the driver reports for memory it does not know

using CUdeviceptr = unsigned long long;
using CUhostFn = void (*)(void*);

struct Range {
  uintptr_t begin, end;
  unsigned memType;
  unsigned managed;
  int device;
};

// Device memory backed by a memfd: an allocation of cuMemAlloc's or a mapping that
// cuIpcOpenMemHandle opened. [begin, end) is mapped PROT_NONE for everyone else; `alias`
// maps the same file read-write for the stand-in alone.
struct Backed {
  uintptr_t begin, end;
  char* alias;
  int fd;           // kept open until cuMemFree / cuIpcCloseMemHandle: handles name it
  uint64_t serial;  // in the memfd's name too, so that an opener can tell a reused fd
  bool opened;      // by cuIpcOpenMemHandle: closed by cuIpcCloseMemHandle, not exportable
};

struct State {
  std::mutex mu;  // a leaf: nothing else is locked while it is held
  std::vector<Range> ranges;           // registered by tests through the hooks
  std::map<uintptr_t, Range> allocs;   // by cuMemAlloc / cuMemHostAlloc / IPC, by begin
  std::map<uintptr_t, Backed> backed;  // the memfd-backed ones among them, by begin
  uint64_t lastSerial = 0;             // of memfds this process made (memory, event pages)
  int currentDevice = 0;
  std::atomic<CUresult> initResult{kSuccess};
  std::atomic<CUresult> queryResult{kSuccess};
  std::atomic<long> queries{0};

  std::mutex memMu;  // guards memFd and memPid
  int memFd = -1;    // /proc/self/mem, opened on first use
  pid_t memPid = 0;  // the process that opened memFd
};

void privatizeAfterFork();

State& state() {
  static State* s = [] {
    auto* st = new State();  // outlives any static destructor that still queries
    // Held across fork(), so that the child finds the maps whole; see privatizeAfterFork.
    pthread_atfork([] { state().mu.lock(); }, [] { state().mu.unlock(); },
                   [] {
                     state().mu.unlock();
                     privatizeAfterFork();
                   });
    return st;
  }();
  return *s;
}

constexpr int kDevices = 4;
constexpr int kNoThreadContext = -100;
// A thread that made a context current (cuCtxSetCurrent) sees its device; other threads
// see the process-wide one the test sets.
thread_local int tlsDevice = kNoThreadContext;

// cuCtxGetDevice's answer for the calling thread; negative: no current context.
int callerDevice() {
  std::lock_guard<std::mutex> lock(state().mu);
  return tlsDevice != kNoThreadContext ? tlsDevice : state().currentDevice;
}

// ---- memory

bool deviceLike(const Range& r) { return r.memType == 2 || r.managed != 0; }

// The range holding p: a test's registration first (the latest wins), then the driver's
// own allocations, which loomStandInClear leaves alone. state().mu must be held.
bool findRangeLocked(uintptr_t p, Range* out) {
  State& s = state();
  bool found = false;
  for (const Range& r : s.ranges)
    if (p >= r.begin && p < r.end) {
      *out = r;
      found = true;
    }
  if (found) return true;
  auto it = s.allocs.upper_bound(p);
  if (it == s.allocs.begin()) return false;
  --it;
  if (p >= it->second.end) return false;
  *out = it->second;
  return true;
}

// Whether any byte of [p, p + n) is device or managed memory, which is kept PROT_NONE.
bool touchesDevice(uintptr_t p, size_t n) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto overlaps = [&](const Range& r) { return deviceLike(r) && r.begin < p + n && p < r.end; };
  for (const Range& r : s.ranges)
    if (overlaps(r)) return true;
  for (const auto& [begin, r] : s.allocs)
    if (overlaps(r)) return true;
  return false;
}

[[noreturn]] void fail(const char* what, uintptr_t addr) {
  // A worker cannot return an error to anyone: a copy that cannot be done must be loud.
  fprintf(stderr, "stand-in CUDA driver: %s at %#llx failed: %s\n", what,
          static_cast<unsigned long long>(addr), strerror(errno));
  abort();
}

int procMem() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.memMu);
  const pid_t pid = getpid();
  if (s.memFd < 0 || s.memPid != pid) {
    // A descriptor opened before a fork still reaches the parent's memory: reopen.
    if (s.memFd >= 0) close(s.memFd);
    s.memFd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    s.memPid = pid;
    if (s.memFd < 0) fail("open(/proc/self/mem)", 0);
  }
  return s.memFd;
}

// Ranges a test registered as device memory are plain PROT_NONE pages: /proc/self/mem
// reaches them all the same (FOLL_FORCE).
void readProcMem(char* d, uintptr_t src, size_t n) {
  const int fd = procMem();
  while (n > 0) {
    ssize_t r = pread(fd, d, n, static_cast<off_t>(src));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail("reading device memory through /proc/self/mem", src);
    d += r, src += r, n -= r;
  }
}

void writeProcMem(uintptr_t dst, const char* s, size_t n) {
  const int fd = procMem();
  while (n > 0) {
    ssize_t r = pwrite(fd, s, n, static_cast<off_t>(dst));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail("writing device memory through /proc/self/mem", dst);
    s += r, dst += r, n -= r;
  }
}

// Where the stand-in reaches p: the alias of the memfd-backed range holding it, with *span
// the bytes of [p, p + n) that the range covers; or nullptr when p lies in no such range,
// with *span the bytes up to the next one (which /proc/self/mem serves).
char* aliasOf(uintptr_t p, size_t n, size_t* span) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto next = s.backed.upper_bound(p);
  if (next != s.backed.begin()) {
    const Backed& b = std::prev(next)->second;
    if (p < b.end) {
      *span = std::min<size_t>(n, b.end - p);
      return b.alias + (p - b.begin);
    }
  }
  *span = next == s.backed.end() ? n : std::min<size_t>(n, next->first - p);
  return nullptr;
}

// Device memory, piece by piece: through the alias where a memfd backs it, else through
// /proc/self/mem (which the kernel refuses for writes to the PROT_NONE MAP_SHARED pages).
void readDevice(void* dst, uintptr_t src, size_t n) {
  auto* d = static_cast<char*>(dst);
  while (n > 0) {
    size_t span = 0;
    if (const char* a = aliasOf(src, n, &span))
      memcpy(d, a, span);
    else
      readProcMem(d, src, span);
    d += span, src += span, n -= span;
  }
}

void writeDevice(uintptr_t dst, const void* src, size_t n) {
  auto* s = static_cast<const char*>(src);
  while (n > 0) {
    size_t span = 0;
    if (char* a = aliasOf(dst, n, &span))
      memcpy(a, s, span);
    else
      writeProcMem(dst, s, span);
    s += span, dst += span, n -= span;
  }
}

void copyBytes(uintptr_t dst, uintptr_t src, size_t n) {
  const bool toDevice = touchesDevice(dst, n), fromDevice = touchesDevice(src, n);
  if (!toDevice && !fromDevice) {
    memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  } else if (!fromDevice) {
    writeDevice(dst, reinterpret_cast<const void*>(src), n);
  } else if (!toDevice) {
    readDevice(reinterpret_cast<void*>(dst), src, n);
  } else {
    // Neither side may be touched directly; a whole-size bounce also survives overlap
    // (two aliases of one memfd overlap without sharing addresses).
    std::vector<char> bounce(n);
    readDevice(bounce.data(), src, n);
    writeDevice(dst, bounce.data(), n);
  }
}

void fillBytes(uintptr_t dst, unsigned char value, size_t n) {
  if (!touchesDevice(dst, n)) {
    memset(reinterpret_cast<void*>(dst), value, n);
    return;
  }
  std::vector<unsigned char> bytes(n, value);
  writeDevice(dst, bytes.data(), n);
}

// Where cuStreamWaitValue32 / cuStreamWriteValue32 may point: an aligned word of pinned
// host memory (which the device maps) or of device memory; *device says which.
bool wordTarget(uintptr_t addr, bool* device) {
  if (addr == 0 || addr % 4 != 0) return false;
  std::lock_guard<std::mutex> lock(state().mu);
  Range r;
  if (!findRangeLocked(addr, &r) || addr + 4 > r.end) return false;
  *device = deviceLike(r);
  return *device || r.memType == 1;
}

// Host words are shared with host threads, and words of memfd-backed device memory (through
// the alias) with other processes too: acquire loads, release stores. Other device words
// are only ever reached through /proc/self/mem, whose system calls order them as fences
// would.
uint32_t loadWord(uintptr_t addr, bool device) {
  if (!device) return __atomic_load_n(reinterpret_cast<const uint32_t*>(addr), __ATOMIC_ACQUIRE);
  size_t span = 0;
  if (const char* a = aliasOf(addr, 4, &span); a && span == 4)
    return __atomic_load_n(reinterpret_cast<const uint32_t*>(a), __ATOMIC_ACQUIRE);
  uint32_t word;
  readDevice(&word, addr, sizeof word);
  return word;
}

void storeWord(uintptr_t addr, uint32_t word, bool device) {
  if (!device) {
    __atomic_store_n(reinterpret_cast<uint32_t*>(addr), word, __ATOMIC_RELEASE);
    return;
  }
  size_t span = 0;
  if (char* a = aliasOf(addr, 4, &span); a && span == 4) {
    __atomic_store_n(reinterpret_cast<uint32_t*>(a), word, __ATOMIC_RELEASE);
    return;
  }
  writeDevice(addr, &word, sizeof word);
}

constexpr unsigned kWaitGeq = 0, kWaitEq = 1, kWaitAnd = 2, kWaitNor = 3;
constexpr unsigned kWaitFlush = 1u << 30;

bool waitSatisfied(uint32_t word, uint32_t value, unsigned cond) {
  switch (cond) {
    case kWaitGeq: return static_cast<int32_t>(word - value) >= 0;  // modulo 2^32
    case kWaitEq: return word == value;
    case kWaitAnd: return (word & value) != 0;
    default: return ~(word | value) != 0;  // kWaitNor
  }
}

// A GPU polls memory; here a worker does, briefly hot and then every 20 µs.
template <typename Done>
void pollUntil(Done done) {
  for (unsigned polls = 0; !done(); ++polls) {
    if (polls < 1000) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      timespec pause{0, 20000};
      nanosleep(&pause, nullptr);
    }
  }
}

void waitWord(uintptr_t addr, uint32_t value, unsigned cond, bool device) {
  pollUntil([&] { return waitSatisfied(loadWord(addr, device), value, cond); });
}

// ---- memfds: device memory and interprocess event pages

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif

// The name a memfd of this stand-in carries: what it is (kind), the process that made it
// and that process's serial number for it. /proc/<pid>/fd/<fd> shows it as
// "/memfd:<name> (deleted)", by which an opener checks that a handle's fd still names it.
void memfdName(char* out, size_t len, const char* kind, pid_t pid, uint64_t serial) {
  snprintf(out, len, "loom-stand-in-%s:%lld:%llu", kind, static_cast<long long>(pid),
           static_cast<unsigned long long>(serial));
}

// A new memfd of `bytes` (sparse: pages are allocated as they are written), or -1.
int newMemfd(const char* kind, pid_t pid, uint64_t serial, size_t bytes) {
  char name[96];
  memfdName(name, sizeof name, kind, pid, serial);
  // Not executable where the kernel knows the flag (6.3+; it warns without it), else plain.
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_NOEXEC_SEAL);
  if (fd < 0 && errno == EINVAL) fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Maps fd's first `bytes` twice, both MAP_SHARED: PROT_NONE (at `at` if given, replacing
// what is there) and read-write as the alias (at `aliasAt` if given). False, with nothing
// new left mapped, when either fails.
bool mapTwice(int fd, size_t bytes, void* at, void* aliasAt, uintptr_t* begin, char** alias) {
  const int fixed = at ? MAP_FIXED : 0, aliasFixed = aliasAt ? MAP_FIXED : 0;
  void* p = mmap(at, bytes, PROT_NONE, MAP_SHARED | MAP_NORESERVE | fixed, fd, 0);
  if (p == MAP_FAILED) return false;
  void* a =
      mmap(aliasAt, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE | aliasFixed, fd, 0);
  if (a == MAP_FAILED) {
    if (!at) munmap(p, bytes);
    return false;
  }
  *begin = reinterpret_cast<uintptr_t>(p);
  *alias = static_cast<char*>(a);
  return true;
}

void unmapBacked(const Backed& b) {
  munmap(reinterpret_cast<void*>(b.begin), b.end - b.begin);
  munmap(b.alias, b.end - b.begin);
  close(b.fd);
}

// Writes view[off, off + n) to fd at off; the child's copy (privatizeAfterFork) must be whole.
void writeAllAt(int fd, const char* view, off_t off, size_t n) {
  while (n > 0) {
    ssize_t r = pwrite(fd, view + off, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail("copying device memory into the forked child's own memfd", off);
    off += r, n -= r;
  }
}

// In a forked child (the only thread there): every memfd-backed range gets a new memfd
// holding a copy of what it holds now, mapped over both the range and its alias at the same
// addresses, so that the child's writes stay its own and the parent's do not reach it, as
// with the private anonymous memory this stand-in used before IPC. Only the parts that hold
// data are copied (SEEK_DATA), so sparse memory stays sparse. The inherited descriptor is
// closed: it is the parent's to export. Mappings opened from other processes are copied
// too: a child's device memory is all its own.
void privatizeAfterFork() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const pid_t self = getpid();
  for (auto& [begin, b] : s.backed) {
    const size_t bytes = b.end - b.begin;
    const uint64_t serial = ++s.lastSerial;
    const int fd = newMemfd("mem", self, serial, bytes);
    if (fd < 0) fail("memfd_create in a forked child", b.begin);
    for (off_t off = 0; off < static_cast<off_t>(bytes);) {
      off_t data = lseek(b.fd, off, SEEK_DATA);
      if (data < 0 && errno == ENXIO) break;  // only a hole is left
      if (data < 0) data = off;               // no SEEK_DATA: copy the rest whole
      off_t hole = lseek(b.fd, data, SEEK_HOLE);
      if (hole < 0 || hole > static_cast<off_t>(bytes)) hole = static_cast<off_t>(bytes);
      writeAllAt(fd, b.alias, data, static_cast<size_t>(hole - data));
      off = hole;
    }
    uintptr_t at = 0;
    char* alias = nullptr;
    if (!mapTwice(fd, bytes, reinterpret_cast<void*>(b.begin), b.alias, &at, &alias))
      fail("mapping the forked child's own copy of device memory", b.begin);
    close(b.fd);
    b.fd = fd;
    b.serial = serial;
  }
}

// What the stand-in puts in the 64 bytes of a CUipcMemHandle / CUipcEventHandle.
struct HandleBits {
  uint64_t magic;
  uint64_t pid;     // the exporting process
  uint64_t maker;   // the process that made the memfd, as its name says (an event opened
                    // from a handle and exported again names the first exporter)
  uint64_t serial;  // the maker's for the memfd, as its name says
  uint64_t size;    // of the memory (0 for an event)
  int32_t fd;       // the memfd, in the exporting process
  char unused[20];
};
static_assert(sizeof(HandleBits) == 64, "a CUDA IPC handle has 64 bytes");
constexpr uint64_t kMemHandleMagic = 0x4c6f6f6d4d656d31ULL;    // "LoomMem1"
constexpr uint64_t kEventHandleMagic = 0x4c6f6f6d45766e31ULL;  // "LoomEvn1"

// Opens the memfd that another process's handle names, through /proc/<pid>/fd/<fd>, and
// checks that it is still that memfd (its name: the number may have been reused since) and,
// for memory, of the handle's size. Returns the new descriptor, or -1.
int openExported(const HandleBits& h, const char* kind, off_t size) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%llu/fd/%d", static_cast<unsigned long long>(h.pid), h.fd);
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  char name[96], want[128], got[128];
  memfdName(name, sizeof name, kind, static_cast<pid_t>(h.maker), h.serial);
  snprintf(want, sizeof want, "/memfd:%s (deleted)", name);
  char self[64];
  snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(self, got, sizeof got - 1);
  struct stat st;
  if (n < 0 || (got[n] = 0, strcmp(got, want) != 0) || fstat(fd, &st) != 0 ||
      st.st_size != size) {
    close(fd);
    return -1;
  }
  return fd;
}

// ---- streams, events, capture

struct Stream;

// A point in a stream's order: reached once `seq` operations on it have completed.
struct Point {
  std::shared_ptr<Stream> stream;
  uint64_t seq;
};
using Points = std::vector<Point>;

// One queued operation: it starts once every point in `after` is reached (the legacy
// stream's implicit ordering, cuStreamWaitEvent), then calls `run`, which may block (a
// wait) or be empty.
struct Op {
  Points after;
  std::function<void()> run;
};

enum class StreamKind { Created, Legacy, PerThread };
constexpr uintptr_t kLegacyHandle = 0x1, kPerThreadHandle = 0x2;  // CU_STREAM_LEGACY, _PER_THREAD
constexpr unsigned kStreamNonBlocking = 0x1;

struct Capture;

// The GPU's work queues ("connections"; CUDA_DEVICE_MAX_CONNECTIONS, 8 by default): streams
// are dealt out to them in turn, and a queue runs the operations of all its streams one
// after another in the order they were pushed, so that an operation waiting at the head of a
// queue (cuStreamWaitValue32, an event wait) holds every stream behind it. Modelled only
// when CUDA_DEVICE_MAX_CONNECTIONS is set (otherwise every stream runs on its own, as a
// GPU with more queues than streams would), to test what such sharing does.
struct Connection {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t pushed = 0, served = 0;  // tickets handed out, and run to the end
};
struct Connections {
  std::vector<std::unique_ptr<Connection>> queues;
  std::atomic<uint64_t> nextStream{0};
  Connections() {
    const char* v = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    int n = v && *v ? atoi(v) : 0;
    for (int i = 0; i < std::min(std::max(n, 0), 32); ++i)
      queues.push_back(std::make_unique<Connection>());
  }
  Connection* next() {  // the queue of a new stream, or nullptr when not modelled
    if (queues.empty()) return nullptr;
    return queues[nextStream.fetch_add(1) % queues.size()].get();
  }
};
Connections& connections() {
  static Connections* c = new Connections();  // never destroyed: detached workers use it
  return *c;
}

struct Stream : std::enable_shared_from_this<Stream> {
  Stream(StreamKind k, bool b) : kind(k), blocking(b), conn(connections().next()) {}
  const StreamKind kind;
  // Blocking streams (all but CU_STREAM_NON_BLOCKING ones) and the legacy stream wait for
  // each other's earlier work.
  const bool blocking;
  Connection* const conn;  // shared with other streams, or nullptr (Connections)

  std::mutex mu;
  std::condition_variable cv;  // signalled on every change of the fields below
  std::deque<Op> queue;
  std::deque<uint64_t> tickets;  // each queued operation's turn on conn
  uint64_t enqueued = 0, completed = 0;
  bool paused = false, stopping = false, started = false, exited = false;

  std::shared_ptr<Capture> capture;  // guarded by the registry's mutex, not by mu

  // Queues op and returns its point. The worker starts with the first operation, never
  // earlier: the process may fork before it uses a stream.
  uint64_t push(Op op) {
    std::lock_guard<std::mutex> lock(mu);
    if (conn) {
      std::lock_guard<std::mutex> cl(conn->mu);
      tickets.push_back(conn->pushed++);
    }
    queue.push_back(std::move(op));
    if (!started) {
      started = true;
      // Detached, so that nothing must join it (the process may end while it waits), and
      // holding the stream, which lives until its worker ends.
      std::thread([self = shared_from_this()] { self->work(); }).detach();
    }
    cv.notify_all();
    return ++enqueued;
  }
  bool reached(uint64_t seq) {
    std::lock_guard<std::mutex> lock(mu);
    return completed >= seq;
  }
  void waitFor(uint64_t seq) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= seq; });
  }

  void work() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return (!paused && !queue.empty()) || (stopping && queue.empty()); });
      if (queue.empty()) break;
      Op op = std::move(queue.front());
      queue.pop_front();
      uint64_t ticket = 0;
      if (conn) {
        ticket = tickets.front();
        tickets.pop_front();
      }
      lock.unlock();
      if (conn) {  // the queue's earlier operations, of any of its streams, come first
        std::unique_lock<std::mutex> cl(conn->mu);
        conn->cv.wait(cl, [&] { return conn->served == ticket; });
      }
      for (const Point& p : op.after) p.stream->waitFor(p.seq);
      if (op.run) op.run();
      op = Op{};  // let go of other streams before counting the operation done
      if (conn) {
        std::lock_guard<std::mutex> cl(conn->mu);
        ++conn->served;
        conn->cv.notify_all();
      }
      lock.lock();
      ++completed;
      cv.notify_all();
    }
    exited = true;
    cv.notify_all();
  }
};

constexpr int kCaptureGlobal = 0, kCaptureThreadLocal = 1, kCaptureRelaxed = 2;

// The calling thread's capture interaction mode (cuThreadExchangeStreamCaptureMode).
thread_local int tlsCaptureMode = kCaptureGlobal;

// ---- user objects

// A user object (cuUserObjectCreate): ptr and the callback that destroys it once the last
// reference is released. References are owned by callers, graphs and graph execs.
struct UserObject {
  void* ptr;
  CUhostFn destroy;
  uint64_t refs;  // guarded by UserObjects::mu
};

// As in CUDA, destroy callbacks run on a shared internal thread of the driver's own, so
// that none runs on a caller's thread or while the stand-in holds any of its mutexes.
struct UserObjects {
  std::mutex mu;  // a leaf: locked under the registry's mutex at times, never before it
  std::condition_variable cv;
  std::unordered_map<const void*, std::unique_ptr<UserObject>> live;  // by handle, refs > 0
  std::deque<std::unique_ptr<UserObject>> doomed;  // refs reached 0, callback still to run
  pid_t workerPid = 0;  // the process whose destructor thread runs (a fork has none)
  std::atomic<long> pending{0};  // created, destroy callback not yet returned
};

UserObjects& userObjects() {
  static UserObjects* u = new UserObjects();  // never destroyed: its thread may still run
  return *u;
}

void destructorThread() {
  UserObjects& u = userObjects();
  std::unique_lock<std::mutex> lock(u.mu);
  for (;;) {
    u.cv.wait(lock, [&] { return !u.doomed.empty(); });
    std::unique_ptr<UserObject> o = std::move(u.doomed.front());
    u.doomed.pop_front();
    lock.unlock();
    o->destroy(o->ptr);
    o.reset();
    u.pending.fetch_sub(1);
    lock.lock();
  }
}

// Drops n references of o; the last one hands it to the destructor thread. The object's
// refs must allow it (callers check). UserObjects::mu held.
void releaseLocked(UserObject* o, uint64_t n) {
  UserObjects& u = userObjects();
  o->refs -= n;
  if (o->refs > 0) return;
  auto it = u.live.find(o);
  u.doomed.push_back(std::move(it->second));
  u.live.erase(it);
  if (u.workerPid != getpid()) {
    u.workerPid = getpid();
    std::thread(destructorThread).detach();
  }
  u.cv.notify_all();
}

// References that a graph or an exec owns, released when it goes. Its map is guarded by
// the registry's mutex while it belongs to a graph; an exec's never changes.
struct UserRefs {
  std::unordered_map<UserObject*, uint64_t> held;
  UserRefs() = default;
  UserRefs(const UserRefs&) = delete;
  UserRefs& operator=(const UserRefs&) = delete;
  ~UserRefs() {
    if (held.empty()) return;
    std::lock_guard<std::mutex> lock(userObjects().mu);
    for (const auto& [o, n] : held) releaseLocked(o, n);
  }
};

// ---- graphs

struct Graph {
  std::vector<Op> ops;
  UserRefs userRefs;
  bool capturing = false;  // being captured into: not to be destroyed before the capture ends
};

// An instantiated graph. A launch carries `userRefs` in its last operation, so that an exec
// destroyed while launches are queued or running keeps its objects until they finish, as
// CUDA frees an exec in flight on completion.
struct Exec {
  std::vector<Op> ops;
  std::shared_ptr<const UserRefs> userRefs;
};

// A capture sequence: what its streams queue is recorded into its graph instead of run. The
// graph is linear: operations in the order they were queued, which respects every
// dependency.
struct Capture {
  int mode = kCaptureGlobal;
  uint64_t id = 0;  // unique over the process's lifetime (cuStreamGetCaptureInfo)
  std::thread::id thread;  // that began it
  Stream* origin = nullptr;
  std::vector<std::shared_ptr<Stream>> members;  // origin and streams that joined by event
  std::shared_ptr<Graph> graph;  // registered in the registry's graphs while capturing
  bool invalidated = false;
};

// The shared page of an interprocess event (CU_EVENT_INTERPROCESS), which every process
// holding the event reads and writes: a count of the records made, and slots that say
// which records are done. cuEventRecord takes the next record number g at the call and
// queues an operation that marks g done when the stream reaches it. A wait, query or
// synchronize is for the latest record at its call (g = the count then; 0: nothing to wait
// for) and is satisfied once g is done, whatever became of other records: records on
// different streams or in different processes may complete in any order. A record's slot
// is g mod kSlots and holds the highest record number of that slot done so far, so a wait
// could also be satisfied by a record kSlots later completing first, which takes more than
// kSlots records of one event pending at once. Owned by the event and by the operations
// queued for it, so that destroying the event while they are pending is safe
// (cuEventDestroy returns at once, as in CUDA).
struct IpcEventPage {
  static constexpr size_t kBytes = 4096;
  static constexpr uint64_t kSlots = kBytes / sizeof(uint64_t) - 1;
  int fd = -1;
  uint64_t maker = 0, serial = 0;  // in the memfd's name (see memfdName)
  uint64_t* words = nullptr;       // [0] records made, [1 + g % kSlots] record g's slot
  IpcEventPage() = default;
  IpcEventPage(const IpcEventPage&) = delete;
  IpcEventPage& operator=(const IpcEventPage&) = delete;
  ~IpcEventPage() {
    if (words) munmap(words, kBytes);
    if (fd >= 0) close(fd);
  }
  // Maps fd (a memfd of kBytes); false when it cannot.
  bool map(int descriptor) {
    void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, descriptor, 0);
    if (p == MAP_FAILED) return false;
    fd = descriptor;
    words = static_cast<uint64_t*>(p);
    return true;
  }
  uint64_t record() { return __atomic_add_fetch(&words[0], 1, __ATOMIC_ACQ_REL); }
  uint64_t latest() const { return __atomic_load_n(&words[0], __ATOMIC_ACQUIRE); }
  uint64_t* slot(uint64_t g) const { return &words[1 + g % kSlots]; }
  bool reached(uint64_t g) const {
    return g == 0 || __atomic_load_n(slot(g), __ATOMIC_ACQUIRE) >= g;
  }
  void complete(uint64_t g) {  // the slot becomes max(slot, g)
    uint64_t* w = slot(g);
    uint64_t seen = __atomic_load_n(w, __ATOMIC_RELAXED);
    while (seen < g &&
           !__atomic_compare_exchange_n(w, &seen, g, true, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
    }
  }
};

struct Event {
  Points points;  // the work it stands for; empty: complete
  bool captured = false;  // last recorded in a capturing stream
  std::weak_ptr<Capture> capturedIn;
  // Interprocess events only (created with CU_EVENT_INTERPROCESS or opened from a handle):
  // their waits go by the page's counters, whichever process recorded them last.
  std::shared_ptr<IpcEventPage> ipc;
};

struct Registry {
  // Locked before any Stream::mu (and state().mu, UserObjects::mu), never after; never
  // held while waiting.
  std::mutex mu;
  std::shared_ptr<Stream> legacy;
  std::unordered_map<const void*, std::shared_ptr<Stream>> streams;  // created, per-thread
  std::unordered_map<const void*, std::shared_ptr<Event>> events;
  std::unordered_map<const void*, std::shared_ptr<Graph>> graphs;
  std::unordered_map<const void*, std::shared_ptr<Exec>> execs;  // instantiated graphs
  std::vector<std::shared_ptr<Capture>> captures;                // in progress
  uint64_t lastCaptureId = 0;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: detached workers may still run
  return *r;
}

// A thread's CU_STREAM_PER_THREAD stream, created on first use and retired at thread exit:
// its worker finishes what is queued, then ends.
struct PerThreadStream {
  std::shared_ptr<Stream> stream;
  ~PerThreadStream();
};
thread_local PerThreadStream tlsStream;

// Takes s out of its capture, which cannot be ended as recorded any more. A capture no
// stream is left in is dropped with its graph (and the graph's user object references).
void leaveCaptureLocked(const std::shared_ptr<Stream>& s) {
  std::shared_ptr<Capture> c = std::move(s->capture);
  if (!c) return;
  c->invalidated = true;
  std::erase(c->members, s);
  if (!c->members.empty()) return;
  std::erase(registry().captures, c);
  registry().graphs.erase(c->graph.get());
}

PerThreadStream::~PerThreadStream() {
  if (!stream) return;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().streams.erase(stream.get());
    leaveCaptureLocked(stream);
  }
  std::lock_guard<std::mutex> lock(stream->mu);
  stream->stopping = true;
  stream->cv.notify_all();
}

// The stream a handle names. The default streams need a current context, as in CUDA,
// except for the test hooks (needContext false). Registry mutex held.
CUresult resolveLocked(void* handle, std::shared_ptr<Stream>* out, bool needContext = true) {
  Registry& reg = registry();
  const auto h = reinterpret_cast<uintptr_t>(handle);
  if (h == 0 || h == kLegacyHandle || h == kPerThreadHandle) {
    if (needContext && callerDevice() < 0) return kInvalidContext;
    std::shared_ptr<Stream>& s = h == kPerThreadHandle ? tlsStream.stream : reg.legacy;
    if (!s) {
      const bool perThread = h == kPerThreadHandle;
      s = std::make_shared<Stream>(perThread ? StreamKind::PerThread : StreamKind::Legacy, true);
      if (perThread) reg.streams[s.get()] = s;
    }
    *out = s;
    return kSuccess;
  }
  auto it = reg.streams.find(handle);
  if (it == reg.streams.end() || it->second->kind != StreamKind::Created) return kInvalidHandle;
  *out = it->second;
  return kSuccess;
}

// Adds t's last queued point to `points` unless t has done all its work.
void addPending(const std::shared_ptr<Stream>& t, Points& points) {
  std::lock_guard<std::mutex> lock(t->mu);
  if (t->completed < t->enqueued) points.push_back({t, t->enqueued});
}

// What work queued on s now must wait for besides s's own order: the legacy stream waits
// for all earlier work of blocking streams, and they for its earlier work.
Points implicitAfterLocked(const std::shared_ptr<Stream>& s) {
  Registry& reg = registry();
  Points after;
  if (s->kind == StreamKind::Legacy) {
    for (const auto& [h, t] : reg.streams)
      if (t->blocking) addPending(t, after);
  } else if (s->blocking && reg.legacy) {
    addPending(reg.legacy, after);
  }
  return after;
}

// All work queued on s so far, as an event recorded now would stand for it.
Points untilNowLocked(const std::shared_ptr<Stream>& s) {
  Points points = implicitAfterLocked(s);
  addPending(s, points);
  return points;
}

void waitAll(const Points& points) {
  for (const Point& p : points) p.stream->waitFor(p.seq);
}

bool allReached(const Points& points) {
  for (const Point& p : points)
    if (!p.stream->reached(p.seq)) return false;
  return true;
}

// What waiting for an event now means: its points, or for an interprocess event the
// latest record at the time of the call.
struct EventTarget {
  Points points;
  std::shared_ptr<IpcEventPage> ipc;
  uint64_t record = 0;  // 0: nothing recorded, nothing to wait for
  bool reached() const { return ipc ? ipc->reached(record) : allReached(points); }
  void wait() const {
    if (ipc)
      pollUntil([&] { return ipc->reached(record); });
    else
      waitAll(points);
  }
};

// Whether capture forbids a potentially unsafe call (a synchronous copy, an allocation, an
// event's creation) from this thread now, as cuThreadExchangeStreamCaptureMode describes:
// in the thread's mode GLOBAL (the default), a capture of this thread's not begun in
// RELAXED mode, or another thread's begun in GLOBAL mode; in THREAD_LOCAL, only the former;
// in RELAXED, none. As in CUDA the call fails and breaks the captures that forbid it.
bool forbiddenByCaptureLocked() {
  const int mode = tlsCaptureMode;
  if (mode == kCaptureRelaxed) return false;
  const std::thread::id self = std::this_thread::get_id();
  bool forbidden = false;
  for (const auto& c : registry().captures)
    if ((c->thread == self && c->mode != kCaptureRelaxed) ||
        (mode == kCaptureGlobal && c->mode == kCaptureGlobal)) {
      c->invalidated = true;
      forbidden = true;
    }
  return forbidden;
}

// Whether using the legacy stream now would make it wait for a capturing blocking stream,
// which CUDA refuses (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), breaking the capture unless the
// call only asks (cuStreamIsCapturing).
bool legacyBlockedLocked(bool invalidate) {
  bool blocked = false;
  for (const auto& c : registry().captures)
    for (const auto& m : c->members)
      if (m->blocking) {
        blocked = true;
        if (invalidate) c->invalidated = true;
        break;
      }
  return blocked;
}

// Queues ops on s in order, or records them while s captures.
CUresult enqueueLocked(const std::shared_ptr<Stream>& s, std::vector<Op> ops) {
  if (Capture* c = s->capture.get()) {
    if (c->invalidated) return kCaptureInvalidated;
    for (Op& op : ops) c->graph->ops.push_back(std::move(op));
    return kSuccess;
  }
  if (s->kind == StreamKind::Legacy && legacyBlockedLocked(true)) return kCaptureImplicit;
  if (ops.empty()) return kSuccess;
  Points after = implicitAfterLocked(s);  // the first op waits; the rest follow it
  ops.front().after.insert(ops.front().after.end(), after.begin(), after.end());
  for (Op& op : ops) s->push(std::move(op));
  return kSuccess;
}

CUresult enqueue(void* handle, std::vector<Op> ops) {
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Stream> s;
  if (CUresult r = resolveLocked(handle, &s)) return r;
  return enqueueLocked(s, std::move(ops));
}

// cuMemcpy and its synchronous kin: queued on the legacy stream and waited for.
CUresult runOnLegacy(std::function<void()> run) {
  Point done;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    std::shared_ptr<Stream> legacy;
    if (CUresult r = resolveLocked(nullptr, &legacy)) return r;
    if (forbiddenByCaptureLocked()) return kCaptureUnsupported;
    if (legacyBlockedLocked(true)) return kCaptureImplicit;
    done = {legacy, legacy->push(Op{implicitAfterLocked(legacy), std::move(run)})};
  }
  done.stream->waitFor(done.seq);
  return kSuccess;
}

// Every stream's work so far: what cuCtxSynchronize waits for.
Points everythingLocked() {
  Registry& reg = registry();
  Points points;
  if (reg.legacy) addPending(reg.legacy, points);
  for (const auto& [h, s] : reg.streams) addPending(s, points);
  return points;
}

void setPaused(void* handle, bool paused) {
  std::shared_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    if (resolveLocked(handle, &s, false) != kSuccess) return;
  }
  std::lock_guard<std::mutex> lock(s->mu);
  s->paused = paused;
  s->cv.notify_all();
}

template <typename T>
std::shared_ptr<T> findLocked(std::unordered_map<const void*, std::shared_ptr<T>>& map,
                              const void* handle) {
  auto it = map.find(handle);
  return it == map.end() ? nullptr : it->second;
}

// CUDA IPC handles, as cuda.h declares them: 64 opaque bytes (HandleBits), passed by value.
struct CUipcMemHandle {
  char reserved[64];
};
struct CUipcEventHandle {
  char reserved[64];
};
constexpr unsigned kIpcMemLazyEnablePeerAccess = 0x1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

template <typename Handle>
HandleBits bitsOf(const Handle& h) {
  HandleBits b;
  memcpy(&b, h.reserved, sizeof b);
  return b;
}
template <typename Handle>
void fillHandle(Handle* h, const HandleBits& b) {
  memcpy(h->reserved, &b, sizeof b);
}

// Takes the memfd-backed range at `begin` (opened by cuIpcOpenMemHandle or not, as asked)
// out of the maps, after waiting for every stream's work (as cudaFree does: queued work may
// still use it), and unmaps it. kInvalidValue when there is none.
CUresult releaseBacked(CUdeviceptr begin, bool opened) {
  auto known = [&] {
    std::lock_guard<std::mutex> lock(state().mu);
    auto it = state().backed.find(begin);
    return it != state().backed.end() && it->second.opened == opened;
  };
  if (!known()) return kInvalidValue;
  Points points;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    if (forbiddenByCaptureLocked()) return kCaptureUnsupported;
    points = everythingLocked();
  }
  waitAll(points);
  Backed b;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    auto it = state().backed.find(begin);
    if (it == state().backed.end() || it->second.opened != opened) return kInvalidValue;
    b = it->second;
    state().backed.erase(it);
    state().allocs.erase(begin);
  }
  unmapBacked(b);
  return kSuccess;
}

constexpr unsigned kEventDisableTiming = 0x2, kEventInterprocess = 0x4;

// A new interprocess event page of this process's, or nullptr.
std::shared_ptr<IpcEventPage> newEventPage() {
  uint64_t serial;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    serial = ++state().lastSerial;
  }
  const int fd = newMemfd("event", getpid(), serial, IpcEventPage::kBytes);
  if (fd < 0) return nullptr;
  auto page = std::make_shared<IpcEventPage>();
  if (!page->map(fd)) {
    close(fd);
    return nullptr;
  }
  page->maker = static_cast<uint64_t>(getpid());
  page->serial = serial;
  return page;
}

// Interprocess events cannot be captured here: their records and waits go through the
// shared page at the time of the call, which a graph could not replay. The call fails and
// breaks the capture (CUDA's own rules for them in graphs are not modelled).
CUresult refuseIpcEventInCapture(const std::shared_ptr<Capture>& c) {
  c->invalidated = true;
  return kCaptureUnsupported;
}
}  // namespace

extern "C" {

__attribute__((visibility("default"))) CUresult cuInit(unsigned flags) {
  return flags != 0 ? kInvalidValue : state().initResult.load();
}

__attribute__((visibility("default"))) CUresult cuDriverGetVersion(int* version) {
  if (!version) return kInvalidValue;
  *version = 13000;
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuGetErrorString(CUresult error,
                                                                 const char** text) {
  if (!text) return kInvalidValue;
  switch (error) {
    case 0: *text = "no error"; break;
    case 1: *text = "invalid argument"; break;
    case 2: *text = "out of memory"; break;
    case 3: *text = "initialization error"; break;
    case 4: *text = "driver shutting down"; break;
    case 100: *text = "no CUDA-capable device is detected"; break;
    case 201: *text = "invalid device context"; break;
    case 400: *text = "invalid resource handle"; break;
    case 401: *text = "the operation cannot be performed in the present state"; break;
    case 500: *text = "named symbol not found"; break;
    case 600: *text = "device not ready"; break;
    case 900: *text = "operation not permitted when stream is capturing"; break;
    case 901: *text = "operation failed due to a previous error during capture"; break;
    case 902: *text = "operation would result in a merge of separate capture sequences"; break;
    case 903: *text = "capture was not ended in the same stream as it began"; break;
    case 905: *text = "dependency created on uncaptured work in another stream"; break;
    case 906:
      *text = "operation would make the legacy stream depend on a capturing blocking stream";
      break;
    case 907:
      *text = "operation not permitted on an event last recorded in a capturing stream";
      break;
    case 908:
      *text = "attempt to terminate a thread-local capture sequence from another thread";
      break;
    default: *text = nullptr; return kInvalidValue;
  }
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuCtxGetDevice(int* device) {
  if (!device) return kInvalidValue;
  std::lock_guard<std::mutex> lock(state().mu);
  const int current = tlsDevice != kNoThreadContext ? tlsDevice : state().currentDevice;
  if (current < 0) return kInvalidContext;
  *device = current;
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuDeviceGetCount(int* count) {
  if (!count) return kInvalidValue;
  // LOOM_STAND_IN_DEVICE_COUNT (1 to 4) shows fewer: a machine with one GPU, where a
  // benchmark puts every rank on device 0.
  const char* v = getenv("LOOM_STAND_IN_DEVICE_COUNT");
  const int n = v && *v ? atoi(v) : kDevices;
  *count = n >= 1 && n <= kDevices ? n : kDevices;
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuDeviceGetName(char* name, int len, int device) {
  if (!name || len <= 0 || device < 0 || device >= kDevices) return kInvalidValue;
  snprintf(name, static_cast<size_t>(len), "Stand-in GPU %d", device);
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuDeviceGet(int* device, int ordinal) {
  if (!device || ordinal < 0 || ordinal >= kDevices) return kInvalidValue;
  *device = ordinal;
  return kSuccess;
}

// Every stand-in device reaches every other's memory (it is all this process's memory): peer
// access is possible between any two, enabled once per (current context, peer) as CUDA says.
__attribute__((visibility("default"))) CUresult cuDeviceCanAccessPeer(int* can, int device,
                                                                      int peer) {
  if (!can || device < 0 || device >= kDevices || peer < 0 || peer >= kDevices) return kInvalidValue;
  *can = device != peer ? 1 : 0;
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuCtxEnablePeerAccess(void* peerCtx, unsigned flags) {
  constexpr CUresult kAlreadyEnabled = 704;  // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
  const auto peer = reinterpret_cast<uintptr_t>(peerCtx);
  if (flags != 0 || peer < 1 || peer > static_cast<uintptr_t>(kDevices)) return kInvalidValue;
  static std::mutex mu;
  static std::set<std::pair<int, uintptr_t>> enabled;
  std::lock_guard<std::mutex> lock(mu);
  const int current = tlsDevice != kNoThreadContext ? tlsDevice : state().currentDevice;
  return enabled.insert({current, peer}).second ? kSuccess : kAlreadyEnabled;
}

// Device d's UUID: "stand-in gpu" and the ordinal.
__attribute__((visibility("default"))) CUresult cuDeviceGetUuid_v2(unsigned char* uuid,
                                                                   int device) {
  if (!uuid || device < 0 || device >= kDevices) return kInvalidValue;
  static const char kTag[] = "stand-in gpu ";
  for (int i = 0; i < 16; ++i) uuid[i] = i < 13 ? kTag[i] : 0;
  uuid[15] = static_cast<unsigned char>(device);
  return kSuccess;
}

// A primary context is the device's ordinal + 1 in disguise.
__attribute__((visibility("default"))) CUresult cuDevicePrimaryCtxRetain(void** ctx,
                                                                         int device) {
  if (!ctx || device < 0 || device >= kDevices) return kInvalidValue;
  *ctx = reinterpret_cast<void*>(static_cast<uintptr_t>(device) + 1);
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuCtxGetCurrent(void** ctx) {
  if (!ctx) return kInvalidValue;
  std::lock_guard<std::mutex> lock(state().mu);
  const int current = tlsDevice != kNoThreadContext ? tlsDevice : state().currentDevice;
  *ctx = reinterpret_cast<void*>(static_cast<uintptr_t>(current + 1));  // -1: none
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuCtxSetCurrent(void* ctx) {
  tlsDevice = static_cast<int>(reinterpret_cast<uintptr_t>(ctx)) - 1;
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuPointerGetAttributes(
    unsigned count, int* attrs, void** data, unsigned long long ptr) {
  State& s = state();
  s.queries.fetch_add(1);
  if (CUresult r = s.queryResult.load(); r != kSuccess) return r;
  if (!attrs || !data) return kInvalidValue;
  Range found{0, 0, 0, 0, kNoOrdinal};
  {
    std::lock_guard<std::mutex> lock(s.mu);
    findRangeLocked(ptr, &found);
  }
  for (unsigned i = 0; i < count; ++i) {
    switch (attrs[i]) {
      case kAttrMemoryType: *static_cast<unsigned*>(data[i]) = found.memType; break;
      case kAttrIsManaged: *static_cast<unsigned char*>(data[i]) = found.managed ? 1 : 0; break;
      case kAttrDeviceOrdinal: *static_cast<int*>(data[i]) = found.device; break;
      default: return kInvalidValue;
    }
  }
  return kSuccess;
}

// ---- memory

// Device memory of the calling thread's current device: a memfd of `bytes`, mapped
// PROT_NONE where it is handed out and read-write at the stand-in's alias (see Backed), so
// that cuIpcGetMemHandle can share it. Sparse, as the anonymous MAP_NORESERVE pages were.
__attribute__((visibility("default"))) CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  if (!dptr || bytes == 0) return kInvalidValue;
  const int device = callerDevice();
  if (device < 0) return kInvalidContext;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    if (forbiddenByCaptureLocked()) return kCaptureUnsupported;
  }
  uint64_t serial;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    serial = ++state().lastSerial;
  }
  const int fd = newMemfd("mem", getpid(), serial, bytes);
  if (fd < 0) return kOutOfMemory;
  uintptr_t b = 0;
  char* alias = nullptr;
  if (!mapTwice(fd, bytes, nullptr, nullptr, &b, &alias)) {
    close(fd);
    return kOutOfMemory;
  }
  {
    std::lock_guard<std::mutex> lock(state().mu);
    state().allocs[b] = Range{b, b + bytes, 2, 0, device};
    state().backed[b] = Backed{b, b + bytes, alias, fd, serial, false};
  }
  *dptr = b;
  return kSuccess;
}


// A DMA-BUF of device memory, as a NIC would import it: here a new descriptor of the
// allocation's memfd, which a test plugin maps (offset 0 is the allocation's start; the
// stand-in exports whole allocations from their start only).
__attribute__((visibility("default"))) CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr,
                                                                               size_t size, int type,
                                                                               unsigned long long flags) {
  if (!handle || type != 1 /* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */ || flags != 0 || size == 0)
    return kInvalidValue;
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().backed.find(dptr);
  if (it == state().backed.end() || it->second.opened || size > it->second.end - it->second.begin)
    return kInvalidValue;
  const int fd = dup(it->second.fd);
  if (fd < 0) return kOutOfMemory;
  *static_cast<int*>(handle) = fd;
  return kSuccess;
}

// Memory that cuIpcOpenMemHandle mapped is cuIpcCloseMemHandle's to release, not this.
__attribute__((visibility("default"))) CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return releaseBacked(dptr, false);
}

// The allocation holding dptr: cuMemAlloc's, a mapping cuIpcOpenMemHandle opened, or a
// range a test registered as device (or managed) memory. Either answer may be left out.
__attribute__((visibility("default"))) CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase,
                                                                        size_t* psize,
                                                                        CUdeviceptr dptr) {
  if (callerDevice() < 0) return kInvalidContext;
  Range r;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    if (!findRangeLocked(dptr, &r) || !deviceLike(r)) return kNotFound;
  }
  if (pbase) *pbase = r.begin;
  if (psize) *psize = r.end - r.begin;
  return kSuccess;
}

// ---- IPC memory


// A handle for a whole allocation of cuMemAlloc's in this process (dptr its base, as CUDA
// requires): the memfd behind it, named by this process's id, its descriptor and the
// allocation's serial number, so that no later allocation yields an equal handle.
__attribute__((visibility("default"))) CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle,
                                                                  CUdeviceptr dptr) {
  if (!pHandle) return kInvalidValue;
  HandleBits bits{};
  {
    std::lock_guard<std::mutex> lock(state().mu);
    auto it = state().backed.find(dptr);
    if (it == state().backed.end() || it->second.opened) return kInvalidValue;
    const Backed& b = it->second;
    const auto self = static_cast<uint64_t>(getpid());
    bits = HandleBits{kMemHandleMagic, self, self, b.serial, b.end - b.begin, b.fd, {}};
  }
  fillHandle(pHandle, bits);
  return kSuccess;
}

// Maps another process's allocation, as device memory of the caller's current device.
// CUDA refuses a handle of the calling process itself (CUDA_ERROR_INVALID_CONTEXT); a
// handle whose memory cannot be reached (not a handle of this stand-in's, the process or
// its descriptor gone, the descriptor now naming something else) is an invalid handle.
// Opening one handle twice in a process gives two mappings of the same memory, each to be
// closed with cuIpcCloseMemHandle (CUDA may instead hand out the first mapping again).
__attribute__((visibility("default"))) CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr,
                                                                      CUipcMemHandle handle,
                                                                      unsigned flags) {
  if (!pdptr || (flags & ~kIpcMemLazyEnablePeerAccess)) return kInvalidValue;
  const int device = callerDevice();
  if (device < 0) return kInvalidContext;
  const HandleBits h = bitsOf(handle);
  if (h.magic != kMemHandleMagic || h.size == 0) return kInvalidHandle;
  if (h.pid == static_cast<uint64_t>(getpid())) return kInvalidContext;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    if (forbiddenByCaptureLocked()) return kCaptureUnsupported;
  }
  const int fd = openExported(h, "mem", static_cast<off_t>(h.size));
  if (fd < 0) return kInvalidHandle;
  uintptr_t b = 0;
  char* alias = nullptr;
  if (!mapTwice(fd, h.size, nullptr, nullptr, &b, &alias)) {
    close(fd);
    return kOutOfMemory;
  }
  {
    std::lock_guard<std::mutex> lock(state().mu);
    state().allocs[b] = Range{b, b + h.size, 2, 0, device};
    state().backed[b] = Backed{b, b + h.size, alias, fd, h.serial, true};
  }
  *pdptr = b;
  return kSuccess;
}

// Unmaps what cuIpcOpenMemHandle mapped (dptr: the base it returned), once every stream's
// queued work is done, as cuMemFree does here; the exporter's memory lives on.
__attribute__((visibility("default"))) CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  return releaseBacked(dptr, true);
}

// Pinned host memory: ordinary read-write pages the device maps (memory type 1).
__attribute__((visibility("default"))) CUresult cuMemHostAlloc(void** pp, size_t bytes,
                                                               unsigned flags) {
  constexpr unsigned kPortable = 0x1, kDeviceMap = 0x2, kWriteCombined = 0x4;
  if (!pp || bytes == 0 || (flags & ~(kPortable | kDeviceMap | kWriteCombined)))
    return kInvalidValue;
  const int device = callerDevice();
  if (device < 0) return kInvalidContext;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    if (forbiddenByCaptureLocked()) return kCaptureUnsupported;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return kOutOfMemory;
  const auto b = reinterpret_cast<uintptr_t>(p);
  {
    std::lock_guard<std::mutex> lock(state().mu);
    state().allocs[b] = Range{b, b + bytes, 1, 0, device};
  }
  *pp = p;
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuMemAllocHost_v2(void** pp, size_t bytes) {
  return cuMemHostAlloc(pp, bytes, 0);
}

// Like cuMemFree, waits for all streams first (seen on an H100 with driver 580: a stream
// held by cuStreamWaitValue32 holds cuMemFreeHost too).
__attribute__((visibility("default"))) CUresult cuMemFreeHost(void* p) {
  auto known = [&] {
    std::lock_guard<std::mutex> lock(state().mu);
    auto it = state().allocs.find(reinterpret_cast<uintptr_t>(p));
    return p && it != state().allocs.end() && it->second.memType == 1;
  };
  if (!known()) return kInvalidValue;
  Points points;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    points = everythingLocked();
  }
  waitAll(points);
  Range r;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    auto it = state().allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == state().allocs.end() || it->second.memType != 1) return kInvalidValue;
    r = it->second;
    state().allocs.erase(it);
  }
  munmap(reinterpret_cast<void*>(r.begin), r.end - r.begin);
  return kSuccess;
}

// With unified addressing the device sees pinned memory at its host address. A range a
// test registered as pinned host memory (cuMemAllocHost's, in effect) counts as well.
__attribute__((visibility("default"))) CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr,
                                                                             void* p,
                                                                             unsigned flags) {
  if (!pdptr || !p || flags != 0) return kInvalidValue;
  std::lock_guard<std::mutex> lock(state().mu);
  Range r;
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (!findRangeLocked(a, &r) || r.memType != 1 || r.managed) return kInvalidValue;
  *pdptr = a;
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src,
                                                              size_t bytes, void* stream) {
  if (bytes > 0 && (!dst || !src)) return kInvalidValue;
  std::vector<Op> ops;
  if (bytes > 0) ops.push_back(Op{{}, [dst, src, bytes] { copyBytes(dst, src, bytes); }});
  return enqueue(stream, std::move(ops));
}

__attribute__((visibility("default"))) CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src,
                                                         size_t bytes) {
  if (bytes > 0 && (!dst || !src)) return kInvalidValue;
  return runOnLegacy([dst, src, bytes] {
    if (bytes > 0) copyBytes(dst, src, bytes);
  });
}

__attribute__((visibility("default"))) CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src,
                                                                size_t bytes) {
  return cuMemcpy(dst, reinterpret_cast<uintptr_t>(src), bytes);
}

__attribute__((visibility("default"))) CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src,
                                                                size_t bytes) {
  return cuMemcpy(reinterpret_cast<uintptr_t>(dst), src, bytes);
}

__attribute__((visibility("default"))) CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value,
                                                              size_t count) {
  if (count > 0 && !dst) return kInvalidValue;
  return runOnLegacy([dst, value, count] {
    if (count > 0) fillBytes(dst, value, count);
  });
}

// ---- streams

__attribute__((visibility("default"))) CUresult cuStreamCreate(void** phStream, unsigned flags) {
  if (!phStream || (flags & ~kStreamNonBlocking)) return kInvalidValue;
  if (callerDevice() < 0) return kInvalidContext;
  auto s = std::make_shared<Stream>(StreamKind::Created, (flags & kStreamNonBlocking) == 0);
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().streams[s.get()] = s;
  *phStream = s.get();
  return kSuccess;
}

// CUDA returns at once and frees the stream when its work is done; waiting for that work
// instead keeps memory that a test frees next out of a worker's reach. A paused stream is
// let go first: nothing could resume it any more.
__attribute__((visibility("default"))) CUresult cuStreamDestroy_v2(void* stream) {
  std::shared_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    s = findLocked(registry().streams, stream);
    if (!s || s->kind != StreamKind::Created) return kInvalidHandle;
    registry().streams.erase(stream);
    leaveCaptureLocked(s);
  }
  std::unique_lock<std::mutex> lock(s->mu);
  s->paused = false;
  s->stopping = true;
  s->cv.notify_all();
  if (s->started) s->cv.wait(lock, [&] { return s->exited; });
  return kSuccess;
}

namespace {
// What synchronizing or querying `stream` waits for (everything queued on it so far), or
// why it may not: a capturing stream (which the call invalidates), a legacy stream while
// blocking streams capture.
CUresult pointsToWaitFor(void* stream, Points* points) {
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Stream> s;
  if (CUresult r = resolveLocked(stream, &s)) return r;
  if (s->capture) {
    s->capture->invalidated = true;
    return kCaptureUnsupported;
  }
  if (s->kind == StreamKind::Legacy && legacyBlockedLocked(true)) return kCaptureImplicit;
  *points = untilNowLocked(s);
  return kSuccess;
}
}  // namespace

__attribute__((visibility("default"))) CUresult cuStreamSynchronize(void* stream) {
  Points points;
  if (CUresult r = pointsToWaitFor(stream, &points)) return r;
  waitAll(points);
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuStreamQuery(void* stream) {
  Points points;
  if (CUresult r = pointsToWaitFor(stream, &points)) return r;
  return allReached(points) ? kSuccess : kNotReady;
}

__attribute__((visibility("default"))) CUresult cuCtxSynchronize() {
  Points points;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    if (callerDevice() < 0) return kInvalidContext;
    // It would wait for capturing streams too, which CUDA refuses whatever the mode.
    if (!registry().captures.empty()) {
      for (const auto& c : registry().captures) c->invalidated = true;
      return kCaptureUnsupported;
    }
    points = everythingLocked();
  }
  waitAll(points);
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuLaunchHostFunc(void* stream, CUhostFn fn,
                                                                 void* userData) {
  if (!fn) return kInvalidValue;
  return enqueue(stream, {Op{{}, [fn, userData] { fn(userData); }}});
}

__attribute__((visibility("default"))) CUresult cuStreamWaitValue32_v2(void* stream,
                                                                       CUdeviceptr addr,
                                                                       uint32_t value,
                                                                       unsigned flags) {
  if (flags & ~(3u | kWaitFlush)) return kInvalidValue;
  bool device = false;
  if (!wordTarget(addr, &device)) return kInvalidValue;
  const unsigned cond = flags & 3u;  // the flush bit changes nothing here
  return enqueue(stream, {Op{{}, [=] { waitWord(addr, value, cond, device); }}});
}

__attribute__((visibility("default"))) CUresult cuStreamWriteValue32_v2(void* stream,
                                                                        CUdeviceptr addr,
                                                                        uint32_t value,
                                                                        unsigned flags) {
  constexpr unsigned kNoMemoryBarrier = 0x1;
  if (flags & ~kNoMemoryBarrier) return kInvalidValue;
  bool device = false;
  if (!wordTarget(addr, &device)) return kInvalidValue;
  return enqueue(stream, {Op{{}, [=] { storeWord(addr, value, device); }}});
}

// ---- events


// CU_EVENT_INTERPROCESS requires CU_EVENT_DISABLE_TIMING, as in CUDA; such an event owns a
// shared page (IpcEventPage) that cuIpcGetEventHandle exports.
__attribute__((visibility("default"))) CUresult cuEventCreate(void** phEvent, unsigned flags) {
  constexpr unsigned kKnownFlags = 0x1 | kEventDisableTiming | kEventInterprocess;
  if (!phEvent || (flags & ~kKnownFlags)) return kInvalidValue;
  if ((flags & kEventInterprocess) && !(flags & kEventDisableTiming)) return kInvalidValue;
  if (callerDevice() < 0) return kInvalidContext;
  auto e = std::make_shared<Event>();
  if (flags & kEventInterprocess) {
    e->ipc = newEventPage();
    if (!e->ipc) return kOutOfMemory;
  }
  std::lock_guard<std::mutex> lock(registry().mu);
  if (forbiddenByCaptureLocked()) return kCaptureUnsupported;
  registry().events[e.get()] = e;
  *phEvent = e.get();
  return kSuccess;
}

// An interprocess event's page lives on in the operations still queued for it.
__attribute__((visibility("default"))) CUresult cuEventDestroy_v2(void* event) {
  std::lock_guard<std::mutex> lock(registry().mu);
  return registry().events.erase(event) ? kSuccess : kInvalidHandle;
}

// The event stands for the stream's work queued so far; recording again replaces that. An
// interprocess event (created so, or opened from a handle) also takes the next record
// number, which an operation queued now marks completed on the shared page when the stream
// reaches it: waits in every process holding the event go by that.
__attribute__((visibility("default"))) CUresult cuEventRecord(void* event, void* stream) {
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Event> e = findLocked(registry().events, event);
  if (!e) return kInvalidHandle;
  std::shared_ptr<Stream> s;
  if (CUresult r = resolveLocked(stream, &s)) return r;
  if (e->ipc) {
    if (s->capture) return refuseIpcEventInCapture(s->capture);
    if (s->kind == StreamKind::Legacy && legacyBlockedLocked(true)) return kCaptureImplicit;
    const uint64_t g = e->ipc->record();
    std::vector<Op> ops;
    ops.push_back(Op{{}, [page = e->ipc, g] { page->complete(g); }});
    if (CUresult r = enqueueLocked(s, std::move(ops))) return r;
    e->points = untilNowLocked(s);  // covers the marking operation
    return kSuccess;
  }
  if (const std::shared_ptr<Capture>& c = s->capture) {
    if (c->invalidated) return kCaptureInvalidated;
    e->captured = true;
    e->capturedIn = c;
    e->points.clear();
    return kSuccess;
  }
  if (s->kind == StreamKind::Legacy && legacyBlockedLocked(true)) return kCaptureImplicit;
  e->captured = false;
  e->capturedIn.reset();
  e->points = untilNowLocked(s);
  return kSuccess;
}

// The stream waits for the work the event stands for now; later records do not matter.
// For an interprocess event that is the latest record at the call, whichever process made
// it: an operation polls the shared page until that record is completed.
__attribute__((visibility("default"))) CUresult cuStreamWaitEvent(void* stream, void* event,
                                                                  unsigned flags) {
  constexpr unsigned kWaitExternal = 0x1;  // CU_EVENT_WAIT_EXTERNAL
  if (flags & ~kWaitExternal) return kInvalidValue;
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Event> e = findLocked(registry().events, event);
  if (!e) return kInvalidHandle;
  std::shared_ptr<Stream> s;
  if (CUresult r = resolveLocked(stream, &s)) return r;

  if (e->ipc) {
    if (s->capture) return refuseIpcEventInCapture(s->capture);
    if (flags & kWaitExternal) return kInvalidValue;  // only meaningful while capturing
    const uint64_t g = e->ipc->latest();
    std::vector<Op> ops;
    if (g > 0)
      ops.push_back(Op{{}, [page = e->ipc, g] { pollUntil([&] { return page->reached(g); }); }});
    return enqueueLocked(s, std::move(ops));
  }

  if (const std::shared_ptr<Capture> c = s->capture) {
    if (c->invalidated) return kCaptureInvalidated;
    if (e->captured) {
      std::shared_ptr<Capture> from = e->capturedIn.lock();
      if (from == c) return kSuccess;  // already ordered: the graph is linear
      c->invalidated = true;
      return from ? kCaptureMerge : kCapturedEvent;
    }
    if (flags & kWaitExternal) {
      // An external event node: each launch waits for the event as last recorded then.
      c->graph->ops.push_back(Op{{}, [e] {
        Points points;
        {
          std::lock_guard<std::mutex> inner(registry().mu);
          if (!e->captured) points = e->points;
        }
        waitAll(points);
      }});
      return kSuccess;
    }
    if (e->points.empty()) return kSuccess;  // an empty set of work crosses no boundary
    c->invalidated = true;
    return kCaptureIsolation;
  }

  if (flags & kWaitExternal) return kInvalidValue;  // only meaningful while capturing
  if (e->captured) {
    std::shared_ptr<Capture> c = e->capturedIn.lock();
    if (!c) return kCapturedEvent;  // its capture has ended
    if (s->kind == StreamKind::Legacy) {
      c->invalidated = true;
      return kCaptureImplicit;
    }
    if (c->invalidated) return kCaptureInvalidated;
    // Waiting for captured work forks the capture into this stream.
    s->capture = c;
    c->members.push_back(s);
    return kSuccess;
  }
  std::vector<Op> ops;
  if (!e->points.empty()) ops.push_back(Op{e->points, {}});
  return enqueueLocked(s, std::move(ops));
}

namespace {
// What an event stands for now, or why it has nothing to wait for.
CUresult eventTarget(void* event, EventTarget* target) {
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Event> e = findLocked(registry().events, event);
  if (!e) return kInvalidHandle;
  if (e->ipc) {
    target->ipc = e->ipc;
    target->record = e->ipc->latest();
    return kSuccess;
  }
  if (e->captured) return kCapturedEvent;
  target->points = e->points;
  return kSuccess;
}
}  // namespace

__attribute__((visibility("default"))) CUresult cuEventQuery(void* event) {
  EventTarget target;
  if (CUresult r = eventTarget(event, &target)) return r;
  return target.reached() ? kSuccess : kNotReady;
}

__attribute__((visibility("default"))) CUresult cuEventSynchronize(void* event) {
  EventTarget target;
  if (CUresult r = eventTarget(event, &target)) return r;
  target.wait();
  return kSuccess;
}

// ---- IPC events

// A handle for an interprocess event of this process's (created with CU_EVENT_INTERPROCESS,
// or itself opened from a handle): its page's memfd.
__attribute__((visibility("default"))) CUresult cuIpcGetEventHandle(CUipcEventHandle* pHandle,
                                                                    void* event) {
  if (!pHandle) return kInvalidValue;
  std::shared_ptr<IpcEventPage> page;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    std::shared_ptr<Event> e = findLocked(registry().events, event);
    if (!e) return kInvalidHandle;
    if (!e->ipc) return kInvalidValue;
    page = e->ipc;
  }
  fillHandle(pHandle, HandleBits{kEventHandleMagic, static_cast<uint64_t>(getpid()),
                                 page->maker, page->serial, 0, page->fd, {}});
  return kSuccess;
}

// An event of this process's on another process's interprocess event: it maps the same
// page, so that records in either process are seen by waits in both. As for memory
// handles, a handle of the calling process itself is refused (CUDA_ERROR_INVALID_CONTEXT),
// and one whose page cannot be reached is an invalid handle. Every open makes a new event,
// to be destroyed with cuEventDestroy.
__attribute__((visibility("default"))) CUresult cuIpcOpenEventHandle(void** phEvent,
                                                                     CUipcEventHandle handle) {
  if (!phEvent) return kInvalidValue;
  if (callerDevice() < 0) return kInvalidContext;
  const HandleBits h = bitsOf(handle);
  if (h.magic != kEventHandleMagic) return kInvalidHandle;
  if (h.pid == static_cast<uint64_t>(getpid())) return kInvalidContext;
  const int fd = openExported(h, "event", IpcEventPage::kBytes);
  if (fd < 0) return kInvalidHandle;
  auto e = std::make_shared<Event>();
  e->ipc = std::make_shared<IpcEventPage>();
  if (!e->ipc->map(fd)) {
    close(fd);
    return kOutOfMemory;
  }
  e->ipc->maker = h.maker;
  e->ipc->serial = h.serial;
  std::lock_guard<std::mutex> lock(registry().mu);
  if (forbiddenByCaptureLocked()) return kCaptureUnsupported;
  registry().events[e.get()] = e;
  *phEvent = e.get();
  return kSuccess;
}

// ---- capture and graphs

__attribute__((visibility("default"))) CUresult cuStreamBeginCapture_v2(void* stream, int mode) {
  if (mode != kCaptureGlobal && mode != kCaptureThreadLocal && mode != kCaptureRelaxed)
    return kInvalidValue;
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Stream> s;
  if (CUresult r = resolveLocked(stream, &s)) return r;
  if (s->kind == StreamKind::Legacy) return kCaptureUnsupported;
  if (s->capture) return kIllegalState;
  auto c = std::make_shared<Capture>();
  c->mode = mode;
  c->id = ++registry().lastCaptureId;
  c->thread = std::this_thread::get_id();
  c->origin = s.get();
  c->members.push_back(s);
  c->graph = std::make_shared<Graph>();
  c->graph->capturing = true;
  registry().graphs[c->graph.get()] = c->graph;
  s->capture = c;
  registry().captures.push_back(c);
  return kSuccess;
}

// Ends the capture on every stream in it. Forks that were never joined back are not
// detected (CUDA: CUDA_ERROR_STREAM_CAPTURE_UNJOINED). A broken capture's graph is
// destroyed, with the user object references it was given.
__attribute__((visibility("default"))) CUresult cuStreamEndCapture(void* stream, void** phGraph) {
  if (!phGraph) return kInvalidValue;
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Stream> s;
  if (CUresult r = resolveLocked(stream, &s)) return r;
  std::shared_ptr<Capture> c = s->capture;
  if (!c) return kIllegalState;
  if (c->origin != s.get()) return kCaptureUnmatched;
  if (c->mode != kCaptureRelaxed && c->thread != std::this_thread::get_id())
    return kCaptureWrongThread;
  for (const auto& m : c->members) m->capture.reset();
  std::erase(registry().captures, c);
  *phGraph = nullptr;
  if (c->invalidated) {
    registry().graphs.erase(c->graph.get());
    return kCaptureInvalidated;
  }
  c->graph->capturing = false;
  *phGraph = c->graph.get();
  return kSuccess;
}

// CUstreamCaptureStatus: 0 none, 1 active, 2 invalidated.
__attribute__((visibility("default"))) CUresult cuStreamIsCapturing(void* stream, int* status) {
  if (!status) return kInvalidValue;
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Stream> s;
  if (CUresult r = resolveLocked(stream, &s)) return r;
  if (s->kind == StreamKind::Legacy && legacyBlockedLocked(false)) return kCaptureImplicit;
  *status = !s->capture ? 0 : s->capture->invalidated ? 2 : 1;
  return kSuccess;
}

// cuStreamGetCaptureInfo (CUDA 12.3+): the status as cuStreamIsCapturing; while it is
// active, the capture's id and the graph being captured into. Captured graphs are linear
// and have no node handles: the dependency set is reported empty. The status is required;
// the rest is optional, but edge data only with dependencies (as cuda.h says).
__attribute__((visibility("default"))) CUresult cuStreamGetCaptureInfo_v3(
    void* stream, int* status, uint64_t* id, void** graph, const void* const** deps,
    const void** edgeData, size_t* numDeps) {
  if (!status || (edgeData && !deps)) return kInvalidValue;
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Stream> s;
  if (CUresult r = resolveLocked(stream, &s)) return r;
  if (s->kind == StreamKind::Legacy && legacyBlockedLocked(false)) return kCaptureImplicit;
  const Capture* c = s->capture.get();
  *status = !c ? 0 : c->invalidated ? 2 : 1;
  const bool active = *status == 1;  // anything else is valid only while active
  if (id) *id = active ? c->id : 0;
  if (graph) *graph = active ? c->graph.get() : nullptr;
  if (deps) *deps = nullptr;
  if (edgeData) *edgeData = nullptr;
  if (numDeps) *numDeps = 0;
  return kSuccess;
}

// Swaps the calling thread's capture interaction mode (see forbiddenByCaptureLocked).
__attribute__((visibility("default"))) CUresult cuThreadExchangeStreamCaptureMode(int* mode) {
  if (!mode || (*mode != kCaptureGlobal && *mode != kCaptureThreadLocal &&
                *mode != kCaptureRelaxed))
    return kInvalidValue;
  std::swap(*mode, tlsCaptureMode);
  return kSuccess;
}

// The exec holds a reference to every user object the graph holds now, so that each lives
// until the graph and every exec made from it are gone. A graph still being captured into
// may be instantiated as far as it goes, as in CUDA.
__attribute__((visibility("default"))) CUresult cuGraphInstantiateWithFlags(
    void** phGraphExec, void* graph, unsigned long long flags) {
  if (!phGraphExec) return kInvalidValue;
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Graph> g = findLocked(registry().graphs, graph);
  if (!g) return kInvalidHandle;
  auto exec = std::make_shared<Exec>();
  exec->ops = g->ops;  // later changes to the graph do not reach it
  auto refs = std::make_shared<UserRefs>();
  if (!g->userRefs.held.empty()) {
    std::lock_guard<std::mutex> inner(userObjects().mu);
    for (const auto& [o, n] : g->userRefs.held) {
      ++o->refs;
      refs->held[o] = 1;
    }
  }
  exec->userRefs = std::move(refs);
  registry().execs[exec.get()] = exec;
  *phGraphExec = exec.get();
  return kSuccess;
}

// Queues the graph's operations in order; a host function runs at every launch. The last
// one carries the exec's user object references until the launch is done.
__attribute__((visibility("default"))) CUresult cuGraphLaunch(void* graphExec, void* stream) {
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Exec> exec = findLocked(registry().execs, graphExec);
  if (!exec) return kInvalidHandle;
  std::shared_ptr<Stream> s;
  if (CUresult r = resolveLocked(stream, &s)) return r;
  std::vector<Op> ops = exec->ops;
  if (!ops.empty() && !exec->userRefs->held.empty()) {
    Op& last = ops.back();
    last.run = [run = std::move(last.run), keep = exec->userRefs] {
      if (run) run();
    };
  }
  return enqueueLocked(s, std::move(ops));
}

// Launches still queued or running keep the exec's user objects (see Exec).
__attribute__((visibility("default"))) CUresult cuGraphExecDestroy(void* graphExec) {
  std::lock_guard<std::mutex> lock(registry().mu);
  return registry().execs.erase(graphExec) ? kSuccess : kInvalidHandle;
}

// Releases the graph's user object references; execs made from it keep their own. A graph
// being captured into cannot be destroyed before its capture ends.
__attribute__((visibility("default"))) CUresult cuGraphDestroy(void* graph) {
  std::lock_guard<std::mutex> lock(registry().mu);
  auto it = registry().graphs.find(graph);
  if (it == registry().graphs.end()) return kInvalidHandle;
  if (it->second->capturing) return kIllegalState;
  registry().graphs.erase(it);
  return kSuccess;
}

// ---- user objects

constexpr unsigned kUserObjectNoDestructorSync = 1;  // CU_USER_OBJECT_NO_DESTRUCTOR_SYNC
constexpr unsigned kGraphUserObjectMove = 1;         // CU_GRAPH_USER_OBJECT_MOVE
constexpr uint64_t kMaxRefCount = 0x7fffffff;        // counts are at most INT_MAX

// The caller owns the initial references. CUDA requires CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.
__attribute__((visibility("default"))) CUresult cuUserObjectCreate(void** out, void* ptr,
                                                                   CUhostFn destroy,
                                                                   unsigned initialRefcount,
                                                                   unsigned flags) {
  if (!out || !destroy || initialRefcount == 0 || initialRefcount > kMaxRefCount ||
      flags != kUserObjectNoDestructorSync)
    return kInvalidValue;
  auto o = std::make_unique<UserObject>(UserObject{ptr, destroy, initialRefcount});
  UserObjects& u = userObjects();
  std::lock_guard<std::mutex> lock(u.mu);
  *out = o.get();
  u.live[o.get()] = std::move(o);
  u.pending.fetch_add(1);
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuUserObjectRetain(void* object, unsigned count) {
  if (count == 0 || count > kMaxRefCount) return kInvalidValue;
  UserObjects& u = userObjects();
  std::lock_guard<std::mutex> lock(u.mu);
  auto it = u.live.find(object);
  if (it == u.live.end()) return kInvalidValue;
  it->second->refs += count;
  return kSuccess;
}

// Releasing more than is left (undefined in CUDA) is refused.
__attribute__((visibility("default"))) CUresult cuUserObjectRelease(void* object,
                                                                    unsigned count) {
  if (count == 0 || count > kMaxRefCount) return kInvalidValue;
  UserObjects& u = userObjects();
  std::lock_guard<std::mutex> lock(u.mu);
  auto it = u.live.find(object);
  if (it == u.live.end() || it->second->refs < count) return kInvalidValue;
  releaseLocked(it->second.get(), count);
  return kSuccess;
}

// New references for the graph, or with CU_GRAPH_USER_OBJECT_MOVE the caller's moved to it.
// A graph being captured into (cuStreamGetCaptureInfo) counts.
__attribute__((visibility("default"))) CUresult cuGraphRetainUserObject(void* graph,
                                                                        void* object,
                                                                        unsigned count,
                                                                        unsigned flags) {
  if (count == 0 || count > kMaxRefCount || (flags & ~kGraphUserObjectMove))
    return kInvalidValue;
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Graph> g = findLocked(registry().graphs, graph);
  if (!g) return kInvalidValue;
  UserObjects& u = userObjects();
  std::lock_guard<std::mutex> inner(u.mu);
  auto it = u.live.find(object);
  if (it == u.live.end()) return kInvalidValue;
  UserObject* o = it->second.get();
  if (flags & kGraphUserObjectMove) {
    if (o->refs < count) return kInvalidValue;  // more than anyone holds: not the caller's
  } else {
    o->refs += count;
  }
  g->userRefs.held[o] += count;
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuGraphReleaseUserObject(void* graph,
                                                                         void* object,
                                                                         unsigned count) {
  if (count == 0 || count > kMaxRefCount) return kInvalidValue;
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Graph> g = findLocked(registry().graphs, graph);
  if (!g) return kInvalidValue;
  UserObjects& u = userObjects();
  std::lock_guard<std::mutex> inner(u.mu);
  auto it = u.live.find(object);
  if (it == u.live.end()) return kInvalidValue;
  UserObject* o = it->second.get();
  auto held = g->userRefs.held.find(o);
  if (held == g->userRefs.held.end() || held->second < count) return kInvalidValue;
  if ((held->second -= count) == 0) g->userRefs.held.erase(held);
  releaseLocked(o, count);
  return kSuccess;
}

// ---- test hooks

// memType is a CUmemorytype (1 host, 2 device); managed marks cudaMallocManaged memory.
__attribute__((visibility("default"))) void loomStandInAddRange(const void* p, size_t bytes,
                                                               unsigned memType, int managed,
                                                               int device) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto b = reinterpret_cast<uintptr_t>(p);
  state().ranges.push_back({b, b + bytes, memType, managed ? 1u : 0u, device});
}

// Device memory as the stand-in's stream workers reach it (the kernels module's stand-in).
__attribute__((visibility("default"))) void loomStandInReadDevice(void* dst, const void* src,
                                                                 size_t n) {
  readDevice(dst, reinterpret_cast<uintptr_t>(src), n);
}
__attribute__((visibility("default"))) void loomStandInWriteDevice(void* dst, const void* src,
                                                                  size_t n) {
  writeDevice(reinterpret_cast<uintptr_t>(dst), src, n);
}

// Where a host thread of the stand-in reaches the byte at p, as a kernel's thread reaches it
// on a GPU (the kernels module's stand-in runs its plan interpreter on host threads over
// device memory): in memfd-backed device memory, the same byte of the alias (the rest of
// the allocation follows it there); anywhere else that is no device range (host memory,
// pinned or not), p itself. nullptr for a null p, and for device ranges a test registered
// itself: only /proc/self/mem reaches those, one system call a copy, not by address.
__attribute__((visibility("default"))) void* loomStandInHostView(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (!addr) return nullptr;
  size_t span = 0;
  if (char* a = aliasOf(addr, 1, &span)) return a;
  std::lock_guard<std::mutex> lock(state().mu);
  Range r;
  if (findRangeLocked(addr, &r) && deviceLike(r)) return nullptr;
  return const_cast<void*>(p);
}

__attribute__((visibility("default"))) void loomStandInAddDeviceRange(const void* p,
                                                                     size_t bytes, int device) {
  loomStandInAddRange(p, bytes, 2, 0, device);
}

// Forgets the ranges tests registered; memory from cuMemAlloc / cuMemHostAlloc stays known.
__attribute__((visibility("default"))) void loomStandInClear() {
  std::lock_guard<std::mutex> lock(state().mu);
  state().ranges.clear();
}

// The device of the (process-wide) current context; -1: no current context.
__attribute__((visibility("default"))) void loomStandInSetCurrentDevice(int device) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().currentDevice = device;
}

// Sets the calling thread's own current device, as cuCtxSetCurrent would (-1: no context),
// or with -100 gives up its own so that it follows the process-wide one again; returns the
// previous setting in the same terms. For test aids that allocate on a device of their
// choosing while other threads (ranks) use theirs.
__attribute__((visibility("default"))) int loomStandInExchangeThreadDevice(int device) {
  return std::exchange(tlsDevice, device);
}

// What cuInit returns (0 = success); only useful before Loom's first call.
__attribute__((visibility("default"))) void loomStandInSetInitResult(int result) {
  state().initResult = result;
}

// What cuPointerGetAttributes returns; anything but 0 makes it fail.
__attribute__((visibility("default"))) void loomStandInSetQueryResult(int result) {
  state().queryResult = result;
}

__attribute__((visibility("default"))) long loomStandInQueryCount() {
  return state().queries.load();
}

// A paused stream starts no further operation until resumed; the one running finishes.
// stream: a CUstream, 0 / CU_STREAM_LEGACY, or CU_STREAM_PER_THREAD (the caller's);
// an unknown handle is ignored.
__attribute__((visibility("default"))) void loomStandInPauseStream(void* stream) {
  setPaused(stream, true);
}

__attribute__((visibility("default"))) void loomStandInResumeStream(void* stream) {
  setPaused(stream, false);
}

// Operations the stream has completed: copies, memsets, host functions, 32-bit waits and
// writes, and waits for recorded events. -1 for an unknown handle.
__attribute__((visibility("default"))) long loomStandInStreamOps(void* stream) {
  std::shared_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    if (resolveLocked(stream, &s, false) != kSuccess) return -1;
  }
  std::lock_guard<std::mutex> lock(s->mu);
  return static_cast<long>(s->completed);
}

// User objects whose destroy callback has not returned yet: created and not released by
// every owner, or released and waiting for (or in) the callback.
__attribute__((visibility("default"))) long loomStandInLiveUserObjects() {
  return userObjects().pending.load();
}

}  // extern "C"
