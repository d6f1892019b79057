// The stock NCCL loader against the real stock library of this machine (the CUDA toolkit's
// libnccl.so.2) and against Loom's own builds, which it must refuse.
#include "dispatch/stock_nccl.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using loom::dispatch::findStockNccl;
using loom::dispatch::StockNccl;
using loom::dispatch::stockNcclCandidates;

struct EnvVar {
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) {
      had_ = true;
      old_ = old;
    }
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~EnvVar() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }
  const char* name_;
  bool had_ = false;
  std::string old_;
};

std::string realPath(const char* p) {
  char* r = realpath(p, nullptr);
  std::string s = r ? r : "";
  free(r);
  return s;
}

// The stock library found with no knob set, or a skip saying why there is none.
#define NEED_STOCK(lib)                                                                   \
  if (!loom::dispatch::stockNcclSupportedInThisBuild())                                   \
    GTEST_SKIP() << "sanitizer build: stock NCCL is not opened (RTLD_DEEPBIND)";          \
  std::string tried_;                                                                     \
  std::unique_ptr<StockNccl> lib = findStockNccl(&tried_);                                \
  if (!lib) GTEST_SKIP() << "no stock libnccl.so.2 on this machine: " << tried_

TEST(StockNccl, FoundByAbsolutePathAndBoundInsideIt) {
  EnvVar knob("LOOM_NCCL_LIBRARY", nullptr);
  NEED_STOCK(lib);
  ASSERT_EQ(lib->path()[0], '/');
  bool listed = false;
  for (const std::string& c : stockNcclCandidates()) {
    EXPECT_EQ(c[0], '/') << c;
    listed |= c == lib->path();
  }
  EXPECT_TRUE(listed) << lib->path();
  // The entry points bound live in that file, not in Loom (this test links Loom, so the
  // process's first ncclAllReduce is Loom's).
  for (void* fn : {reinterpret_cast<void*>(lib->api().allReduce),
                   reinterpret_cast<void*>(lib->api().commInitRank),
                   reinterpret_cast<void*>(lib->api().groupEnd)}) {
    Dl_info info{};
    ASSERT_NE(dladdr(fn, &info), 0);
    EXPECT_EQ(realPath(info.dli_fname), lib->path());
  }
  EXPECT_NE(reinterpret_cast<void*>(lib->api().allReduce), reinterpret_cast<void*>(&ncclAllReduce));
  int version = 0;
  ASSERT_EQ(lib->api().getVersion(&version), ncclSuccess);
  EXPECT_EQ(version, lib->version());
  EXPECT_GE(version, 20000);  // NCCL 2.x codes are major * 10000 + minor * 100 + patch
  EXPECT_STREQ(lib->api().getErrorString(ncclInvalidArgument), "invalid argument (run with NCCL_DEBUG=WARN for details)");
}

// Loom's builds are refused however they are named: the drop-in libnccl.so.2, libloom.so,
// and the file this process runs Loom from.
TEST(StockNccl, RefusesLoomItself) {
  Dl_info self{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&ncclAllReduce), &self), 0);
  const std::string cases[] = {realPath(LOOM_DROP_IN_PATH), realPath(LOOM_SHARED_PATH),
                               realPath(self.dli_fname)};
  for (const std::string& path : cases) {
    ASSERT_FALSE(path.empty());
    std::string why;
    EXPECT_EQ(StockNccl::open(path, &why), nullptr) << path;
    if (loom::dispatch::stockNcclSupportedInThisBuild() || path == cases[2]) {
      EXPECT_NE(why.find("Loom"), std::string::npos) << why;
    }
    EnvVar knob("LOOM_NCCL_LIBRARY", path.c_str());
    std::string tried;
    EXPECT_EQ(findStockNccl(&tried), nullptr) << path;
    EXPECT_NE(tried.find(path), std::string::npos) << tried;
  }
}

// With Loom's drop-in first on the library path, as a job using it would run, the search
// still ends at the stock library.
TEST(StockNccl, SkipsTheDropInOnTheLibraryPath) {
  EnvVar knob("LOOM_NCCL_LIBRARY", nullptr);
  const std::string dropIn = realPath(LOOM_DROP_IN_PATH);
  const std::string dir = dropIn.substr(0, dropIn.rfind('/'));
  EnvVar path("LD_LIBRARY_PATH", dir.c_str());
  const auto candidates = stockNcclCandidates();
  ASSERT_FALSE(candidates.empty());
  EXPECT_EQ(candidates[0], dropIn);
  NEED_STOCK(lib);
  EXPECT_NE(lib->path(), dropIn);
}

TEST(StockNccl, MissingOrRelativePathsAreRefusedWithReasons) {
  std::string why;
  EXPECT_EQ(StockNccl::open("libnccl.so.2", &why), nullptr);
  EXPECT_NE(why.find("not an absolute path"), std::string::npos) << why;
  EXPECT_EQ(StockNccl::open("/nonexistent/libnccl.so.2", &why), nullptr);
  EXPECT_NE(why.find("no such file"), std::string::npos) << why;
  EXPECT_EQ(StockNccl::open("/etc/hostname", &why), nullptr);  // a file, not a library
  EXPECT_NE(why.find("/etc/hostname"), std::string::npos) << why;
  EnvVar knob("LOOM_NCCL_LIBRARY", "/nonexistent/libnccl.so.2");
  std::string tried;
  EXPECT_EQ(findStockNccl(&tried), nullptr);
  EXPECT_NE(tried.find("LOOM_NCCL_LIBRARY=/nonexistent/libnccl.so.2"), std::string::npos) << tried;
}

// Stock NCCL on a machine without a GPU: its calls fail with an error code and a message,
// and nothing hangs (a child process, bounded by an alarm).
TEST(StockNccl, StockLibraryReportsNoGpuCleanly) {
  EnvVar knob("LOOM_NCCL_LIBRARY", nullptr);
  NEED_STOCK(lib);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(60);
    close(fds[0]);
    const loom::dispatch::StockApi& api = lib->api();
    ncclUniqueId id;
    ncclResult_t r = api.getUniqueId(&id);
    ncclComm_t comm = nullptr;
    if (r == ncclSuccess) r = api.commInitRank(&comm, 1, id, 0);
    std::string report = std::to_string(static_cast<int>(r)) + "\n" + api.getErrorString(r) +
                         "\n" + (api.getLastError(nullptr) ? api.getLastError(nullptr) : "");
    if (r == ncclSuccess && comm) api.commDestroy(comm);
    (void)!write(fds[1], report.data(), report.size());
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died (signal " << WTERMSIG(status) << "): " << out;
  const int code = atoi(out.c_str());
  if (code == ncclSuccess) GTEST_SKIP() << "stock NCCL initialised: this machine has a GPU";
  EXPECT_NE(out.find('\n'), std::string::npos);
  EXPECT_GT(out.size(), out.find('\n') + 2) << "no error string: " << out;
  RecordProperty("stock_nccl_no_gpu", out);
  std::printf("stock NCCL without a GPU: code %s\n", out.c_str());
}

}  // namespace
