// A small, length-checked XML reader and writer for topology files (NCCL's
// `<system version="1">` format). It understands exactly what those files use: elements,
// attributes in single or double quotes, the five predefined entities and numeric
// character references, comments, an `<?xml ...?>` prolog and a DOCTYPE line. Text
// content is ignored. Every limit below is enforced, so a hostile or truncated file ends
// in a loom::Error naming the line and column, never in a crash (tests/topo/xml_fuzz.cc).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::topo {

struct XmlLimits {
  size_t maxInputBytes = 16u << 20;
  int maxDepth = 64;
  size_t maxElements = 1u << 16;
  size_t maxAttributes = 64;  // per element
  size_t maxNameBytes = 64;
  size_t maxValueBytes = 4096;
};

class XmlNode {
 public:
  XmlNode() = default;
  explicit XmlNode(std::string name) : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  void setName(std::string name) { name_ = std::move(name); }

  // Attributes keep their file order, so a file read and written back reads the same.
  const std::vector<std::pair<std::string, std::string>>& attrs() const { return attrs_; }
  const std::string* attr(std::string_view key) const;
  std::string attrOr(std::string_view key, std::string_view fallback) const;
  bool has(std::string_view key) const { return attr(key) != nullptr; }
  void set(std::string_view key, std::string value);  // replaces in place or appends
  void setIfUnset(std::string_view key, const std::string& value);
  void erase(std::string_view key);

  // Integer/float accessors throw kInvalidArgument naming element and attribute when the
  // text is not a number; absent attributes give the fallback.
  long long intAttr(std::string_view key, long long fallback) const;
  double doubleAttr(std::string_view key, double fallback) const;

  const std::vector<XmlNode>& children() const { return children_; }
  std::vector<XmlNode>& children() { return children_; }
  XmlNode& addChild(std::string name);
  XmlNode& addChild(XmlNode child);
  // First child with this name (and, if given, attribute key == value); nullptr if none.
  const XmlNode* child(std::string_view name) const;
  XmlNode* child(std::string_view name);
  XmlNode* childWith(std::string_view name, std::string_view key, std::string_view value);

 private:
  std::string name_;
  std::vector<std::pair<std::string, std::string>> attrs_;
  std::vector<XmlNode> children_;
};

// Parses one document; throws loom::Error(kInvalidArgument, "XML line L col C: ...").
XmlNode parseXml(std::string_view text, const XmlLimits& limits = {});

// Writes the tree with two-space indentation and self-closing empty elements, the layout
// NCCL_TOPO_DUMP_FILE produces.
std::string writeXml(const XmlNode& root);

// Reads a whole file (bounded by limits.maxInputBytes) and parses it; errors name the file.
XmlNode readXmlFile(const std::string& path, const XmlLimits& limits = {});

}  // namespace loom::topo
