// NCCL_IB_HCA's rules (prefix, '=', '^', ':port', lists) and the error when they select
// nothing. Device discovery itself runs against real rxe devices in the rxe VM (tests/rxe).
#include <gtest/gtest.h>

#include "base/error.h"
#include "transports/net/ib_devices.h"

namespace loomtest {
namespace {

using loom::IbHcaFilter;

TEST(IbHca, EmptySelectsEverything) {
  IbHcaFilter f = IbHcaFilter::parse("");
  EXPECT_TRUE(f.matches("mlx5_0", 1));
  EXPECT_TRUE(f.matches("rxe0", 2));
}

TEST(IbHca, PrefixesExactNamesAndPorts) {
  IbHcaFilter f = IbHcaFilter::parse("mlx5");
  EXPECT_TRUE(f.matches("mlx5_0", 1));
  EXPECT_TRUE(f.matches("mlx5_10", 2));
  EXPECT_FALSE(f.matches("rxe0", 1));
  f = IbHcaFilter::parse("=mlx5_1");
  EXPECT_TRUE(f.matches("mlx5_1", 1));
  EXPECT_FALSE(f.matches("mlx5_10", 1)) << "'=' must not match a longer name";
  f = IbHcaFilter::parse("mlx5_0:1,mlx5_1:2");
  EXPECT_TRUE(f.matches("mlx5_0", 1));
  EXPECT_FALSE(f.matches("mlx5_0", 2));
  EXPECT_TRUE(f.matches("mlx5_1", 2));
  EXPECT_FALSE(f.matches("mlx5_1", 1));
}

TEST(IbHca, CaretExcludes) {
  IbHcaFilter f = IbHcaFilter::parse("^mlx5_1");
  EXPECT_TRUE(f.matches("mlx5_0", 1));
  EXPECT_FALSE(f.matches("mlx5_1", 1));
  EXPECT_FALSE(f.matches("mlx5_12", 1)) << "'^' excludes by prefix";
  f = IbHcaFilter::parse("^=mlx5_1");
  EXPECT_FALSE(f.matches("mlx5_1", 1));
  EXPECT_TRUE(f.matches("mlx5_12", 1)) << "'^=' excludes exact names only";
  f = IbHcaFilter::parse("^");
  EXPECT_FALSE(f.matches("mlx5_0", 1)) << "'^' alone excludes everything, as in NCCL";
  f = IbHcaFilter::parse("^mlx5_0:1");
  EXPECT_FALSE(f.matches("mlx5_0", 1));
  EXPECT_TRUE(f.matches("mlx5_0", 2));
}

TEST(IbHca, MalformedEntriesAreInvalidArgument) {
  for (const char* bad : {"mlx5_0:", "mlx5_0:x", "mlx5_0:0", ":1", "mlx5_0:1x"}) {
    try {
      IbHcaFilter::parse(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::Code::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("NCCL_IB_HCA="), std::string::npos) << e.what();
    }
  }
}

TEST(IbHca, SelectingNothingNamesTheActivePorts) {
  std::vector<loom::IbPort> ports = {{"mlx5_0", 1, true, "InfiniBand", 128},
                                     {"mlx5_1", 1, false, "InfiniBand", 128},
                                     {"rxe0", 1, true, "Ethernet", 1024}};
  auto sel = loom::selectIbPorts(ports, "mlx5");
  ASSERT_EQ(sel.size(), 1u) << "only active ports are selected";
  EXPECT_EQ(sel[0].device, "mlx5_0");
  EXPECT_EQ(loom::selectIbPorts(ports, "^mlx5").size(), 1u);
  try {
    loom::selectIbPorts(ports, "mlx9");
    FAIL() << "a filter matching nothing was accepted";
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.code(), loom::Code::kInvalidArgument);
    std::string w = e.what();
    EXPECT_NE(w.find("NCCL_IB_HCA=mlx9"), std::string::npos) << w;
    EXPECT_NE(w.find("mlx5_0:1, rxe0:1"), std::string::npos) << w;
  }
  EXPECT_TRUE(loom::selectIbPorts({}, "mlx9").empty()) << "no device at all is not a filter error";
}

}  // namespace
}  // namespace loomtest
