// The system model on the fixtures: path types and bandwidths as NCCL / nvidia-smi
// classify them, rails, NVLink counts, and the XML import / export / merge.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "topo/topo_xml.h"
#include "topo_test_util.h"

namespace loom::topo {
namespace {

using test::loadFixture;

PathType gg(const System& s, int a, int b) { return s.gpuToGpu(a, b).type; }
PathType gn(const System& s, int g, int n) { return s.gpuToNet(g, n).type; }

TEST(TopoTest, DgxH100PathsAndRails) {
  System s = loadFixture("dgx_h100.xml");
  ASSERT_EQ(s.gpuCount(), 8);
  ASSERT_EQ(s.netCount(), 8);
  EXPECT_EQ(s.cpuCount(), 2);
  EXPECT_TRUE(s.hasNvSwitch());
  EXPECT_EQ(s.minGpuSm(), 90);
  for (int a = 0; a < 8; ++a) {
    EXPECT_EQ(gg(s, a, a), PathType::kLoc);
    for (int b = 0; b < 8; ++b) {
      if (a == b) continue;
      // Every pair is NV18 through the NVSwitches: 18 links x 20.6 GB/s (NCCL's SM90 rate).
      EXPECT_EQ(gg(s, a, b), PathType::kNvl) << a << "->" << b;
      EXPECT_EQ(s.gpuToGpu(a, b).nvlinks, 18);
      EXPECT_NEAR(s.gpuToGpu(a, b).bw, 18 * 20.6, 1e-6);
    }
    // One PCIe Gen5 switch per GPU/NIC pair; other NICs on the socket via the host bridge,
    // NICs on the other socket across UPI.
    for (int n = 0; n < 8; ++n) {
      PathType want = n == a ? PathType::kPix : (n / 4 == a / 4 ? PathType::kPhb : PathType::kSys);
      EXPECT_EQ(gn(s, a, n), want) << "GPU" << a << " NIC" << n;
    }
    EXPECT_EQ(s.railOf(a), a);
    EXPECT_NEAR(s.gpuToNet(a, a).bw, 48.0, 1e-6);  // Gen5 x16 below the 50 GB/s port
    EXPECT_EQ(s.numaOf(s.gpuNodeId(a)), a / 4);
  }
  EXPECT_EQ(s.gpu(0).busId, "0000:18:00.0");
  EXPECT_EQ(s.gpu(7).busId, "0000:db:00.0");
  EXPECT_EQ(s.net(0).netName, "mlx5_0");
  EXPECT_DOUBLE_EQ(s.net(0).speedMbps, 400000);
  EXPECT_TRUE(s.net(0).rdma);
  EXPECT_TRUE(s.net(0).gdr);
}

TEST(TopoTest, DgxA100TwoLevelSwitches) {
  System s = loadFixture("dgx_a100.xml");
  ASSERT_EQ(s.gpuCount(), 8);
  ASSERT_EQ(s.netCount(), 8);
  EXPECT_EQ(s.gpuToGpu(0, 5).nvlinks, 12);
  EXPECT_NEAR(s.gpuToGpu(0, 5).bw, 240.0, 1e-6);
  // GPU0's leaf switch holds NIC0; NIC1 is under the sibling leaf of the same top switch;
  // NIC2/3 hang off the other switch complex of socket 0; NIC4+ are on socket 1.
  EXPECT_EQ(gn(s, 0, 0), PathType::kPix);
  EXPECT_EQ(gn(s, 0, 1), PathType::kPxb);
  EXPECT_EQ(gn(s, 0, 2), PathType::kPhb);
  EXPECT_EQ(gn(s, 0, 4), PathType::kSys);
  EXPECT_EQ(gn(s, 5, 4), PathType::kPxb);
  for (int g = 0; g < 8; ++g) EXPECT_EQ(s.railOf(g), g);
  EXPECT_NEAR(s.gpuToNet(0, 0).bw, 24.0, 1e-6);  // Gen4 x16 limits the 25 GB/s HDR port
}

TEST(TopoTest, PcieTwoSocketBox) {
  System s = loadFixture("pcie8_2socket.xml");
  ASSERT_EQ(s.gpuCount(), 8);
  EXPECT_FALSE(s.hasNvSwitch());
  EXPECT_EQ(gg(s, 0, 1), PathType::kPix);
  EXPECT_EQ(gg(s, 0, 2), PathType::kPhb);
  EXPECT_EQ(gg(s, 0, 4), PathType::kSys);
  EXPECT_EQ(gg(s, 6, 7), PathType::kPix);
  EXPECT_NEAR(s.gpuToGpu(0, 1).bw, 12.0, 1e-6);  // Gen3 x16
  EXPECT_NEAR(s.gpuToGpu(0, 4).bw, 10.0, 1e-6);  // Skylake UPI in NCCL's table
  EXPECT_EQ(s.gpuToGpu(0, 4).hops.size(), 6u);   // GPU sw CPU CPU sw GPU
  // Two NICs, one per socket, each behind the first switch: the socket's GPUs share it.
  for (int g = 0; g < 4; ++g) EXPECT_EQ(s.railOf(g), 0);
  for (int g = 4; g < 8; ++g) EXPECT_EQ(s.railOf(g), 1);
  EXPECT_EQ(gn(s, 1, 0), PathType::kPix);
  EXPECT_EQ(gn(s, 2, 0), PathType::kPhb);
  EXPECT_EQ(gn(s, 2, 1), PathType::kSys);
}

TEST(TopoTest, TwoGpuWorkstation) {
  System s = loadFixture("workstation_2gpu.xml");
  ASSERT_EQ(s.gpuCount(), 2);
  ASSERT_EQ(s.netCount(), 1);
  EXPECT_EQ(gg(s, 0, 1), PathType::kPhb);
  EXPECT_NEAR(s.gpuToGpu(0, 1).bw, 24.0, 1e-6);
  EXPECT_FALSE(s.net(0).rdma);
  EXPECT_EQ(s.net(0).netName, "enp5s0");
  EXPECT_EQ(s.railOf(0), 0);
  EXPECT_EQ(s.railOf(1), 0);
  // The 2.5 GbE port bounds the path, not the PCIe link: 2500 Mb/s = 0.3125 GB/s.
  EXPECT_NEAR(s.gpuToNet(0, 0).bw, 0.3125, 1e-9);
}

TEST(TopoTest, CpuOnlyHost) {
  System s = loadFixture("cpu_only.xml");
  EXPECT_EQ(s.gpuCount(), 0);
  ASSERT_EQ(s.netCount(), 2);
  EXPECT_EQ(s.cpuCount(), 2);
  EXPECT_EQ(s.totalCores(), 64);
  EXPECT_TRUE(s.net(0).rdma);
  EXPECT_FALSE(s.net(1).rdma);
  EXPECT_EQ(s.path(s.netNodeId(0), s.netNodeId(1)).type, PathType::kSys);
  EXPECT_EQ(s.numaOf(s.netNodeId(1)), 1);
}

TEST(TopoTest, NvLinkThroughAGpuIsNvb) {
  // Three GPUs in an NVLink chain (0-1, 1-2), all on PCIe Gen4 root ports of one CPU.
  const char* xml = R"(<system version="1">
  <cpu numaid="0" affinity="ff" arch="x86_64" vendor="AuthenticAMD" familyid="23" modelid="49">
    <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="0" sm="80"><nvlink target="0000:02:00.0" count="2" tclass="0x030200"/></gpu>
    </pci>
    <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="1" sm="80">
        <nvlink target="0000:01:00.0" count="2" tclass="0x030200"/>
        <nvlink target="0000:03:00.0" count="2" tclass="0x030200"/>
      </gpu>
    </pci>
    <pci busid="0000:03:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="2" sm="80"><nvlink target="0000:02:00.0" count="2" tclass="0x030200"/></gpu>
    </pci>
  </cpu>
</system>)";
  System s = systemFromXml(parseXml(xml));
  EXPECT_EQ(gg(s, 0, 1), PathType::kNvl);
  EXPECT_EQ(s.gpuToGpu(0, 1).nvlinks, 2);
  EXPECT_NEAR(s.gpuToGpu(0, 1).bw, 40.0, 1e-6);
  // 40 GB/s over two NVLink hops beats 24 GB/s through the host bridge.
  EXPECT_EQ(gg(s, 0, 2), PathType::kNvb);
  EXPECT_NEAR(s.gpuToGpu(0, 2).bw, 40.0, 1e-6);
  EXPECT_FALSE(s.hasNvSwitch());
}

TEST(TopoTest, AzureStyleFileWithoutGpuElements) {
  // Azure's published topology files list GPUs and NICs only by PCI class.
  const char* xml = R"(<system version="1">
  <cpu numaid="0" affinity="00ffffff" arch="x86_64" vendor="AuthenticAMD" familyid="23" modelid="49">
    <pci busid="ffff:ff:01.0" class="0x060400" link_speed="16 GT/s" link_width="16">
      <pci busid="0003:00:00.0" class="0x030200" link_speed="16 GT/s" link_width="16"/>
      <pci busid="0103:00:00.0" class="0x020700" link_speed="16 GT/s" link_width="16"/>
      <pci busid="0004:00:00.0" class="0x030200" link_speed="16 GT/s" link_width="16"/>
    </pci>
  </cpu>
</system>)";
  System s = systemFromXml(parseXml(xml));
  ASSERT_EQ(s.gpuCount(), 2);
  EXPECT_EQ(s.gpu(0).busId, "0003:00:00.0");
  EXPECT_EQ(s.gpu(0).sm, 0);
  EXPECT_EQ(s.netCount(), 0);  // the NIC has no <net> until merged with detection
  EXPECT_EQ(gg(s, 0, 1), PathType::kPix);
  // The dump says no more than the file did (no empty <gpu/> or <nic/> NCCL would misread).
  std::string dump = writeXml(systemToXml(s));
  EXPECT_EQ(dump.find("<gpu"), std::string::npos) << dump;
  EXPECT_EQ(dump.find("<nic"), std::string::npos) << dump;
  EXPECT_EQ(systemFromXml(parseXml(dump)).gpuCount(), 2);
}

TEST(TopoTest, DumpKeepsEveryElementWhereTheFileHadIt) {
  // Found by topo_xml_fuzz: a <pci> written inside <nic> was moved up beside it by the
  // dump, where loading the dump back made it a GPU; a GPU below a NIC's <pci> was lost.
  const char* xml = R"(<system version="1">
  <cpu numaid="0" affinity="0000ffff" arch="x86_64" vendor="AuthenticAMD" familyid="25" modelid="1">
    <pci busid="0000:41:00.0" class="0x020700" link_speed="16.0 GT/s PCIe" link_width="16">
      <nic>
        <net name="mlx5_0" dev="0" speed="200000" port="1" gdr="0"/>
        <pci busid="0000:af:00.0" class="0x030200"/>
      </nic>
      <pci busid="0000:42:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16"/>
    </pci>
    <nic>
      <net name="eth0" dev="1" speed="10000"/>
      <pci busid="0000:b0:00.0" class="0x030200"/>
    </nic>
  </cpu>
</system>)";
  System s = systemFromXml(parseXml(xml));
  EXPECT_EQ(s.gpuCount(), 1);  // only the one below the NIC's <pci>; those inside <nic> are not devices
  EXPECT_EQ(s.netCount(), 2);
  const std::string dump = writeXml(systemToXml(s));
  EXPECT_NE(dump.find("0000:af:00.0"), std::string::npos) << dump;
  EXPECT_NE(dump.find("0000:b0:00.0"), std::string::npos) << dump;
  System again = systemFromXml(parseXml(dump));
  EXPECT_EQ(again.gpuCount(), 1) << dump;
  EXPECT_EQ(again.netCount(), 2) << dump;
  EXPECT_EQ(writeXml(systemToXml(again)), dump);
}

TEST(TopoTest, DumpRoundTripsEveryFixture) {
  for (const char* f : {"dgx_h100.xml", "dgx_a100.xml", "pcie8_2socket.xml", "workstation_2gpu.xml", "cpu_only.xml"}) {
    SCOPED_TRACE(f);
    XmlNode original = readXmlFile(test::fixture(f));
    System a = systemFromXml(original);
    std::string dump = writeXml(systemToXml(a));
    // The fixtures are written in Loom's own dump layout, so the dump reproduces them.
    EXPECT_EQ(dump, writeXml(original));
    System b = systemFromXml(parseXml(dump));
    ASSERT_EQ(b.gpuCount(), a.gpuCount());
    ASSERT_EQ(b.netCount(), a.netCount());
    for (int x = 0; x < a.gpuCount(); ++x) {
      EXPECT_EQ(b.railOf(x), a.railOf(x));
      for (int y = 0; y < a.gpuCount(); ++y) EXPECT_EQ(gg(b, x, y), gg(a, x, y));
      for (int y = 0; y < a.netCount(); ++y) EXPECT_EQ(gn(b, x, y), gn(a, x, y));
    }
  }
}

TEST(TopoTest, MergeKeepsTheFileAndAddsWhatDetectionFound) {
  XmlNode file = parseXml(R"(<system version="1">
  <cpu numaid="0" affinity="ff">
    <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="8"/>
  </cpu>
</system>)");
  XmlNode detected = parseXml(R"(<system version="1">
  <cpu numaid="0" affinity="0f" arch="x86_64" vendor="GenuineIntel">
    <pci busid="0000:00:01.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="90"><nvlink target="0000:05:00.0" count="18" tclass="0x068000"/></gpu>
      </pci>
    </pci>
    <pci busid="0000:02:00.0" class="0x020000" link_speed="16.0 GT/s PCIe" link_width="16">
      <nic><net name="eth0" speed="100000" port="0" guid="0x0"/></nic>
    </pci>
  </cpu>
</system>)");
  XmlNode merged = mergeXml(file, detected);
  const XmlNode& cpu = merged.children()[0];
  EXPECT_EQ(cpu.attrOr("affinity", ""), "ff");       // the file wins
  EXPECT_EQ(cpu.attrOr("vendor", ""), "GenuineIntel");  // detection fills the gaps
  System s = systemFromXml(merged);
  ASSERT_EQ(s.gpuCount(), 1);
  EXPECT_EQ(s.gpu(0).sm, 90);
  EXPECT_NEAR(s.gpu(0).pciLinkBw, 12.0, 1e-6);  // file's x8 kept over detected x16
  EXPECT_TRUE(s.hasNvSwitch());
  ASSERT_EQ(s.netCount(), 1);
  EXPECT_EQ(s.net(0).netName, "eth0");
  // The GPU stays where the file put it (under the CPU), not under the detected bridge.
  EXPECT_EQ(s.node(s.gpu(0).parent).type, NodeType::kCpu);
}

TEST(TopoTest, RejectsMalformedTopologies) {
  auto err = [](const char* xml) -> std::string {
    try {
      systemFromXml(parseXml(xml));
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Code::kInvalidArgument);
      return e.what();
    }
    return "(loaded)";
  };
  EXPECT_NE(err("<system><cpu numaid=\"0\"/></system>").find("version"), std::string::npos);
  EXPECT_NE(err("<topology version=\"1\"/>").find("root"), std::string::npos);
  EXPECT_NE(err(R"(<system version="1"><cpu numaid="0"><pci busid="zz:01"/></cpu></system>)").find("zz:01"),
            std::string::npos);
  EXPECT_NE(err(R"(<system version="1"><cpu numaid="0"><pci busid="0000:01:00.0"/>
                 <pci busid="0000:01:00.0"/></cpu></system>)").find("twice"),
            std::string::npos);
  EXPECT_NE(err(R"(<system version="1"><cpu numaid="0"/><cpu numaid="0"/></system>)").find("twice"),
            std::string::npos);
  EXPECT_NE(err(R"(<system version="1"><cpu numaid="0"><pci busid="0000:01:00.0" class="0x030200">
                 <gpu sm="90"><nvlink target="0000:05:00.0" count="0"/></gpu></pci></cpu></system>)").find("count"),
            std::string::npos);
  EXPECT_NE(err(R"(<system version="1"><cpu numaid="0"><nic><net speed="1"/></nic></cpu></system>)").find("no name"),
            std::string::npos);
}

TEST(TopoTest, PathTypeNames) {
  EXPECT_STREQ(pathTypeName(PathType::kNvb), "NVB");
  EXPECT_EQ(parsePathType("pxb"), PathType::kPxb);
  EXPECT_THROW(parsePathType("NODE"), Error);
  std::string bus;
  EXPECT_TRUE(normalizeBusId("00000000:1A:00.0", &bus));
  EXPECT_EQ(bus, "0000:1a:00.0");
  EXPECT_FALSE(normalizeBusId("fffffff:ff:ff.0", &bus));  // NVSwitch fabric id, not PCI
  EXPECT_NEAR(pciBw("32.0 GT/s PCIe", 16), 48.0, 1e-9);
  EXPECT_NEAR(pciBw("8 GT/s", 0), 12.0, 1e-9);  // width 0 (unreported) counts as x16
}

}  // namespace
}  // namespace loom::topo
