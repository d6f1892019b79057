// Ring and tree construction: rings ride the fastest links and respect shared uplinks,
// trees are valid double binary trees, inter-host rings are rail-aligned.
#include "topo/search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "base/error.h"
#include "topo/topo_xml.h"
#include "topo_test_util.h"

namespace loom::topo {
namespace {

using test::loadFixture;

void expectPermutation(const std::vector<int>& ring, int n) {
  std::vector<int> sorted = ring;
  std::sort(sorted.begin(), sorted.end());
  ASSERT_EQ(static_cast<int>(sorted.size()), n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
}

int crossings(const System& s, const std::vector<int>& ring, PathType type) {
  int c = 0;
  for (size_t i = 0; i < ring.size(); ++i)
    if (s.gpuToGpu(ring[i], ring[(i + 1) % ring.size()]).type == type) ++c;
  return c;
}

bool adjacentInRing(const std::vector<int>& ring, int a, int b) {
  for (size_t i = 0; i < ring.size(); ++i) {
    int x = ring[i], y = ring[(i + 1) % ring.size()];
    if ((x == a && y == b) || (x == b && y == a)) return true;
  }
  return false;
}

TEST(SearchTest, NvSwitchRingUsesFullNvLinkBandwidth) {
  System s = loadFixture("dgx_h100.xml");
  RingSet rs = searchRings(s);
  ASSERT_EQ(rs.rings.size(), 1u);  // one ring already uses every GPU's 18 links both ways
  expectPermutation(rs.rings[0].gpus, 8);
  EXPECT_EQ(rs.rings[0].worst, PathType::kNvl);
  EXPECT_NEAR(rs.totalBw(), 18 * 20.6, 1e-6);
  EXPECT_EQ(crossings(s, rs.rings[0].gpus, PathType::kNvl), 8);
}

TEST(SearchTest, PcieRingKeepsSwitchPairsTogetherAndCrossesSocketsTwice) {
  System s = loadFixture("pcie8_2socket.xml");
  RingSet rs = searchRings(s);
  ASSERT_FALSE(rs.rings.empty());
  const std::vector<int>& ring = rs.rings[0].gpus;
  expectPermutation(ring, 8);
  EXPECT_EQ(crossings(s, ring, PathType::kSys), 2);
  // GPUs behind one switch: (0,1), (2,3), (4,5), (6,7).
  for (int sw = 0; sw < 4; ++sw) EXPECT_TRUE(adjacentInRing(ring, 2 * sw, 2 * sw + 1)) << "switch " << sw;
  EXPECT_EQ(crossings(s, ring, PathType::kPix), 4);
  // The UPI link (10 GB/s) is used once per direction; nothing else is shared.
  EXPECT_NEAR(rs.rings[0].bw, 10.0, 1e-9);
  EXPECT_EQ(rs.rings[0].worst, PathType::kSys);
  // Interleaving switch pairs sends two ring edges up each switch uplink (12 GB/s / 2) ...
  EXPECT_NEAR(ringBandwidth(s, {0, 2, 1, 3, 4, 6, 5, 7}), 6.0, 1e-9);
  // ... and crossing the sockets four times halves UPI.
  EXPECT_NEAR(ringBandwidth(s, {0, 1, 4, 5, 2, 3, 6, 7}), 5.0, 1e-9);
}

TEST(SearchTest, RingOverASubsetStaysUnderItsSwitch) {
  System s = loadFixture("pcie8_2socket.xml");
  RingSet rs = searchRings(s, {2, 3});
  ASSERT_EQ(rs.rings.size(), 1u);
  EXPECT_EQ(rs.rings[0].worst, PathType::kPix);
  EXPECT_NEAR(rs.rings[0].bw, 12.0, 1e-9);
  EXPECT_THROW(searchRings(s, {0, 9}), Error);
}

TEST(SearchTest, WorkstationAndSingleGpuRings) {
  System s = loadFixture("workstation_2gpu.xml");
  RingSet rs = searchRings(s);
  ASSERT_EQ(rs.rings.size(), 1u);
  EXPECT_NEAR(rs.rings[0].bw, 24.0, 1e-9);
  EXPECT_EQ(rs.rings[0].worst, PathType::kPhb);
  RingSet one = searchRings(s, {1});
  ASSERT_EQ(one.rings.size(), 1u);
  EXPECT_EQ(one.rings[0].gpus, std::vector<int>{1});
  EXPECT_TRUE(searchRings(loadFixture("cpu_only.xml")).rings.empty());
}

TEST(SearchTest, NvLinkMeshFindsTwoDisjointRings) {
  // Four GPUs, each pair joined by one NVLink (V100-style mesh without a switch), on PCIe Gen3.
  std::string xml = R"(<system version="1"><cpu numaid="0" affinity="ff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">)";
  const char* bus[4] = {"0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"};
  for (int g = 0; g < 4; ++g) {
    xml += std::string("<pci busid=\"") + bus[g] + "\" class=\"0x030200\" link_speed=\"8.0 GT/s PCIe\" link_width=\"16\">";
    xml += "<gpu dev=\"" + std::to_string(g) + "\" sm=\"70\">";
    for (int h = 0; h < 4; ++h)
      if (h != g) xml += std::string("<nvlink target=\"") + bus[h] + "\" count=\"1\" tclass=\"0x030200\"/>";
    xml += "</gpu></pci>";
  }
  xml += "</cpu></system>";
  System s = systemFromXml(parseXml(xml));
  RingSet rs = searchRings(s);
  // A 4-cycle uses 4 of the 6 bonds per direction; the remaining bonds form a second
  // NVLink ring only in part, so the second ring falls back to PCIe or NVB hops.
  ASSERT_GE(rs.rings.size(), 2u);
  EXPECT_EQ(rs.rings[0].worst, PathType::kNvl);
  EXPECT_NEAR(rs.rings[0].bw, 20.0, 1e-9);
  EXPECT_GT(rs.totalBw(), 20.0);
}

TEST(SearchTest, DoubleBinaryTreesAreValidAndComplementary) {
  for (int n = 1; n <= 70; ++n) {
    SCOPED_TRACE(n);
    DoubleTree dt = doubleBinaryTree(n);
    std::set<int> inner[2];
    for (int t = 0; t < 2; ++t) {
      const Tree& tree = dt.tree[t];
      ASSERT_GE(tree.root, 0);
      EXPECT_EQ(tree.parent[static_cast<size_t>(tree.root)], -1);
      for (int r = 0; r < n; ++r) {
        EXPECT_LE(tree.children[static_cast<size_t>(r)].size(), 2u);
        for (int c : tree.children[static_cast<size_t>(r)]) EXPECT_EQ(tree.parent[static_cast<size_t>(c)], r);
        if (!tree.children[static_cast<size_t>(r)].empty()) inner[t].insert(r);
        // Every rank reaches the root without a cycle.
        int x = r, steps = 0;
        while (x != tree.root && steps <= n) {
          x = tree.parent[static_cast<size_t>(x)];
          ++steps;
        }
        EXPECT_EQ(x, tree.root);
        if (r != tree.root) {
          EXPECT_NE(tree.parent[static_cast<size_t>(r)], -1);
        }
      }
    }
    // Each rank forwards (is an inner node) in at most one tree.
    for (int r : inner[0]) EXPECT_EQ(inner[1].count(r), 0u) << "rank " << r;
    if (n >= 2) {
      EXPECT_NE(dt.tree[0].root, dt.tree[1].root);
    }
  }
}

TEST(SearchTest, DoubleBinaryTreeShapeForSevenAndEight) {
  DoubleTree seven = doubleBinaryTree(7);
  // In-order tree over 1..7 (root 4) shifted to ranks 0..6.
  EXPECT_EQ(seven.tree[0].root, 3);
  EXPECT_EQ(seven.tree[0].children[3], (std::vector<int>{1, 5}));
  EXPECT_EQ(seven.tree[0].children[1], (std::vector<int>{0, 2}));
  EXPECT_EQ(seven.tree[0].children[5], (std::vector<int>{4, 6}));
  EXPECT_EQ(seven.tree[1].root, 4);  // odd n: shifted by one
  DoubleTree eight = doubleBinaryTree(8);
  EXPECT_EQ(eight.tree[0].root, 7);
  EXPECT_EQ(eight.tree[0].children[7], (std::vector<int>{3}));
  EXPECT_EQ(eight.tree[1].root, 0);  // even n: mirrored
  EXPECT_EQ(eight.tree[1].children[0], (std::vector<int>{4}));
  EXPECT_THROW(doubleBinaryTree(0), Error);
}

TEST(SearchTest, RailRingsEnterAndLeaveOnTheSameRail) {
  System s = loadFixture("dgx_h100.xml");
  RingSet rs = searchRings(s);
  std::vector<RailRing> rails = railRings(s, rs.rings[0]);
  ASSERT_EQ(rails.size(), 8u);
  for (size_t i = 0; i < rails.size(); ++i) {
    EXPECT_EQ(rails[i].net, static_cast<int>(i));
    EXPECT_EQ(s.railOf(rails[i].gpus.front()), rails[i].net);
    expectPermutation(rails[i].gpus, 8);
  }
  // On the PCIe box two NICs serve eight GPUs: two rail orders.
  System p = loadFixture("pcie8_2socket.xml");
  std::vector<RailRing> prails = railRings(p, searchRings(p).rings[0]);
  ASSERT_EQ(prails.size(), 2u);
  EXPECT_EQ(p.railOf(prails[1].gpus.front()), 1);
}

}  // namespace
}  // namespace loom::topo
