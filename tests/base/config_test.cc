#include "base/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/scoped_env.h"

namespace loom {
namespace {

using test::ScopedEnv;

IntKnob kTestInt("LOOM_TEST_INT", "NCCL_TEST_INT", 7, "test integer");
BoolKnob kTestBool("LOOM_TEST_BOOL", "NCCL_TEST_BOOL", true, "test bool");
StringKnob kTestStr("LOOM_TEST_STR", "", "dflt", "test string");
SizeKnob kTestSize("LOOM_TEST_SIZE", "NCCL_TEST_SIZE", "4M", "test size");

// Runs `f`, expects kInvalidArgument, returns the message.
template <typename F>
std::string invalidArg(F f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no exception";
  return "";
}

TEST(Config, IntDefaultAndSources) {
  ScopedEnv l("LOOM_TEST_INT", nullptr), n("NCCL_TEST_INT", nullptr);
  EXPECT_EQ(kTestInt.get(), 7);
  EXPECT_EQ(kTestInt.source(), "default");
  EXPECT_FALSE(kTestInt.isSet());
  {
    ScopedEnv a("NCCL_TEST_INT", "5");
    EXPECT_EQ(kTestInt.get(), 5);
    EXPECT_EQ(kTestInt.source(), "env NCCL_TEST_INT");
    ScopedEnv b("LOOM_TEST_INT", "42");
    EXPECT_EQ(kTestInt.get(), 42) << "LOOM_ name must win over the NCCL alias";
    EXPECT_EQ(kTestInt.source(), "env LOOM_TEST_INT");
    EXPECT_TRUE(kTestInt.isSet());
  }
  {
    ScopedEnv empty("LOOM_TEST_INT", "");  // set but empty counts as unset
    EXPECT_EQ(kTestInt.get(), 7);
    EXPECT_EQ(kTestInt.source(), "default");
  }
}

TEST(Config, IntParsing) {
  ScopedEnv n("NCCL_TEST_INT", nullptr);
  {
    ScopedEnv v("LOOM_TEST_INT", "-3");
    EXPECT_EQ(kTestInt.get(), -3);
  }
  {
    ScopedEnv v("LOOM_TEST_INT", "0x10");
    EXPECT_EQ(kTestInt.get(), 16);
  }
  {
    ScopedEnv v("LOOM_TEST_INT", "9223372036854775807");
    EXPECT_EQ(kTestInt.get(), INT64_MAX);
  }
  for (const char* bad : {"12abc", "abc", "1.5", "99999999999999999999"}) {
    ScopedEnv v("LOOM_TEST_INT", bad);
    std::string msg = invalidArg([] { kTestInt.get(); });
    EXPECT_NE(msg.find("LOOM_TEST_INT"), std::string::npos) << msg;
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
  }
  ScopedEnv l("LOOM_TEST_INT", nullptr);
  ScopedEnv alias("NCCL_TEST_INT", "zz");
  std::string msg = invalidArg([] { kTestInt.get(); });
  EXPECT_NE(msg.find("NCCL_TEST_INT=zz"), std::string::npos)
      << "error must name the variable the user actually set: " << msg;
}

TEST(Config, Bool) {
  ScopedEnv l("LOOM_TEST_BOOL", nullptr), n("NCCL_TEST_BOOL", nullptr);
  EXPECT_TRUE(kTestBool.get());
  for (const char* t : {"1", "true", "TRUE", "yes", "on"}) {
    ScopedEnv v("LOOM_TEST_BOOL", t);
    EXPECT_TRUE(kTestBool.get()) << t;
  }
  for (const char* f : {"0", "false", "No", "off"}) {
    ScopedEnv v("NCCL_TEST_BOOL", f);
    EXPECT_FALSE(kTestBool.get()) << f;
  }
  for (const char* bad : {"2", "maybe", "-1"}) {
    ScopedEnv v("LOOM_TEST_BOOL", bad);
    std::string msg = invalidArg([] { kTestBool.get(); });
    EXPECT_NE(msg.find(std::string("LOOM_TEST_BOOL=") + bad), std::string::npos) << msg;
  }
}

TEST(Config, StringAndRegistry) {
  ScopedEnv l("LOOM_TEST_STR", nullptr);
  EXPECT_EQ(kTestStr.get(), "dflt");
  {
    ScopedEnv v("LOOM_TEST_STR", "hello world");
    EXPECT_EQ(kTestStr.get(), "hello world");
    EXPECT_EQ(kTestStr.raw(), "hello world");
  }
  EXPECT_EQ(findKnob("LOOM_TEST_INT"), &kTestInt);
  EXPECT_EQ(findKnob("NCCL_TEST_SIZE"), &kTestSize);
  EXPECT_EQ(findKnob("LOOM_NO_SUCH_KNOB"), nullptr);
  EXPECT_EQ(kTestInt.type(), KnobType::kInt);
  EXPECT_EQ(kTestInt.defaultValue(), "7");
  EXPECT_STREQ(kTestStr.ncclAlias(), "");
  EXPECT_STREQ(kTestInt.help(), "test integer");
  int seen = 0;
  for (const KnobBase* k : allKnobs())
    if (k == &kTestInt || k == &kTestBool || k == &kTestStr || k == &kTestSize) ++seen;
  EXPECT_EQ(seen, 4);
}

TEST(Config, SizeSuffixes) {
  ScopedEnv l("LOOM_TEST_SIZE", nullptr), n("NCCL_TEST_SIZE", nullptr);
  EXPECT_EQ(kTestSize.get(), 4u << 20);
  EXPECT_EQ(parseSize("123", "X"), 123u);
  EXPECT_EQ(parseSize("4K", "X"), 4096u);
  EXPECT_EQ(parseSize("4k", "X"), 4096u);
  EXPECT_EQ(parseSize("2M", "X"), 2u << 20);
  EXPECT_EQ(parseSize("3G", "X"), 3ull << 30);
  EXPECT_EQ(parseSize("8KB", "X"), 8192u);
  {
    ScopedEnv v("NCCL_TEST_SIZE", "16K");
    EXPECT_EQ(kTestSize.get(), 16384u);
  }
  for (const char* bad : {"", "abc", "4T", "4KK", "-1", "-1K", "17179869184G"}) {
    std::string msg = invalidArg([&] { parseSize(bad, "LOOM_TEST_SIZE"); });
    EXPECT_NE(msg.find("LOOM_TEST_SIZE"), std::string::npos) << bad << ": " << msg;
  }
  ScopedEnv v("NCCL_TEST_SIZE", "lots");
  std::string msg = invalidArg([] { kTestSize.get(); });
  EXPECT_NE(msg.find("NCCL_TEST_SIZE=lots"), std::string::npos) << msg;
}

// NCCL_* variables no knob reads are listed (NCCL_TESTS_* and profiler plugins' variables
// aside); knobs' NCCL names are not.
TEST(Config, UnreadNcclVariables) {
  ScopedEnv a("NCCL_P2P_LEVEL", "NVL"), b("NCCL_TEST_INT", "3"), c("NCCL_TESTS_SPLIT", "MOD 2");
  ScopedEnv d("NCCL_PROFILE_EVENT_MASK", "2"), e("NCCL_INSPECTOR_ENABLE", "1");
  std::vector<std::string> unread = unreadNcclVariables();
  EXPECT_NE(std::find(unread.begin(), unread.end(), "NCCL_P2P_LEVEL=NVL"), unread.end());
  for (const std::string& v : unread) {
    EXPECT_NE(v.rfind("NCCL_TEST_INT=", 0), 0u) << "a knob's alias is read: " << v;
    EXPECT_NE(v.rfind("NCCL_TESTS_", 0), 0u) << v;
    EXPECT_NE(v.rfind("NCCL_PROFILE_", 0), 0u) << v;
    EXPECT_NE(v.rfind("NCCL_INSPECTOR_", 0), 0u) << v;
  }
}

// What ranks compare for job-wide knobs: the value, not its spelling.
TEST(Config, CanonicalValues) {
  ScopedEnv l("LOOM_TEST_SIZE", nullptr), n("NCCL_TEST_SIZE", "1M");
  EXPECT_EQ(kTestSize.canonical(), "1048576");
  {
    ScopedEnv v("LOOM_TEST_SIZE", "1048576");
    EXPECT_EQ(kTestSize.canonical(), "1048576");
  }
  ScopedEnv i("LOOM_TEST_INT", "0x10"), b("LOOM_TEST_BOOL", "Yes"), s("LOOM_TEST_STR", " Ring,Tree ");
  EXPECT_EQ(kTestInt.canonical(), "16");
  EXPECT_EQ(kTestBool.canonical(), "1");
  EXPECT_EQ(kTestStr.canonical(), "ring,tree");
  // A malformed value compares as written (its own rank reports it when it reads it).
  ScopedEnv bad("LOOM_TEST_INT", "seven");
  EXPECT_EQ(kTestInt.canonical(), "seven");
  EXPECT_EQ(kTestInt.scope(), KnobScope::kRank);
}

}  // namespace
}  // namespace loom
