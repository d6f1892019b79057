#include "base/shm.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <string>

#include "base/error.h"

namespace loom {
namespace {

// "/loom-<tag>-" followed by exactly 32 lowercase hex digits (128 bits).
// "/loom-<pid namespace>-<pid>-<tag>-<32 hex digits>"
bool wellFormed(const std::string& name, const std::string& tag) {
  std::string pidPart = "-" + std::to_string(getpid()) + "-" + tag + "-";
  size_t at = name.find(pidPart);
  if (name.rfind("/loom-", 0) != 0 || at == std::string::npos) return false;
  size_t start = at + pidPart.size();
  if (name.size() != start + 32) return false;
  for (size_t i = start; i < name.size(); ++i)
    if (!isdigit(static_cast<unsigned char>(name[i])) && (name[i] < 'a' || name[i] > 'f'))
      return false;
  return true;
}

bool exists(const std::string& name) {
  struct stat st;
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

TEST(ShmSegment, CreateWriteReadFromForkedChild) {
  ShmSegment seg = ShmSegment::create("test", 1 << 20);
  ASSERT_TRUE(seg.valid());
  ASSERT_EQ(seg.size(), 1u << 20);
  auto* p = static_cast<uint32_t*>(seg.data());
  for (size_t i = 0; i < seg.size() / 4; ++i) ASSERT_EQ(p[i], 0u) << "not zero-filled at " << i;
  for (size_t i = 0; i < seg.size() / 4; ++i) p[i] = static_cast<uint32_t>(i * 2654435761u);

  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: no gtest assertions here; report through the exit status and the segment.
    int rc = 0;
    try {
      ShmSegment peer = ShmSegment::open(seg.name(), 1 << 20);
      auto* q = static_cast<uint32_t*>(peer.data());
      for (size_t i = 0; i < peer.size() / 4; ++i)
        if (q[i] != static_cast<uint32_t>(i * 2654435761u)) rc = 2;
      q[0] = 0xdeadbeef;  // visible to the parent only if the mapping is really shared
    } catch (...) {
      rc = 3;
    }
    _exit(rc);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(p[0], 0xdeadbeefu);
  EXPECT_TRUE(exists(seg.name())) << "a non-owner must not unlink on destruction";
}

TEST(ShmSegment, ModeIs0600WhateverTheUmask) {
  mode_t old = umask(0277);  // would leave 0400 without the explicit fchmod
  ShmSegment seg = ShmSegment::create("test", 4096);
  umask(old);
  struct stat st;
  ASSERT_EQ(stat(("/dev/shm" + seg.name()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, getuid());
}

TEST(ShmSegment, NameCarries128RandomBits) {
  ShmSegment a = ShmSegment::create("tagx", 64);
  ShmSegment b = ShmSegment::create("tagx", 64);
  EXPECT_TRUE(wellFormed(a.name(), "tagx")) << a.name();
  EXPECT_TRUE(wellFormed(b.name(), "tagx")) << b.name();
  EXPECT_NE(a.name(), b.name());
}

TEST(ShmSegment, SweepRemovesNamesOfDeadProcessesOnly) {
  ShmSegment mine = ShmSegment::create("sweep", 4096);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  if (child == 0) {
    // Create a name and die without unlinking it, as a SIGKILLed rank would.
    ShmSegment s = ShmSegment::create("sweep", 4096);
    std::string n = s.name();
    if (write(fds[1], n.data(), n.size()) < 0) {}
    _exit(0);  // no destructors run
  }
  close(fds[1]);
  char buf[256];
  ssize_t len = read(fds[0], buf, sizeof(buf));
  close(fds[0]);
  waitpid(child, nullptr, 0);
  ASSERT_GT(len, 0);
  std::string orphan(buf, static_cast<size_t>(len));
  EXPECT_TRUE(processGone(child));
  EXPECT_FALSE(processGone(getpid()));
  // Concurrent tests' communicators sweep at init too, so the orphan may be gone already
  // and the count may be 0 here: what must hold is that it is gone after a sweep.
  ShmSegment::sweepDead();
  EXPECT_FALSE(exists(orphan));
  EXPECT_TRUE(exists(mine.name()));  // a live process's name stays
}

// A killed process that its parent has not reaped yet (a zombie) still owns its pid, but
// its peers see it gone well before the reaping: its names must be swept all the same.
TEST(ShmSegment, SweepRemovesNamesOfUnreapedDeadProcesses) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  if (child == 0) {
    ShmSegment s = ShmSegment::create("zombie", 4096);
    std::string n = s.name();
    if (write(fds[1], n.data(), n.size()) < 0) {}
    raise(SIGKILL);
  }
  close(fds[1]);
  char buf[256];
  ssize_t len = read(fds[0], buf, sizeof(buf));
  close(fds[0]);
  ASSERT_GT(len, 0);
  std::string orphan(buf, static_cast<size_t>(len));
  siginfo_t info{};
  // Wait for the death without reaping: the child stays a zombie.
  ASSERT_EQ(waitid(P_PID, child, &info, WEXITED | WNOWAIT), 0);
  EXPECT_EQ(kill(child, 0), 0) << "the zombie's pid must still be taken";
  EXPECT_TRUE(processGone(child)) << "a zombie counts as gone";
  ShmSegment::sweepDead();  // (a concurrent test's sweep may have removed it first)
  EXPECT_FALSE(exists(orphan));
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(processGone(child));
}

TEST(ShmSegment, UnlinkRemovesNameMappingStaysUsable) {
  ShmSegment seg = ShmSegment::create("test", 8192);
  std::string name = seg.name();
  ASSERT_TRUE(exists(name));
  seg.unlink();
  EXPECT_FALSE(exists(name));
  seg.unlink();  // idempotent
  EXPECT_TRUE(seg.valid());
  memset(seg.data(), 0x5a, seg.size());
  EXPECT_EQ(static_cast<unsigned char*>(seg.data())[8191], 0x5a);
  EXPECT_THROW(ShmSegment::open(name, 8192), Error);
}

TEST(ShmSegment, OwnerDestructorRemovesName) {
  std::string name;
  {
    ShmSegment seg = ShmSegment::create("test", 4096);
    name = seg.name();
    {
      ShmSegment peer = ShmSegment::open(name, 4096);
      EXPECT_FALSE(peer.name().empty());
    }
    EXPECT_TRUE(exists(name)) << "peer's destructor removed the owner's segment";
  }
  EXPECT_FALSE(exists(name));
}

TEST(ShmSegment, MoveTransfersOwnership) {
  std::string name;
  {
    ShmSegment b;
    {
      ShmSegment a = ShmSegment::create("test", 4096);
      name = a.name();
      b = std::move(a);
      EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): checking the moved-from state
    }
    EXPECT_TRUE(exists(name)) << "moved-from object unlinked the segment";
    ASSERT_TRUE(b.valid());
    static_cast<char*>(b.data())[0] = 1;
    ShmSegment c(std::move(b));
    EXPECT_EQ(c.name(), name);
    // Assigning over a live owner releases what it held.
    ShmSegment d = ShmSegment::create("test", 4096);
    std::string dname = d.name();
    d = std::move(c);
    EXPECT_FALSE(exists(dname));
    EXPECT_TRUE(exists(name));
  }
  EXPECT_FALSE(exists(name));
}

TEST(ShmSegment, OpenMissingNamesIt) {
  std::string name = "/loom-test-doesnotexist-0123456789abcdef";
  try {
    ShmSegment::open(name, 64);
    FAIL() << "opened a missing segment";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kSystemError);
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(ShmSegment, OpenChecksSize) {
  ShmSegment seg = ShmSegment::create("test", 4096);
  try {
    ShmSegment::open(seg.name(), 8192);
    FAIL() << "mapped past the end of the segment";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.code(), Code::kSystemError);
    EXPECT_NE(msg.find("4096"), std::string::npos) << msg;
    EXPECT_NE(msg.find("8192"), std::string::npos) << msg;
    EXPECT_NE(msg.find(seg.name()), std::string::npos) << msg;
  }
  // A smaller view of a larger segment is fine.
  ShmSegment part = ShmSegment::open(seg.name(), 100);
  EXPECT_EQ(part.size(), 100u);
}

TEST(ShmSegment, OutOfSpaceSaysSoAndLeavesNothing) {
  // Far more than any /dev/shm holds: the reservation fails up front instead of SIGBUS later.
  size_t huge = size_t{1} << 50;
  try {
    ShmSegment::create("hugetest", huge);
    FAIL() << "created a 1 PiB segment";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.code(), Code::kSystemError);
    EXPECT_NE(msg.find(std::to_string(huge)), std::string::npos) << msg;
    EXPECT_NE(msg.find("-hugetest-"), std::string::npos) << msg;
    EXPECT_NE(msg.find("/dev/shm has"), std::string::npos) << msg;
  }
  // The failed attempt must have removed its name.
  std::string ls;
  if (FILE* f = popen("ls /dev/shm", "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), f)) ls += buf;
    pclose(f);
  }
  EXPECT_EQ(ls.find("-hugetest-"), std::string::npos) << ls;
}

TEST(ShmSegment, RejectsBadArguments) {
  EXPECT_THROW(ShmSegment::create("test", 0), Error);
  EXPECT_THROW(ShmSegment::create("a/b", 64), Error);
}

}  // namespace
}  // namespace loom
