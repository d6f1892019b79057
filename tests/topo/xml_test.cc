#include "topo/xml.h"

#include <gtest/gtest.h>

#include <string>

#include "base/error.h"

namespace loom::topo {
namespace {

std::string errorOf(const std::string& text, const XmlLimits& limits = {}) {
  try {
    parseXml(text, limits);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
    return e.what();
  }
  return "(parsed)";
}

TEST(XmlTest, ParsesNestedElementsAttributesAndSelfClosingTags) {
  XmlNode root = parseXml(
      "<?xml version=\"1.0\"?>\n<!-- NCCL dump -->\n"
      "<system version=\"1\">\n"
      "  <cpu numaid='0' affinity=\"00ff\">\n"
      "    <pci busid=\"0000:18:00.0\" class=\"0x030200\"><gpu dev=\"0\" sm=\"90\"/></pci>\n"
      "    <!-- a comment between siblings -->\n"
      "    <nic><net name=\"mlx5_0\" speed=\"400000\"/></nic>\n"
      "  </cpu>\n"
      "</system>\n");
  EXPECT_EQ(root.name(), "system");
  EXPECT_EQ(root.intAttr("version", 0), 1);
  ASSERT_EQ(root.children().size(), 1u);
  const XmlNode& cpu = root.children()[0];
  EXPECT_EQ(cpu.attrOr("numaid", ""), "0");
  EXPECT_EQ(cpu.attrOr("affinity", ""), "00ff");
  ASSERT_EQ(cpu.children().size(), 2u);
  EXPECT_EQ(cpu.children()[0].child("gpu")->intAttr("sm", 0), 90);
  EXPECT_EQ(cpu.children()[1].child("net")->doubleAttr("speed", 0), 400000.0);
  // Attribute order is the file's.
  EXPECT_EQ(cpu.attrs()[0].first, "numaid");
  EXPECT_EQ(cpu.attrs()[1].first, "affinity");
}

TEST(XmlTest, DecodesEntitiesAndWritesThemBack) {
  XmlNode n = parseXml("<a v=\"x &amp; y &lt;z&gt; &quot;q&quot; &apos;s&apos; &#65;&#x42;\"/>");
  EXPECT_EQ(n.attrOr("v", ""), "x & y <z> \"q\" 's' AB");
  std::string out = writeXml(n);
  EXPECT_EQ(out, "<a v=\"x &amp; y &lt;z&gt; &quot;q&quot; 's' AB\"/>\n");
  EXPECT_EQ(parseXml(out).attrOr("v", ""), n.attrOr("v", ""));
}

TEST(XmlTest, WriterRoundTripsAndIndentsLikeNcclDumps) {
  XmlNode root("system");
  root.set("version", "1");
  XmlNode& cpu = root.addChild("cpu");
  cpu.set("numaid", "0");
  cpu.addChild("pci").set("busid", "0000:01:00.0");
  std::string text = writeXml(root);
  EXPECT_EQ(text,
            "<system version=\"1\">\n"
            "  <cpu numaid=\"0\">\n"
            "    <pci busid=\"0000:01:00.0\"/>\n"
            "  </cpu>\n"
            "</system>\n");
  EXPECT_EQ(writeXml(parseXml(text)), text);
}

TEST(XmlTest, AttributeHelpers) {
  XmlNode n("gpu");
  n.set("dev", "3");
  n.set("sm", "0x5a");
  n.set("bad", "12x");
  EXPECT_EQ(n.intAttr("dev", -1), 3);
  EXPECT_EQ(n.intAttr("sm", -1), 90);
  EXPECT_EQ(n.intAttr("missing", -7), -7);
  EXPECT_THROW(n.intAttr("bad", 0), Error);
  n.setIfUnset("dev", "9");
  EXPECT_EQ(n.intAttr("dev", -1), 3);
  n.set("dev", "4");
  EXPECT_EQ(n.intAttr("dev", -1), 4);
  EXPECT_EQ(n.attrs().size(), 3u);  // replaced in place, not appended
  n.erase("bad");
  EXPECT_FALSE(n.has("bad"));
}

TEST(XmlTest, ErrorsNameTheLineAndTheProblem) {
  EXPECT_NE(errorOf("<a>\n<b>\n</c>\n</a>").find("line 3"), std::string::npos);
  EXPECT_NE(errorOf("<a>\n<b>\n</c>\n</a>").find("</c> closes <b>"), std::string::npos);
  EXPECT_NE(errorOf("<a x=\"1\" x=\"2\"/>").find("repeated"), std::string::npos);
  EXPECT_NE(errorOf("<a x=\"1/>").find("unterminated"), std::string::npos);
  EXPECT_NE(errorOf("<a x=1/>").find("quoted"), std::string::npos);
  EXPECT_NE(errorOf("<a x=\"&bogus;\"/>").find("unknown entity"), std::string::npos);
  EXPECT_NE(errorOf("<a x=\"&#200;\"/>").find("ASCII"), std::string::npos);
  EXPECT_NE(errorOf("<a/><b/>").find("after the root"), std::string::npos);
  EXPECT_NE(errorOf("<a>").find("missing </a>"), std::string::npos);
  EXPECT_NE(errorOf("").find("root element"), std::string::npos);
  EXPECT_NE(errorOf("<a x=\"1\"y=\"2\"/>").find("whitespace"), std::string::npos);
  EXPECT_NE(errorOf("<!-- never closed").find("comment"), std::string::npos);
  EXPECT_NE(errorOf("<1a/>").find("element name"), std::string::npos);
}

TEST(XmlTest, EnforcesLimits) {
  XmlLimits limits;
  limits.maxDepth = 3;
  EXPECT_EQ(errorOf("<a><b><c/></b></a>", limits), "(parsed)");
  EXPECT_NE(errorOf("<a><b><c><d/></c></b></a>", limits).find("deeper than 3"), std::string::npos);
  limits = {};
  limits.maxElements = 3;
  EXPECT_NE(errorOf("<a><b/><c/><d/></a>", limits).find("more than 3 elements"), std::string::npos);
  limits = {};
  limits.maxValueBytes = 4;
  EXPECT_NE(errorOf("<a v=\"12345\"/>", limits).find("longer than 4"), std::string::npos);
  limits = {};
  limits.maxAttributes = 2;
  EXPECT_NE(errorOf("<a x=\"1\" y=\"2\" z=\"3\"/>", limits).find("more than 2 attributes"), std::string::npos);
  limits = {};
  limits.maxInputBytes = 8;
  EXPECT_NE(errorOf("<abcdefgh/>", limits).find("limit"), std::string::npos);
  // Deep nesting from a hostile file stops at the default limit instead of the stack.
  std::string deep;
  for (int i = 0; i < 10000; ++i) deep += "<a>";
  EXPECT_NE(errorOf(deep).find("deeper than"), std::string::npos);
}

TEST(XmlTest, ReadFileNamesTheFile) {
  try {
    readXmlFile("/nonexistent/topo.xml");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kSystemError);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/topo.xml"), std::string::npos);
  }
}

}  // namespace
}  // namespace loom::topo
