// Host identity across Linux namespaces (docs/multihost.md): a process in another network
// or pid namespace is another host, processes sharing them are one host, and LOOM_HOSTID
// wins over both. Each case forks a child that moves into fresh namespaces (needs root, as
// the netns suite does) and reports what hostIdString()/hostHash() say there.
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <string>

#include "base/host.h"
#include "base/scoped_env.h"

namespace loom {
namespace {

struct Seen {
  std::string error;  // why the child could not get where it was sent
  std::string id;
  uint64_t hash = 0;
  unsigned long long netns = 0;
};

unsigned long long inodeOf(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_ino : 0;
}

Seen failed(const std::string& why) {
  Seen s;
  s.error = why;
  return s;
}

Seen here() { return {"", hostIdString(), hostHash(), inodeOf("/proc/self/ns/net")}; }

// Runs `place` in a forked child (it returns "" or what failed), then reports what the
// child sees. `place` may fork again: whichever process returns from it reports.
Seen seenFrom(const std::function<std::string()>& place) {
  int fds[2];
  if (pipe(fds) != 0) return failed("pipe failed");
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string err = place();
    Seen s = here();
    std::string line = err.empty() ? "ok\n" + s.id + "\n" + std::to_string(s.hash) + "\n" +
                                         std::to_string(s.netns) + "\n"
                                   : "error\n" + err + "\n";
    ssize_t n = write(fds[1], line.data(), line.size());
    _exit(n == static_cast<ssize_t>(line.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string text;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) text.append(buf, n);
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  std::vector<std::string> lines;
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
    lines.push_back(text.substr(at, nl - at));
  if (lines.size() == 2 && lines[0] == "error") return failed(lines[1]);
  if (lines.size() != 4 || lines[0] != "ok") return failed("child reported '" + text + "'");
  return {"", lines[1], std::stoull(lines[2]), std::stoull(lines[3])};
}

std::string unshareNs(int flags) {
  if (unshare(flags) != 0) return std::string("unshare: ") + strerror(errno);
  return "";
}

// A fresh pid namespace holds only the children forked after unshare(); the first becomes
// its pid 1 and is the one that reports.
std::string intoNewPidNamespace() {
  if (unshare(CLONE_NEWPID) != 0) return std::string("unshare(CLONE_NEWPID): ") + strerror(errno);
  pid_t pid = fork();
  if (pid < 0) return std::string("fork: ") + strerror(errno);
  if (pid > 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    _exit(0);
  }
  return "";
}

// Namespaces need root (CAP_SYS_ADMIN). CI runs as root: there, not being able to create
// one is a failure; LOOM_SKIP_NETNS=1 is the explicit way out elsewhere.
class HostIdentity : public testing::Test {
 protected:
  void SetUp() override {
    const char* skip = getenv("LOOM_SKIP_NETNS");
    if (skip && strcmp(skip, "1") == 0) GTEST_SKIP() << "LOOM_SKIP_NETNS=1: namespace tests skipped";
    Seen probe = seenFrom([] { return unshareNs(CLONE_NEWNET); });
    ASSERT_EQ(probe.error, "")
        << "cannot create a network namespace (" << probe.error
        << "): run as root, or set LOOM_SKIP_NETNS=1 to skip";
  }
  test::ScopedEnv noHostId_{"LOOM_HOSTID", nullptr};
};

TEST_F(HostIdentity, OtherNetworkNamespaceIsOtherHost) {
  Seen parent = here();
  Seen child = seenFrom([] { return unshareNs(CLONE_NEWNET); });
  ASSERT_EQ(child.error, "");
  EXPECT_NE(child.netns, parent.netns);
  EXPECT_NE(child.hash, parent.hash) << child.id << " vs " << parent.id;
  // Same machine otherwise: the id is the parent's plus the namespace, so it says why.
  std::string base = hostName() + ":";
  EXPECT_EQ(child.id.rfind(base, 0), 0u) << child.id;
  EXPECT_NE(child.id.find("/netns:" + std::to_string(child.netns)), std::string::npos) << child.id;
  EXPECT_EQ(parent.id.find("/netns:" + std::to_string(child.netns)), std::string::npos);
}

TEST_F(HostIdentity, OneNamespaceIsOneHost) {
  // Two processes in one fresh namespace (as two ranks under one `ip netns exec` name).
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  Seen first = seenFrom([&] {
    std::string err = unshareNs(CLONE_NEWNET);
    if (!err.empty()) return err;
    pid_t pid = fork();  // the second process inherits the namespace
    if (pid == 0) {
      std::string line = hostIdString() + "\n" + std::to_string(hostHash()) + "\n";
      _exit(write(fds[1], line.data(), line.size()) > 0 ? 0 : 1);
    }
    waitpid(pid, nullptr, 0);
    return std::string();
  });
  close(fds[1]);
  char buf[512] = {0};
  ssize_t n = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  ASSERT_EQ(first.error, "");
  ASSERT_GT(n, 0);
  std::string second(buf);
  EXPECT_EQ(second, first.id + "\n" + std::to_string(first.hash) + "\n");
}

TEST_F(HostIdentity, BackInTheNamespaceIsTheSameHostAgain) {
  // The identity follows the namespace, not the process: leave and come back.
  Seen parent = here();
  Seen back = seenFrom([] {
    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home < 0) return std::string("open /proc/self/ns/net: ") + strerror(errno);
    std::string err = unshareNs(CLONE_NEWNET);
    if (err.empty() && setns(home, CLONE_NEWNET) != 0) err = std::string("setns: ") + strerror(errno);
    close(home);
    return err;
  });
  ASSERT_EQ(back.error, "");
  EXPECT_EQ(back.netns, parent.netns);
  EXPECT_EQ(back.id, parent.id);
  EXPECT_EQ(back.hash, parent.hash);
}

TEST_F(HostIdentity, OtherPidNamespaceIsOtherHost) {
  // Pids are how the shm transport finds its peer (pidfd, cross-memory reads); across pid
  // namespaces they name other processes, so such ranks must not share memory.
  Seen parent = here();
  Seen child = seenFrom(intoNewPidNamespace);
  ASSERT_EQ(child.error, "");
  EXPECT_NE(child.hash, parent.hash);
  EXPECT_NE(child.id.find("/pidns:"), std::string::npos) << child.id;
  EXPECT_EQ(child.netns, parent.netns);
}

TEST_F(HostIdentity, HostIdWinsOverNamespaces) {
  test::ScopedEnv id("LOOM_HOSTID", "rack1-node7");
  Seen parent = here();
  Seen net = seenFrom([] { return unshareNs(CLONE_NEWNET); });
  Seen pid = seenFrom(intoNewPidNamespace);
  ASSERT_EQ(net.error, "");
  ASSERT_EQ(pid.error, "");
  EXPECT_EQ(parent.id, "rack1-node7");
  for (const Seen& s : {net, pid}) {
    EXPECT_EQ(s.id, "rack1-node7");
    EXPECT_EQ(s.hash, parent.hash);
  }
  test::ScopedEnv other("LOOM_HOSTID", "rack1-node8");
  EXPECT_NE(hostHash(), parent.hash);
}

TEST(HostIdentityHere, InitialNamespacesAreLeftOutOfTheId) {
  // The machine's own namespaces add nothing, so an ordinary host keeps the short id
  // "<hostname>:<boot id>". The kernel marks initial namespaces with fixed inodes.
  bool initialNet = inodeOf("/proc/self/ns/net") == 0xEFFFFFF9u;
  bool initialPid = inodeOf("/proc/self/ns/pid") == 0xEFFFFFFCu;
  if (!initialNet || !initialPid) GTEST_SKIP() << "this test does not run in the initial namespaces";
  test::ScopedEnv noHostId("LOOM_HOSTID", nullptr);
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(f, boot);
  EXPECT_EQ(hostIdString(), hostName() + ":" + boot);
}

}  // namespace
}  // namespace loom
