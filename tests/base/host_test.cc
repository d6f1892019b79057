#include "base/host.h"

#include <gtest/gtest.h>

#include <fstream>

#include "base/scoped_env.h"

namespace loom {
namespace {

TEST(Host, IdentityIsStableAndIncludesBootId) {
  test::ScopedEnv clear("LOOM_HOSTID", nullptr);
  EXPECT_FALSE(hostName().empty());
  EXPECT_EQ(hostHash(), hostHash());
  std::string id = hostIdString();
  EXPECT_EQ(id.rfind(hostName() + ":", 0), 0u) << id;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot;
  ASSERT_TRUE(std::getline(f, boot)) << "no boot id on this machine";
  // Outside the machine's own network / pid namespaces (containers) the id goes on with
  // "/netns:<inode>" or "/pidns:<inode>" (tests/multihost checks those).
  std::string base = hostName() + ":" + boot;
  EXPECT_EQ(id.substr(0, base.size()), base) << id;
  EXPECT_TRUE(id.size() == base.size() || id[base.size()] == '/') << id;
}

TEST(Host, HostIdKnobOverrides) {
  uint64_t real;
  {
    test::ScopedEnv clear("LOOM_HOSTID", nullptr);
    real = hostHash();
  }
  test::ScopedEnv a("LOOM_HOSTID", "fake-host-a");
  EXPECT_EQ(hostIdString(), "fake-host-a");
  uint64_t ha = hostHash();
  EXPECT_NE(ha, real);
  {
    test::ScopedEnv b("LOOM_HOSTID", "fake-host-b");
    EXPECT_NE(hostHash(), ha);
  }
  EXPECT_EQ(hostHash(), ha);
}

}  // namespace
}  // namespace loom
