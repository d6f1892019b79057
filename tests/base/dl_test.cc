#include "base/dl.h"

#include <unistd.h>

#include <gtest/gtest.h>

namespace loom {
namespace {

TEST(DynLib, LoadsLibcAndBindsGetpid) {
  std::string err;
  DynLib lib = DynLib::open({"libloom-not-here.so", "libc.so.6"}, &err);
  ASSERT_TRUE(lib.loaded()) << err;
  EXPECT_NE(lib.path().find("libc.so.6"), std::string::npos) << lib.path();
  pid_t (*fn)() = nullptr;
  ASSERT_TRUE(lib.bind(fn, "getpid"));
  EXPECT_EQ(fn(), getpid());
  EXPECT_EQ(lib.symbol("loom_no_such_symbol"), nullptr);

  DynLib moved(std::move(lib));
  EXPECT_FALSE(lib.loaded());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(lib.symbol("getpid"), nullptr);
  EXPECT_TRUE(moved.loaded());
  EXPECT_NE(moved.symbol("getpid"), nullptr);
}

TEST(DynLib, MissingLibraryListsEveryName) {
  std::string err;
  DynLib lib = DynLib::open({"libloom-missing-a.so", "libloom-missing-b.so.1"}, &err);
  EXPECT_FALSE(lib.loaded());
  EXPECT_NE(err.find("libloom-missing-a.so"), std::string::npos) << err;
  EXPECT_NE(err.find("libloom-missing-b.so.1"), std::string::npos) << err;
  EXPECT_NE(err.find("No such file"), std::string::npos) << "dlerror() text missing: " << err;
  // No error pointer: must not crash, still unloaded.
  EXPECT_FALSE(DynLib::open({"libloom-missing-a.so"}).loaded());
}

}  // namespace
}  // namespace loom
