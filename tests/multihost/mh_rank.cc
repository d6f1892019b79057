// One rank of the multi-host suite, an ordinary NCCL program on host buffers. netns_suite.py
// starts it inside a network namespace with RANK, WORLD_SIZE and NCCL_COMM_ID=<address of
// namespace 0>:<port>; every rank derives the same unique id from NCCL_COMM_ID.
//
//   MH_MODE=check (default): every collective at several sizes (all-reduce up to 12 MiB),
//     each result compared element by element with the value it must have; prints
//     "mh_rank <r>: OK <n> checks".
//   MH_MODE=loop: all-reduces of 4 MiB, checked, until one fails; prints "mh_rank <r>:
//     iteration <k>" as it goes (the driver kills one rank) and, when a call fails,
//     "mh_rank <r>: ERROR <result> in <call>: <message>", then waits for stdin to close so
//     that its own exit cannot be what lets the others notice.
//
// Exit status: 0 all checks passed, 1 a wrong value, 3 a call failed, 2 bad usage.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <nccl.h>

namespace {

int gRank = -1;
int gSize = 0;
ncclComm_t gComm = nullptr;
long gChecks = 0;

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
  T* dst = inPlace ? in.data() : out.data();
  NCCL(ncclAllReduce(in.data(), dst, count, typeOf<T>(), ncclSum, gComm, nullptr));
  expect<T>(inPlace ? "all-reduce sum in place" : "all-reduce sum", inPlace ? in : out,
            [](size_t i) { return sumAt<T>(i); });
}

void allReduceMinMax(size_t count) {
  for (ncclRedOp_t op : {ncclMax, ncclMin}) {
    std::vector<int32_t> in = inputs<int32_t>(gRank, count), out(count, -1);
    NCCL(ncclAllReduce(in.data(), out.data(), count, ncclInt32, op, gComm, nullptr));
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
  NCCL(ncclAllGather(mine.data(), all.data(), per, ncclInt32, gComm, nullptr));
  expect<int32_t>("all-gather", all, [&](size_t i) {
    return static_cast<int32_t>((i / per) * 1000003 + i % per);
  });
}

void reduceScatter(size_t per) {
  std::vector<float> in = inputs<float>(gRank, per * gSize), out(per, -1);
  NCCL(ncclReduceScatter(in.data(), out.data(), per, ncclFloat32, ncclSum, gComm, nullptr));
  expect<float>("reduce-scatter", out, [&](size_t i) { return sumAt<float>(gRank * per + i); });
}

void broadcast(size_t count) {
  for (int root = 0; root < gSize; ++root) {
    std::vector<int32_t> buf(count, -1);
    if (gRank == root)
      for (size_t i = 0; i < count; ++i) buf[i] = root * 7919 + static_cast<int32_t>(i);
    NCCL(ncclBroadcast(buf.data(), buf.data(), count, ncclInt32, root, gComm, nullptr));
    expect<int32_t>("broadcast", buf,
                    [&](size_t i) { return root * 7919 + static_cast<int32_t>(i); });
  }
}

void reduce(size_t count) {
  for (int root = 0; root < gSize; ++root) {
    std::vector<float> in = inputs<float>(gRank, count), out(count, -1);
    NCCL(ncclReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, root, gComm, nullptr));
    if (gRank == root) expect<float>("reduce", out, [](size_t i) { return sumAt<float>(i); });
  }
}

// Block j of rank r's send buffer is meant for rank j: value r*100000 + j*1000 + i.
void allToAllGatherScatter(size_t per) {
  auto cell = [](int from, int to, size_t i) { return from * 100000 + to * 1000 + int32_t(i % 1000); };
  std::vector<int32_t> send(per * gSize), recv(per * gSize, -1);
  for (int j = 0; j < gSize; ++j)
    for (size_t i = 0; i < per; ++i) send[j * per + i] = cell(gRank, j, i);
  NCCL(ncclAlltoAll(send.data(), recv.data(), per, ncclInt32, gComm, nullptr));
  expect<int32_t>("all-to-all", recv, [&](size_t k) { return cell(int(k / per), gRank, k % per); });

  int root = gSize - 1;
  std::vector<int32_t> mine(send.begin() + root * per, send.begin() + (root + 1) * per);
  std::fill(recv.begin(), recv.end(), -1);
  NCCL(ncclGather(mine.data(), recv.data(), per, ncclInt32, root, gComm, nullptr));
  if (gRank == root)
    expect<int32_t>("gather", recv, [&](size_t k) { return cell(int(k / per), root, k % per); });

  std::vector<int32_t> part(per, -1);
  NCCL(ncclScatter(send.data(), part.data(), per, ncclInt32, root, gComm, nullptr));
  expect<int32_t>("scatter", part, [&](size_t i) { return cell(root, gRank, i); });
}

void sendRecvRing(size_t count) {
  int next = (gRank + 1) % gSize, prev = (gRank + gSize - 1) % gSize;
  std::vector<int32_t> mine = inputs<int32_t>(gRank, count), got(count, -1);
  NCCL(ncclGroupStart());
  NCCL(ncclSend(mine.data(), count, ncclInt32, next, gComm, nullptr));
  NCCL(ncclRecv(got.data(), count, ncclInt32, prev, gComm, nullptr));
  NCCL(ncclGroupEnd());
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
  if (!getenv("NCCL_COMM_ID") || gRank >= gSize || (strcmp(mode, "check") && strcmp(mode, "loop"))) {
    std::printf("mh_rank: needs NCCL_COMM_ID, RANK < WORLD_SIZE and MH_MODE check|loop\n");
    return 2;
  }
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
