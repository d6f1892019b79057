#include "base/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "base/scoped_env.h"

namespace loom {
namespace {

using test::ScopedEnv;

std::string shortHost() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  if (char* dot = strchr(buf, '.')) *dot = '\0';
  return buf;
}

// Points the log at a private file for one test and restores everything after.
class LogCapture {
 public:
  LogCapture(const char* level, const char* subsys)
      : debug_("NCCL_DEBUG", level),
        subsys_("NCCL_DEBUG_SUBSYS", subsys),
        file_("NCCL_DEBUG_FILE", "/tmp/loom-log-test.%h.%p"),
        loomDebug_("LOOM_DEBUG", nullptr),
        loomSubsys_("LOOM_DEBUG_SUBSYS", nullptr),
        loomFile_("LOOM_DEBUG_FILE", nullptr) {
    path_ = "/tmp/loom-log-test." + shortHost() + "." + std::to_string(getpid());
    unlink(path_.c_str());
    logReset();
  }
  ~LogCapture() {
    unlink(path_.c_str());
    logReset();
  }
  const std::string& path() const { return path_; }
  std::string contents() const {
    std::ifstream f(path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  ScopedEnv debug_, subsys_, file_, loomDebug_, loomSubsys_, loomFile_;
  std::string path_;
};

TEST(Log, InfoLineFormatInExpandedFile) {
  {
    LogCapture cap("INFO", nullptr);
    ScopedLogRank rank(3);
    LOOM_INFO(kLogInit, "hello %d from %s", 42, "loom");
    std::string expect = shortHost() + ":" + std::to_string(getpid()) + ":" +
                         std::to_string(syscall(SYS_gettid)) + " [3] NCCL INFO hello 42 from loom\n";
    EXPECT_EQ(cap.contents(), expect) << "file " << cap.path();
    EXPECT_EQ(logRank(), 3);
  }
  EXPECT_EQ(logRank(), -1);
}

TEST(Log, SubsysExclusionKeepsWarn) {
  LogCapture cap("INFO", "^INIT");
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, kLogInit));
  EXPECT_TRUE(logEnabled(LogLevel::kInfo, kLogColl));
  LOOM_INFO(kLogInit, "init-line");
  LOOM_INFO(kLogColl, "coll-line");
  LOOM_WARN("warn-line %s", "x");
  std::string out = cap.contents();
  EXPECT_EQ(out.find("init-line"), std::string::npos) << out;
  EXPECT_NE(out.find("] NCCL INFO coll-line\n"), std::string::npos) << out;
  EXPECT_NE(out.find("] NCCL WARN warn-line x\n"), std::string::npos) << out;
}

TEST(Log, SubsysListSelects) {
  LogCapture cap("INFO", "coll,net");
  EXPECT_TRUE(logEnabled(LogLevel::kInfo, kLogColl));
  EXPECT_TRUE(logEnabled(LogLevel::kInfo, kLogNet));
  EXPECT_FALSE(logEnabled(LogLevel::kInfo, kLogInit));
  EXPECT_FALSE(logEnabled(LogLevel::kTrace, kLogColl)) << "TRACE above INFO level";
}

TEST(Log, LevelsGate) {
  {
    LogCapture cap("WARN", nullptr);
    LOOM_INFO(kLogInit, "quiet");
    LOOM_WARN("loud");
    std::string out = cap.contents();
    EXPECT_EQ(out.find("quiet"), std::string::npos) << out;
    EXPECT_NE(out.find("NCCL WARN loud"), std::string::npos) << out;
  }
  {
    LogCapture cap(nullptr, nullptr);
    EXPECT_FALSE(logEnabled(LogLevel::kWarn, kLogAll));
  }
}

}  // namespace
}  // namespace loom
