// One rank of the multi-host suite, an ordinary NCCL program on host buffers. netns_suite.py
// starts it inside a network namespace with RANK, WORLD_SIZE and NCCL_COMM_ID=<address of
// namespace 0>:<port>; every rank derives the same unique id from NCCL_COMM_ID.
//
//   MH_MODE=check (default): every collective at several sizes (all-reduce up to 12 MiB),
//     each result compared element by element with the value it must have; prints
//     "mh_rank <r>: OK <n> checks".
//   MH_MODE=device: the same checks on device buffers, each call on a stream: memory of the
//     CUDA driver LOOM_CUDA_DRIVER_LIBRARY names (else libcuda.so.1; in CI Loom's stand-in
//     driver), device 0 current; copied in before each call and out after its stream.
//   MH_MODE=loop: all-reduces of 4 MiB, checked, until one fails; prints "mh_rank <r>:
//     iteration <k>" as it goes (the driver kills one rank) and, when a call fails,
//     "mh_rank <r>: ERROR <result> in <call>: <message>", then waits for stdin to close so
//     that its own exit cannot be what lets the others notice.
//
// Exit status: 0 all checks passed, 1 a wrong value, 3 a call failed, 2 bad usage.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include <nccl.h>

namespace {

int gRank = -1;
int gSize = 0;
ncclComm_t gComm = nullptr;
long gChecks = 0;

// MH_MODE=device: the driver's few calls this program makes, and the stream of every call.
struct Cuda {
  using Ptr = unsigned long long;
  int (*init)(unsigned);
  int (*deviceGet)(int*, int);
  int (*retain)(void**, int);
  int (*setCurrent)(void*);
  int (*alloc)(Ptr*, size_t);
  int (*free)(Ptr);
  int (*toDevice)(Ptr, const void*, size_t);
  int (*toHost)(void*, Ptr, size_t);
  int (*streamCreate)(void**, unsigned);
  int (*streamSync)(void*);
};
Cuda gCuda{};
bool gDevice = false;
cudaStream_t gStream = nullptr;

[[noreturn]] void cudaFailed(const char* what, int rc) {
  std::printf("mh_rank %d: ERROR CUDA %s returned %d\n", gRank, what, rc);
  std::fflush(stdout);
  std::exit(3);
}
void cudaCheck(int rc, const char* what) {
  if (rc != 0) cudaFailed(what, rc);
}

void openCuda() {
  const char* path = getenv("LOOM_CUDA_DRIVER_LIBRARY");
  void* h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    std::printf("mh_rank %d: ERROR no CUDA driver: %s\n", gRank, dlerror());
    std::exit(3);
  }
  auto bind = [h](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    if (!fn) cudaFailed(name, -1);
  };
  bind(gCuda.init, "cuInit");
  bind(gCuda.deviceGet, "cuDeviceGet");
  bind(gCuda.retain, "cuDevicePrimaryCtxRetain");
  bind(gCuda.setCurrent, "cuCtxSetCurrent");
  bind(gCuda.alloc, "cuMemAlloc_v2");
  bind(gCuda.free, "cuMemFree_v2");
  bind(gCuda.toDevice, "cuMemcpyHtoD_v2");
  bind(gCuda.toHost, "cuMemcpyDtoH_v2");
  bind(gCuda.streamCreate, "cuStreamCreate");
  bind(gCuda.streamSync, "cuStreamSynchronize");
  int dev = 0;
  void* ctx = nullptr;
  void* stream = nullptr;
  cudaCheck(gCuda.init(0), "cuInit");
  cudaCheck(gCuda.deviceGet(&dev, 0), "cuDeviceGet");
  cudaCheck(gCuda.retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  cudaCheck(gCuda.setCurrent(ctx), "cuCtxSetCurrent");
  cudaCheck(gCuda.streamCreate(&stream, 1 /* non-blocking */), "cuStreamCreate");
  gStream = static_cast<cudaStream_t>(stream);
  gDevice = true;
}

// A call's buffer: the host vector itself, or (MH_MODE=device) a device copy of it, copied
// back into the vector once the call's stream is done (when this goes).
template <typename T>
class On {
 public:
  explicit On(std::vector<T>& v) : v_(v) {
    if (!gDevice) return;
    cudaCheck(gCuda.alloc(&d_, std::max<size_t>(v.size(), 1) * sizeof(T)), "cuMemAlloc");
    if (!v.empty()) cudaCheck(gCuda.toDevice(d_, v.data(), v.size() * sizeof(T)), "cuMemcpyHtoD");
  }
  ~On() {
    if (!gDevice) return;
    cudaCheck(gCuda.streamSync(gStream), "cuStreamSynchronize");
    if (!v_.empty()) cudaCheck(gCuda.toHost(v_.data(), d_, v_.size() * sizeof(T)), "cuMemcpyDtoH");
    gCuda.free(d_);
  }
  On(const On&) = delete;
  On& operator=(const On&) = delete;
  T* p() const { return gDevice ? reinterpret_cast<T*>(d_) : v_.data(); }

 private:
  std::vector<T>& v_;
  Cuda::Ptr d_ = 0;
};

struct CallFailed {
  ncclResult_t rc;
  std::string call;
};

void call(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) throw CallFailed{rc, what};
}
#define NCCL(x) call((x), #x)

[[noreturn]] void wrong(const char* what, size_t count, size_t i, double got, double want) {
  std::printf("mh_rank %d: WRONG %s (count %zu): element %zu is %.17g, expected %.17g\n", gRank,
              what, count, i, got, want);
  std::fflush(stdout);
  std::exit(1);
}

// Each rank's input: small integers, so sums over six ranks are exact in every type used.
int64_t input(int rank, size_t i) { return static_cast<int64_t>((rank * 7 + i * 13) % 41) - 20; }

template <typename T>
std::vector<T> inputs(int rank, size_t count, size_t offset = 0) {
  std::vector<T> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<T>(input(rank, offset + i));
  return v;
}

template <typename T>
void expect(const char* what, const std::vector<T>& got, const std::function<T(size_t)>& want) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want(i)) wrong(what, got.size(), i, double(got[i]), double(want(i)));
  ++gChecks;
}

template <typename T>
T sumAt(size_t i) {
  T s = 0;
  for (int r = 0; r < gSize; ++r) s = static_cast<T>(s + static_cast<T>(input(r, i)));
  return s;
}

template <typename T>
ncclDataType_t typeOf();
template <> ncclDataType_t typeOf<float>() { return ncclFloat32; }
template <> ncclDataType_t typeOf<double>() { return ncclFloat64; }
template <> ncclDataType_t typeOf<int32_t>() { return ncclInt32; }
template <> ncclDataType_t typeOf<uint8_t>() { return ncclUint8; }

template <typename T>
void allReduceSum(size_t count, bool inPlace) {
  std::vector<T> in = inputs<T>(gRank, count), out(count, T(-1));
  {
    On<T> i(in), o(out);
    NCCL(ncclAllReduce(i.p(), inPlace ? i.p() : o.p(), count, typeOf<T>(), ncclSum, gComm, gStream));
  }
  expect<T>(inPlace ? "all-reduce sum in place" : "all-reduce sum", inPlace ? in : out,
            [](size_t i) { return sumAt<T>(i); });
}

void allReduceMinMax(size_t count) {
  for (ncclRedOp_t op : {ncclMax, ncclMin}) {
    std::vector<int32_t> in = inputs<int32_t>(gRank, count), out(count, -1);
    {
      On<int32_t> i(in), o(out);
      NCCL(ncclAllReduce(i.p(), o.p(), count, ncclInt32, op, gComm, gStream));
    }
    expect<int32_t>(op == ncclMax ? "all-reduce max" : "all-reduce min", out, [&](size_t i) {
      int32_t m = static_cast<int32_t>(input(0, i));
      for (int r = 1; r < gSize; ++r) {
        int32_t v = static_cast<int32_t>(input(r, i));
        m = op == ncclMax ? std::max(m, v) : std::min(m, v);
      }
      return m;
    });
  }
}

void allGather(size_t per) {
  std::vector<int32_t> mine(per), all(per * gSize, -1);
  for (size_t i = 0; i < per; ++i) mine[i] = gRank * 1000003 + static_cast<int32_t>(i);
  {
    On<int32_t> m(mine), a(all);
    NCCL(ncclAllGather(m.p(), a.p(), per, ncclInt32, gComm, gStream));
  }
  expect<int32_t>("all-gather", all, [&](size_t i) {
    return static_cast<int32_t>((i / per) * 1000003 + i % per);
  });
}

void reduceScatter(size_t per) {
  std::vector<float> in = inputs<float>(gRank, per * gSize), out(per, -1);
  {
    On<float> i(in), o(out);
    NCCL(ncclReduceScatter(i.p(), o.p(), per, ncclFloat32, ncclSum, gComm, gStream));
  }
  expect<float>("reduce-scatter", out, [&](size_t i) { return sumAt<float>(gRank * per + i); });
}

void broadcast(size_t count) {
  for (int root = 0; root < gSize; ++root) {
    std::vector<int32_t> buf(count, -1);
    if (gRank == root)
      for (size_t i = 0; i < count; ++i) buf[i] = root * 7919 + static_cast<int32_t>(i);
    {
      On<int32_t> b(buf);
      NCCL(ncclBroadcast(b.p(), b.p(), count, ncclInt32, root, gComm, gStream));
    }
    expect<int32_t>("broadcast", buf,
                    [&](size_t i) { return root * 7919 + static_cast<int32_t>(i); });
  }
}

void reduce(size_t count) {
  for (int root = 0; root < gSize; ++root) {
    std::vector<float> in = inputs<float>(gRank, count), out(count, -1);
    {
      On<float> i(in), o(out);
      NCCL(ncclReduce(i.p(), o.p(), count, ncclFloat32, ncclSum, root, gComm, gStream));
    }
    if (gRank == root) expect<float>("reduce", out, [](size_t i) { return sumAt<float>(i); });
  }
}

// Block j of rank r's send buffer is meant for rank j: value r*100000 + j*1000 + i.
void allToAllGatherScatter(size_t per) {
  auto cell = [](int from, int to, size_t i) { return from * 100000 + to * 1000 + int32_t(i % 1000); };
  std::vector<int32_t> send(per * gSize), recv(per * gSize, -1);
  for (int j = 0; j < gSize; ++j)
    for (size_t i = 0; i < per; ++i) send[j * per + i] = cell(gRank, j, i);
  {
    On<int32_t> s(send), r(recv);
    NCCL(ncclAlltoAll(s.p(), r.p(), per, ncclInt32, gComm, gStream));
  }
  expect<int32_t>("all-to-all", recv, [&](size_t k) { return cell(int(k / per), gRank, k % per); });

  int root = gSize - 1;
  std::vector<int32_t> mine(send.begin() + root * per, send.begin() + (root + 1) * per);
  std::fill(recv.begin(), recv.end(), -1);
  {
    On<int32_t> m(mine), r(recv);
    NCCL(ncclGather(m.p(), r.p(), per, ncclInt32, root, gComm, gStream));
  }
  if (gRank == root)
    expect<int32_t>("gather", recv, [&](size_t k) { return cell(int(k / per), root, k % per); });

  std::vector<int32_t> part(per, -1);
  {
    On<int32_t> s(send), p(part);
    NCCL(ncclScatter(s.p(), p.p(), per, ncclInt32, root, gComm, gStream));
  }
  expect<int32_t>("scatter", part, [&](size_t i) { return cell(root, gRank, i); });
}

void sendRecvRing(size_t count) {
  int next = (gRank + 1) % gSize, prev = (gRank + gSize - 1) % gSize;
  std::vector<int32_t> mine = inputs<int32_t>(gRank, count), got(count, -1);
  {
    On<int32_t> m(mine), g(got);
    NCCL(ncclGroupStart());
    NCCL(ncclSend(m.p(), count, ncclInt32, next, gComm, gStream));
    NCCL(ncclRecv(g.p(), count, ncclInt32, prev, gComm, gStream));
    NCCL(ncclGroupEnd());
  }
  expect<int32_t>("send/recv", got, [&](size_t i) { return static_cast<int32_t>(input(prev, i)); });
}

void checkAll() {
  const size_t kMiB = 1 << 20;
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{65537}, kMiB / 4 + 3, 3 * kMiB})
    allReduceSum<float>(count, false);  // up to 12 MiB: several FIFO-sized ring slices
  allReduceSum<float>(kMiB + 1, true);
  allReduceSum<int32_t>(262147, false);
  allReduceSum<double>(kMiB + 5, false);  // 8 MiB + 40 bytes
  allReduceSum<uint8_t>(1000003, false);  // wraps mod 256: exact all the same
  allReduceMinMax(100003);
  for (size_t per : {size_t{1}, size_t{4099}, kMiB}) allGather(per);
  for (size_t per : {size_t{1}, size_t{5001}, kMiB / 2}) reduceScatter(per);
  for (size_t count : {size_t{3}, 2 * kMiB + 1}) broadcast(count);  // 8 MiB from every root
  for (size_t count : {size_t{1001}, kMiB / 2}) reduce(count);
  allToAllGatherScatter(4097);
  sendRecvRing(300007);
}

void loopUntilFailure() {
  const size_t count = 1 << 20;
  std::vector<float> in = inputs<float>(gRank, count), out(count);
  for (long k = 0;; ++k) {
    NCCL(ncclAllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, gComm, nullptr));
    expect<float>("all-reduce sum (loop)", out, [](size_t i) { return sumAt<float>(i); });
    std::printf("mh_rank %d: iteration %ld\n", gRank, k);
    std::fflush(stdout);
  }
}

int envInt(const char* name) {
  const char* v = getenv(name);
  char* end = nullptr;
  long x = v ? strtol(v, &end, 10) : -1;
  if (!v || *end || x < 0) {
    std::printf("mh_rank: %s='%s' is not a non-negative integer\n", name, v ? v : "(unset)");
    std::exit(2);
  }
  return static_cast<int>(x);
}

}  // namespace

int main() {
  gRank = envInt("RANK");
  gSize = envInt("WORLD_SIZE");
  const char* mode = getenv("MH_MODE") ? getenv("MH_MODE") : "check";
  if (!getenv("NCCL_COMM_ID") || gRank >= gSize ||
      (strcmp(mode, "check") && strcmp(mode, "loop") && strcmp(mode, "device"))) {
    std::printf("mh_rank: needs NCCL_COMM_ID, RANK < WORLD_SIZE and MH_MODE check|device|loop\n");
    return 2;
  }
  if (strcmp(mode, "device") == 0) openCuda();  // before init: the communicator's device
  struct stat ns {};
  stat("/proc/self/ns/net", &ns);
  std::printf("mh_rank %d: pid %d netns %llu\n", gRank, static_cast<int>(getpid()),
              static_cast<unsigned long long>(ns.st_ino));
  std::fflush(stdout);
  try {
    ncclUniqueId id;
    NCCL(ncclGetUniqueId(&id));  // derived from NCCL_COMM_ID: the same on every rank
    NCCL(ncclCommInitRank(&gComm, gSize, id, gRank));
    if (strcmp(mode, "loop") == 0) loopUntilFailure();
    checkAll();
    NCCL(ncclCommDestroy(gComm));
  } catch (const CallFailed& f) {
    std::printf("mh_rank %d: ERROR %s in %s: %s\n", gRank, ncclGetErrorString(f.rc),
                f.call.c_str(), gComm ? ncclGetLastError(gComm) : ncclGetLastError(nullptr));
    std::fflush(stdout);
    if (strcmp(mode, "loop") == 0) {
      char c;
      while (read(0, &c, 1) > 0) {}
    }
    return 3;
  }
  std::printf("mh_rank %d: OK %ld checks\n", gRank, gChecks);
  return 0;
}
