// NCCL_TESTS_SPLIT / NCCL_TESTS_SPLIT_MASK as nccl-tests reads them: the color of each
// process, the groups they make, and the values refused.
#include "bench/common/split.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "bench/common/bench_error.h"

namespace loom::bench {
namespace {

// Sets the two variables for one parse, then clears them.
TestSplit parseWith(const char* split, const char* mask) {
  if (split) setenv("NCCL_TESTS_SPLIT", split, 1);
  else unsetenv("NCCL_TESTS_SPLIT");
  if (mask) setenv("NCCL_TESTS_SPLIT_MASK", mask, 1);
  else unsetenv("NCCL_TESTS_SPLIT_MASK");
  TestSplit t;
  try {
    t = parseTestSplit();
  } catch (...) {
    unsetenv("NCCL_TESTS_SPLIT");
    unsetenv("NCCL_TESTS_SPLIT_MASK");
    throw;
  }
  unsetenv("NCCL_TESTS_SPLIT");
  unsetenv("NCCL_TESTS_SPLIT_MASK");
  return t;
}

std::vector<int> colors(const TestSplit& t, int n) {
  std::vector<int> c;
  for (int p = 0; p < n; ++p) c.push_back(t.colorOf(p));
  return c;
}

TEST(TestSplit, ColorsAsNcclTests) {
  EXPECT_FALSE(parseWith(nullptr, nullptr).active());
  EXPECT_EQ(colors(parseWith("MOD 4", nullptr), 8), (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(colors(parseWith("% 4", nullptr), 8), (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(colors(parseWith("div 4", nullptr), 8), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(colors(parseWith("AND 0x3", nullptr), 6), (std::vector<int>{0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(colors(parseWith("OR 1", nullptr), 4), (std::vector<int>{1, 1, 3, 3}));
  // The mask is hexadecimal with or without 0x, and wins over NCCL_TESTS_SPLIT.
  EXPECT_EQ(colors(parseWith("DIV 2", "7"), 9), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 0}));
  EXPECT_EQ(colors(parseWith(nullptr, "0x10"), 2), (std::vector<int>{0, 0}));
  EXPECT_EQ(parseWith("MOD 3", nullptr).groupSizes(8), (std::vector<int>{3, 3, 2}));
  EXPECT_EQ(parseWith("AND 0", nullptr).groupSizes(5), (std::vector<int>{5}));
}

TEST(TestSplit, MalformedValuesAreRefused) {
  for (const char* bad : {"MOD 0", "DIV 0", "MODULO 2", "XOR 1", "MOD", "MOD two", "AND -1", "8"}) {
    try {
      parseWith(bad, nullptr);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const BenchError& e) {
      EXPECT_EQ(e.status(), Status::kInvalidUsage) << bad;
      EXPECT_NE(std::string(e.what()).find(std::string("NCCL_TESTS_SPLIT=") + bad), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(parseWith(nullptr, "0xzz"), BenchError);
}

}  // namespace
}  // namespace loom::bench
