// An ordinary NCCL program, compiled against NVIDIA's nccl.h, that only uses host buffers:
// the parent forks nranks-1 children, then creates the unique id and hands it to each
// through a pipe, and every process is one rank of a float-sum all-reduce, out of place
// and then in place, checked element by element. (Forking after ncclGetUniqueId would copy
// the process while the root's thread may hold a lock, such as malloc's, that the child
// could then never take.) Built twice: linked with libloom, and linked with NVIDIA's
// libnccl.so but run with Loom's drop-in LD_PRELOADed (which must then be the
// implementation actually called: --expect-loom).
//
//   allreduce_prog [nranks=4] [--expect-loom] [--count N]
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nccl.h>

namespace {

constexpr unsigned kTimeoutSeconds = 120;  // a hung rank must not outlive the test run

float inputValue(int rank, size_t i) {
  return static_cast<float>(rank + 1 + static_cast<int>(i % 7));
}

// sum over r of (r+1 + i%7): small integers, exact in float whatever the reduction order.
float expectedSum(int nranks, size_t i) {
  return static_cast<float>(nranks * (nranks + 1) / 2 + nranks * static_cast<int>(i % 7));
}

#define CHECK_NCCL(call)                                                                    \
  do {                                                                                      \
    ncclResult_t rc_ = (call);                                                              \
    if (rc_ != ncclSuccess) {                                                               \
      std::printf("rank %d: %s failed: %s (%d): %s\n", rank, #call, ncclGetErrorString(rc_), \
                  static_cast<int>(rc_), ncclGetLastError(comm));                           \
      return false;                                                                         \
    }                                                                                       \
  } while (0)

// Returns false (after printing why) on the first mismatch.
bool verify(int rank, int nranks, const char* what, const std::vector<float>& buf) {
  for (size_t i = 0; i < buf.size(); ++i) {
    float want = expectedSum(nranks, i);
    if (buf[i] != want) {
      std::printf("rank %d: %s: element %zu is %g, expected %g\n", rank, what, i,
                  static_cast<double>(buf[i]), static_cast<double>(want));
      return false;
    }
  }
  return true;
}

bool runRank(int rank, int nranks, const ncclUniqueId& id, size_t count) {
  ncclComm_t comm = nullptr;
  CHECK_NCCL(ncclCommInitRank(&comm, nranks, id, rank));

  int n = -1, r = -1;
  CHECK_NCCL(ncclCommCount(comm, &n));
  CHECK_NCCL(ncclCommUserRank(comm, &r));
  if (n != nranks || r != rank) {
    std::printf("rank %d: communicator says rank %d of %d, expected %d of %d\n", rank, r, n,
                rank, nranks);
    ncclCommDestroy(comm);
    return false;
  }

  std::vector<float> send(count), recv(count, -1.0f);
  for (size_t i = 0; i < count; ++i) send[i] = inputValue(rank, i);
  cudaStream_t stream = 0;  // host buffers: no stream needed

  bool ok = true;
  CHECK_NCCL(ncclAllReduce(send.data(), recv.data(), count, ncclFloat, ncclSum, comm, stream));
  ok = verify(rank, nranks, "out-of-place", recv) && ok;
  for (size_t i = 0; i < count && ok; ++i) {
    if (send[i] != inputValue(rank, i)) {
      std::printf("rank %d: out-of-place all-reduce modified sendbuff at element %zu\n", rank, i);
      ok = false;
    }
  }

  std::vector<float> inplace = send;
  CHECK_NCCL(ncclAllReduce(inplace.data(), inplace.data(), count, ncclFloat, ncclSum, comm,
                           stream));
  ok = verify(rank, nranks, "in-place", inplace) && ok;

  CHECK_NCCL(ncclCommDestroy(comm));
  return ok;
}

// Reads exactly `size` bytes; false on end of file or error.
bool readAll(int fd, void* buf, size_t size) {
  char* p = static_cast<char*>(buf);
  while (size > 0) {
    ssize_t n = read(fd, p, size);
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int nranks = 4;
  size_t count = size_t{1} << 20;
  bool expectLoom = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--expect-loom") == 0) {
      expectLoom = true;
    } else if (std::strcmp(argv[i], "--count") == 0 && i + 1 < argc) {
      count = std::strtoull(argv[++i], nullptr, 10);
    } else {
      nranks = std::atoi(argv[i]);
    }
  }
  if (nranks < 1 || count == 0) {
    std::fprintf(stderr, "usage: %s [nranks>=1] [--expect-loom] [--count N>0]\n", argv[0]);
    return 2;
  }

  // The drop-in shares NCCL's soname, so only its own extension tells which one we got.
  void* loomVersion = dlsym(RTLD_DEFAULT, "loomGetVersionString");
  if (loomVersion) {
    std::printf("implementation: Loom %s\n", reinterpret_cast<const char* (*)()>(loomVersion)());
  } else {
    std::printf("implementation: not Loom\n");
  }
  if (expectLoom && !loomVersion) {
    std::printf("FAIL: --expect-loom, but the NCCL functions do not come from Loom\n");
    return 1;
  }
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess || version != NCCL_VERSION_CODE) {
    std::printf("FAIL: ncclGetVersion gave %d, header says %d\n", version, NCCL_VERSION_CODE);
    return 1;
  }

  std::fflush(stdout);  // or the children would print the parent's buffered output again

  std::vector<pid_t> children;
  std::vector<int> idPipes;  // the parent's write ends, one per child
  for (int rank = 1; rank < nranks; ++rank) {
    int p[2];
    pid_t pid = pipe(p) == 0 ? fork() : -1;
    if (pid < 0) {
      std::perror("pipe/fork");
      for (pid_t c : children) kill(c, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      alarm(kTimeoutSeconds);  // alarms are not inherited across fork
      // Only the parent may hold a write end, so a parent that fails reads as end of file.
      for (int fd : idPipes) close(fd);
      close(p[1]);
      ncclUniqueId id;
      bool ok = readAll(p[0], &id, sizeof id);
      if (!ok) std::printf("rank %d: no unique id from the parent\n", rank);
      ok = ok && runRank(rank, nranks, id, count);
      if (ok) std::printf("rank %d: OK\n", rank);
      std::fflush(stdout);
      _exit(ok ? 0 : 1);
    }
    close(p[0]);
    idPipes.push_back(p[1]);
    children.push_back(pid);
  }

  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc != ncclSuccess) {
    std::printf("FAIL: ncclGetUniqueId: %s: %s\n", ncclGetErrorString(rc),
                ncclGetLastError(nullptr));
    for (int fd : idPipes) close(fd);
    for (pid_t c : children) waitpid(c, nullptr, 0);
    return 1;
  }
  for (int fd : idPipes) {
    if (write(fd, &id, sizeof id) != static_cast<ssize_t>(sizeof id)) std::perror("write id");
    close(fd);
  }

  alarm(kTimeoutSeconds);
  bool ok = runRank(0, nranks, id, count);
  if (ok) std::printf("rank 0: OK\n");
  std::fflush(stdout);

  // If rank 0 failed, the others are likely stuck waiting for it: give them a few seconds
  // to report their own view, then stop them.
  if (!ok) {
    sleep(5);
    for (pid_t c : children) kill(c, SIGKILL);
  }
  int failed = ok ? 0 : 1;
  for (size_t i = 0; i < children.size(); ++i) {
    int status = 0;
    if (waitpid(children[i], &status, 0) < 0) {
      std::perror("waitpid");
      ++failed;
      continue;
    }
    int rank = static_cast<int>(i) + 1;
    if (WIFSIGNALED(status)) {
      std::printf("rank %d: killed by signal %d (%s)\n", rank, WTERMSIG(status),
                  strsignal(WTERMSIG(status)));
      ++failed;
    } else if (WEXITSTATUS(status) != 0) {
      ++failed;
    }
  }
  if (failed) {
    std::printf("FAIL: %d of %d ranks failed\n", failed, nranks);
    return 1;
  }
  std::printf("PASS: %d ranks, %zu floats, out-of-place and in-place all-reduce exact\n", nranks,
              count);
  return 0;
}
