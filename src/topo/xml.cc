#include "topo/xml.h"

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "base/error.h"

namespace loom::topo {

// ---- XmlNode ----

const std::string* XmlNode::attr(std::string_view key) const {
  for (const auto& [k, v] : attrs_)
    if (k == key) return &v;
  return nullptr;
}

std::string XmlNode::attrOr(std::string_view key, std::string_view fallback) const {
  const std::string* v = attr(key);
  return v ? *v : std::string(fallback);
}

void XmlNode::set(std::string_view key, std::string value) {
  for (auto& [k, v] : attrs_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  attrs_.emplace_back(std::string(key), std::move(value));
}

void XmlNode::setIfUnset(std::string_view key, const std::string& value) {
  if (!has(key)) set(key, value);
}

void XmlNode::erase(std::string_view key) {
  for (auto it = attrs_.begin(); it != attrs_.end(); ++it) {
    if (it->first == key) {
      attrs_.erase(it);
      return;
    }
  }
}

long long XmlNode::intAttr(std::string_view key, long long fallback) const {
  const std::string* v = attr(key);
  if (!v || v->empty()) return fallback;
  errno = 0;
  char* end = nullptr;
  long long x = strtoll(v->c_str(), &end, 0);
  if (errno != 0 || end == v->c_str() || *end != '\0')
    LOOM_THROW(kInvalidArgument, "<%s %.*s=\"%s\">: not an integer", name_.c_str(),
               static_cast<int>(key.size()), key.data(), v->c_str());
  return x;
}

double XmlNode::doubleAttr(std::string_view key, double fallback) const {
  const std::string* v = attr(key);
  if (!v || v->empty()) return fallback;
  errno = 0;
  char* end = nullptr;
  double x = strtod(v->c_str(), &end);
  if (errno != 0 || end == v->c_str() || *end != '\0')
    LOOM_THROW(kInvalidArgument, "<%s %.*s=\"%s\">: not a number", name_.c_str(),
               static_cast<int>(key.size()), key.data(), v->c_str());
  return x;
}

XmlNode& XmlNode::addChild(std::string name) {
  children_.emplace_back(std::move(name));
  return children_.back();
}

XmlNode& XmlNode::addChild(XmlNode child) {
  children_.push_back(std::move(child));
  return children_.back();
}

const XmlNode* XmlNode::child(std::string_view name) const {
  for (const XmlNode& c : children_)
    if (c.name_ == name) return &c;
  return nullptr;
}

XmlNode* XmlNode::child(std::string_view name) {
  for (XmlNode& c : children_)
    if (c.name_ == name) return &c;
  return nullptr;
}

XmlNode* XmlNode::childWith(std::string_view name, std::string_view key, std::string_view value) {
  for (XmlNode& c : children_) {
    if (c.name_ != name) continue;
    const std::string* v = c.attr(key);
    if (v && *v == value) return &c;
  }
  return nullptr;
}

// ---- parser ----

namespace {

bool isSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool isNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool isNameChar(char c) {
  return isNameStart(c) || (c >= '0' && c <= '9') || c == '-' || c == '.';
}

class Parser {
 public:
  Parser(std::string_view text, const XmlLimits& limits) : s_(text), limits_(limits) {}

  XmlNode document() {
    if (s_.size() > limits_.maxInputBytes)
      fail("document is %zu bytes, over the %zu-byte limit", s_.size(), limits_.maxInputBytes);
    skipMisc();
    if (pos_ < s_.size() && startsWith("<!DOCTYPE")) {
      skipPast(">", "DOCTYPE");
      skipMisc();
    }
    if (pos_ >= s_.size() || s_[pos_] != '<') fail("expected the root element");
    XmlNode root;
    element(root, 1);
    skipMisc();
    if (pos_ != s_.size()) fail("content after the root element");
    return root;
  }

 private:
  [[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    va_list ap;
    va_start(ap, fmt);
    std::string what = vstrprintf(fmt, ap);
    va_end(ap);
    LOOM_THROW(kInvalidArgument, "XML line %d col %d: %s", line, col, what.c_str());
  }

  bool startsWith(std::string_view p) const { return s_.substr(pos_, p.size()) == p; }

  void skipPast(std::string_view end, const char* what) {
    size_t at = s_.find(end, pos_);
    if (at == std::string_view::npos) fail("unterminated %s", what);
    pos_ = at + end.size();
  }

  void skipSpace() {
    while (pos_ < s_.size() && isSpace(s_[pos_])) ++pos_;
  }

  // Whitespace, comments and processing instructions between elements.
  void skipMisc() {
    for (;;) {
      skipSpace();
      if (startsWith("<!--")) {
        pos_ += 4;
        skipPast("-->", "comment");
      } else if (startsWith("<?")) {
        pos_ += 2;
        skipPast("?>", "processing instruction");
      } else {
        return;
      }
    }
  }

  std::string name(const char* what) {
    size_t start = pos_;
    if (pos_ >= s_.size() || !isNameStart(s_[pos_])) fail("expected %s name", what);
    while (pos_ < s_.size() && isNameChar(s_[pos_])) {
      ++pos_;
      if (pos_ - start > limits_.maxNameBytes)
        fail("%s name longer than %zu bytes", what, limits_.maxNameBytes);
    }
    return std::string(s_.substr(start, pos_ - start));
  }

  void appendEntity(std::string& out) {
    size_t semi = s_.find(';', pos_);
    if (semi == std::string_view::npos || semi - pos_ > 10) fail("malformed entity reference");
    std::string_view ent = s_.substr(pos_ + 1, semi - pos_ - 1);
    if (ent == "amp") out += '&';
    else if (ent == "lt") out += '<';
    else if (ent == "gt") out += '>';
    else if (ent == "quot") out += '"';
    else if (ent == "apos") out += '\'';
    else if (ent.size() >= 2 && ent[0] == '#') {
      bool hex = ent[1] == 'x' || ent[1] == 'X';
      std::string digits(ent.substr(hex ? 2 : 1));
      char* end = nullptr;
      long code = digits.empty() ? -1 : strtol(digits.c_str(), &end, hex ? 16 : 10);
      // Topology files are ASCII; anything else in a reference is refused, not guessed.
      if (digits.empty() || *end != '\0' || code <= 0 || code > 127)
        fail("character reference &%.*s; is not printable ASCII", static_cast<int>(ent.size()),
             ent.data());
      out += static_cast<char>(code);
    } else {
      fail("unknown entity &%.*s;", static_cast<int>(ent.size()), ent.data());
    }
    pos_ = semi + 1;
  }

  std::string quoted() {
    if (pos_ >= s_.size() || (s_[pos_] != '"' && s_[pos_] != '\'')) fail("expected a quoted value");
    char quote = s_[pos_++];
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) fail("unterminated attribute value");
      char c = s_[pos_];
      if (c == quote) {
        ++pos_;
        return out;
      }
      if (c == '<') fail("'<' inside an attribute value");
      if (c == '&') {
        appendEntity(out);
      } else {
        out += c;
        ++pos_;
      }
      if (out.size() > limits_.maxValueBytes)
        fail("attribute value longer than %zu bytes", limits_.maxValueBytes);
    }
  }

  void element(XmlNode& node, int depth) {
    if (depth > limits_.maxDepth) fail("elements nested deeper than %d", limits_.maxDepth);
    if (++elements_ > limits_.maxElements) fail("more than %zu elements", limits_.maxElements);
    ++pos_;  // '<'
    node.setName(name("element"));
    for (;;) {
      size_t before = pos_;
      skipSpace();
      if (pos_ >= s_.size()) fail("unterminated <%s>", node.name().c_str());
      if (s_[pos_] == '/') {
        ++pos_;
        if (pos_ >= s_.size() || s_[pos_] != '>') fail("expected '>' after '/'");
        ++pos_;
        return;
      }
      if (s_[pos_] == '>') {
        ++pos_;
        break;
      }
      if (pos_ == before) fail("expected whitespace before an attribute");
      std::string key = name("attribute");
      skipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '=') fail("expected '=' after %s", key.c_str());
      ++pos_;
      skipSpace();
      std::string value = quoted();
      if (node.has(key)) fail("attribute %s repeated in <%s>", key.c_str(), node.name().c_str());
      if (node.attrs().size() >= limits_.maxAttributes)
        fail("more than %zu attributes in <%s>", limits_.maxAttributes, node.name().c_str());
      node.set(key, std::move(value));
    }
    // Content: child elements, comments and ignored text, up to the matching end tag.
    for (;;) {
      if (pos_ >= s_.size()) fail("missing </%s>", node.name().c_str());
      if (startsWith("<!--")) {
        pos_ += 4;
        skipPast("-->", "comment");
      } else if (startsWith("<?")) {
        pos_ += 2;
        skipPast("?>", "processing instruction");
      } else if (startsWith("</")) {
        pos_ += 2;
        std::string end = name("end tag");
        if (end != node.name())
          fail("</%s> closes <%s>", end.c_str(), node.name().c_str());
        skipSpace();
        if (pos_ >= s_.size() || s_[pos_] != '>') fail("expected '>' in </%s>", end.c_str());
        ++pos_;
        return;
      } else if (s_[pos_] == '<') {
        element(node.addChild(""), depth + 1);
      } else if (s_[pos_] == '&') {
        std::string ignored;
        appendEntity(ignored);
      } else {
        ++pos_;
      }
    }
  }

  std::string_view s_;
  const XmlLimits& limits_;
  size_t pos_ = 0;
  size_t elements_ = 0;
};

void escapeInto(std::string& out, const std::string& v) {
  for (char c : v) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
}

void writeNode(std::string& out, const XmlNode& n, int depth) {
  out.append(static_cast<size_t>(depth) * 2, ' ');
  out += '<';
  out += n.name();
  for (const auto& [k, v] : n.attrs()) {
    out += ' ';
    out += k;
    out += "=\"";
    escapeInto(out, v);
    out += '"';
  }
  if (n.children().empty()) {
    out += "/>\n";
    return;
  }
  out += ">\n";
  for (const XmlNode& c : n.children()) writeNode(out, c, depth + 1);
  out.append(static_cast<size_t>(depth) * 2, ' ');
  out += "</";
  out += n.name();
  out += ">\n";
}

}  // namespace

XmlNode parseXml(std::string_view text, const XmlLimits& limits) {
  return Parser(text, limits).document();
}

std::string writeXml(const XmlNode& root) {
  std::string out;
  writeNode(out, root, 0);
  return out;
}

XmlNode readXmlFile(const std::string& path, const XmlLimits& limits) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(fopen(path.c_str(), "rb"), fclose);
  if (!f) throwErrno("cannot open topology file %s", path.c_str());
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f.get())) > 0) {
    text.append(buf, n);
    if (text.size() > limits.maxInputBytes)
      LOOM_THROW(kInvalidArgument, "topology file %s is larger than %zu bytes", path.c_str(),
                 limits.maxInputBytes);
  }
  if (ferror(f.get())) throwErrno("cannot read topology file %s", path.c_str());
  try {
    return parseXml(text, limits);
  } catch (const Error& e) {
    LOOM_THROW(kInvalidArgument, "topology file %s: %s", path.c_str(), e.what());
  }
}

}  // namespace loom::topo
