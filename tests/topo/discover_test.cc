// Live discovery against a synthetic /sys and /proc (a GPU and an NDR HCA behind one PCIe
// switch, a 25 GbE port on the other socket, a veth without PCI), against this machine,
// and NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE handling.
#include "topo/discover.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "topo/load.h"
#include "topo/topo_xml.h"
#include "topo_test_util.h"

namespace loom::topo {
namespace {

namespace fs = std::filesystem;

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/loom_sysfs_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    write("proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n\n");
    write("sys/devices/system/node/node0/cpulist", "0-3\n");
    write("sys/devices/system/node/node1/cpulist", "4-7\n");
    // Socket 0: root port 00:01.0 -> switch (upstream 01:00.0, downstream 02:00.0 / 02:01.0)
    // -> GPU 03:00.0 and HCA 04:00.0.
    const std::string rp = "sys/devices/pci0000:00/0000:00:01.0";
    const std::string usp = rp + "/0000:01:00.0";
    pci(rp, "0x060400", "0x8086", "32.0 GT/s PCIe", "16", "0");
    pci(usp, "0x060400", "0x1000", "32.0 GT/s PCIe", "16", "0");
    pci(usp + "/0000:02:00.0", "0x060400", "0x1000", "32.0 GT/s PCIe", "16", "0");
    pci(usp + "/0000:02:01.0", "0x060400", "0x1000", "32.0 GT/s PCIe", "16", "0");
    pci(usp + "/0000:02:00.0/0000:03:00.0", "0x030200", "0x10de", "32.0 GT/s PCIe", "16", "0");
    const std::string hca = usp + "/0000:02:01.0/0000:04:00.0";
    pci(hca, "0x020700", "0x15b3", "32.0 GT/s PCIe", "16", "0");
    const std::string ib = hca + "/infiniband/mlx5_0";
    write(ib + "/node_guid", "a088:c203:0074:cfda\n");
    write(ib + "/ports/1/state", "4: ACTIVE\n");
    write(ib + "/ports/1/rate", "400 Gb/sec (4X NDR)\n");
    write(ib + "/ports/2/state", "1: DOWN\n");
    link("sys/class/infiniband/mlx5_0", ib);
    link(ib + "/device", hca);
    netdev("ib0", hca, "up", "400000");  // IPoIB on the HCA: already an RDMA port
    // Socket 1: a 25 GbE NIC straight on a root port.
    const std::string eth = "sys/devices/pci0000:80/0000:80:02.0";
    pci(eth, "0x020000", "0x14e4", "16.0 GT/s PCIe", "8", "1");
    netdev("eth0", eth, "up", "25000");
    netdev("eth1", eth, "down", "25000");  // down: not listed
    netdev("veth0", "", "up", "10000");    // no PCI function
    write("sys/class/net/lo/operstate", "unknown\n");
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const std::string& rel, const std::string& text) {
    fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void link(const std::string& rel, const std::string& targetRel) {
    fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    fs::create_directory_symlink(fs::path(root_) / targetRel, p);
  }
  void pci(const std::string& dir, const char* cls, const char* vendor, const char* speed, const char* width,
           const char* numa) {
    write(dir + "/class", std::string(cls) + "\n");
    write(dir + "/vendor", std::string(vendor) + "\n");
    write(dir + "/device", "0x1234\n");
    write(dir + "/max_link_speed", std::string(speed) + "\n");
    write(dir + "/max_link_width", std::string(width) + "\n");
    write(dir + "/numa_node", std::string(numa) + "\n");
    link("sys/bus/pci/devices/" + fs::path(dir).filename().string(), dir);
  }
  void netdev(const std::string& name, const std::string& pciDir, const char* state, const char* speed) {
    std::string base = pciDir.empty() ? "sys/devices/virtual/net/" + name : pciDir + "/net/" + name;
    write(base + "/operstate", std::string(state) + "\n");
    write(base + "/speed", std::string(speed) + "\n");
    if (!pciDir.empty()) link(base + "/device", pciDir);
    link("sys/class/net/" + name, base);
  }

  std::string root_;
};

TEST_F(FakeSysfs, BuildsNcclStyleXmlFromSysfs) {
  XmlNode xml = detectXml(DetectOptions{root_, /*useNvml=*/false});
  ASSERT_EQ(xml.children().size(), 2u);
  const XmlNode& cpu0 = xml.children()[0];
  EXPECT_EQ(cpu0.attrOr("numaid", ""), "0");
  EXPECT_EQ(cpu0.attrOr("affinity", ""), "0000000f");
  EXPECT_EQ(cpu0.attrOr("vendor", ""), "GenuineIntel");
  EXPECT_EQ(cpu0.attrOr("modelid", ""), "143");
  EXPECT_EQ(xml.children()[1].attrOr("affinity", ""), "000000f0");
  // NCCL's shape: the switch appears as its upstream port; root and downstream ports do not.
  const XmlNode* sw = nullptr;
  for (const XmlNode& c : cpu0.children())
    if (c.attrOr("busid", "") == "0000:01:00.0") sw = &c;
  ASSERT_NE(sw, nullptr) << writeXml(xml);
  ASSERT_EQ(sw->children().size(), 2u);
  EXPECT_EQ(sw->children()[0].attrOr("busid", ""), "0000:03:00.0");
  EXPECT_EQ(sw->children()[1].attrOr("busid", ""), "0000:04:00.0");
  const XmlNode* net = sw->children()[1].child("nic")->child("net");
  ASSERT_NE(net, nullptr);
  EXPECT_EQ(net->attrOr("name", ""), "mlx5_0");
  EXPECT_EQ(net->attrOr("speed", ""), "400000");
  EXPECT_EQ(net->attrOr("guid", ""), "0xa088c2030074cfda");
  EXPECT_EQ(sw->children()[1].child("nic")->children().size(), 1u);  // port 2 is down

  System s = systemFromXml(xml);
  ASSERT_EQ(s.gpuCount(), 1);
  EXPECT_EQ(s.gpu(0).busId, "0000:03:00.0");
  EXPECT_EQ(s.gpu(0).sm, 0);  // no NVML here
  ASSERT_EQ(s.netCount(), 3);  // mlx5_0, eth0, veth0 (ib0 is the HCA again, eth1 is down)
  EXPECT_EQ(s.net(s.railOf(0)).netName, "mlx5_0");
  EXPECT_EQ(s.gpuToNet(0, s.railOf(0)).type, PathType::kPix);
  EXPECT_TRUE(s.net(s.railOf(0)).rdma);
  int eth = -1, veth = -1;
  for (int i = 0; i < s.netCount(); ++i) {
    if (s.net(i).netName == "eth0") eth = i;
    if (s.net(i).netName == "veth0") veth = i;
  }
  ASSERT_GE(eth, 0);
  ASSERT_GE(veth, 0);
  EXPECT_FALSE(s.net(eth).rdma);
  EXPECT_DOUBLE_EQ(s.net(eth).speedMbps, 25000);
  EXPECT_EQ(s.numaOf(s.netNodeId(eth)), 1);
  EXPECT_EQ(s.gpuToNet(0, eth).type, PathType::kSys);
  EXPECT_EQ(s.node(s.net(veth).parent).busId, "");  // hangs off a CPU, no PCI address
}

TEST(DiscoverTest, ThisMachineYieldsAModel) {
  // Whatever this host has (CI: CPUs, a virtio NIC, no GPU, no NVML), discovery succeeds.
  XmlNode xml = detectXml();
  System s = systemFromXml(xml);
  EXPECT_GE(s.cpuCount(), 1);
  EXPECT_GE(s.totalCores(), 1);
  if (!fs::exists("/dev/nvidiactl")) {
    EXPECT_EQ(s.gpuCount(), 0);
  }
}

TEST(DiscoverTest, TopoFileIsMergedAndDumped) {
  std::string dump = "/tmp/loom_topo_dump_" + std::to_string(getpid()) + ".xml";
  setenv("NCCL_TOPO_FILE", test::fixture("dgx_h100.xml").c_str(), 1);
  setenv("NCCL_TOPO_DUMP_FILE", dump.c_str(), 1);
  // Detection over an empty root finds one CPU and nothing else, so the result is exactly
  // the file (plus that CPU's defaults), whatever machine runs the test.
  const DetectOptions nothing{"/nonexistent-sysfs-root", /*useNvml=*/false};
  System s = loadLocalSystem(nothing);
  unsetenv("NCCL_TOPO_FILE");
  unsetenv("NCCL_TOPO_DUMP_FILE");
  EXPECT_EQ(s.gpuCount(), 8);
  EXPECT_EQ(s.netCount(), 8);
  EXPECT_EQ(s.cpuCount(), 2);
  EXPECT_EQ(s.gpuToNet(3, 3).type, PathType::kPix);
  EXPECT_NE(s.source().find("dgx_h100.xml"), std::string::npos);
  System again = loadSystemFile(dump);
  EXPECT_EQ(again.gpuCount(), 8);
  EXPECT_EQ(again.netCount(), s.netCount());
  fs::remove(dump);

  setenv("LOOM_TOPO_FILE", "/nonexistent/topology.xml", 1);
  try {
    loadLocalSystem(nothing);
    ADD_FAILURE() << "expected an error for a missing topology file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/topology.xml"), std::string::npos);
  }
  unsetenv("LOOM_TOPO_FILE");
}

}  // namespace
}  // namespace loom::topo
