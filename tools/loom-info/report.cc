// loom-info's two output forms. The text is for people (aligned table, help under each
// knob); the JSON carries the same facts for scripts.
#include <algorithm>
#include <cinttypes>
#include <string>

#include "info.h"

namespace loom::info {
namespace {

constexpr const char* kInvalidMarker = " (INVALID)";

// A value as the table shows it: empty strings are visible, malformed ones are flagged.
std::string shownValue(const KnobInfo& k) {
  std::string v = k.value.empty() ? "\"\"" : k.value;
  return k.valid ? v : v + kInvalidMarker;
}

std::string runtimeText(const FeatureInfo& f) {
  if (!f.available) return "not found";
  std::string s = "found";
  if (!f.path.empty()) s += " " + f.path;
  if (!f.detail.empty()) s += " (" + f.detail + ")";
  // The file is looked up apart from loomGetFeatures' own probe; say so if only it saw one.
  if (f.path.empty() && f.detail.empty()) s += " (library path unknown)";
  return s;
}

void printFeatures(FILE* out, const Info& info) {
  fprintf(out, "Features:\n");
  size_t w = 0;
  for (const FeatureInfo& f : info.features) w = std::max(w, std::string(f.name).size());
  for (const FeatureInfo& f : info.features) {
    fprintf(out, "  %-*s  compiled: %-3s  runtime: %s\n", static_cast<int>(w), f.name,
            f.compiled ? "yes" : "no", runtimeText(f).c_str());
    if (!f.available && !f.detail.empty()) fprintf(out, "  %*s  (%s)\n", static_cast<int>(w), "", f.detail.c_str());
  }
  std::string supported;
  for (const std::string& s : info.cpuIsasSupported) supported += (supported.empty() ? "" : ", ") + s;
  fprintf(out, "  CPU reduction ISA: %s (this CPU supports: %s; LOOM_CPU_ISA overrides)\n",
          info.cpuIsa.c_str(), supported.c_str());
}

void printNetwork(FILE* out, const Info& info) {
  fprintf(out, "\nNetwork:\n");
  if (info.bootstrapOk)
    fprintf(out, "  bootstrap interface: %s %s\n", info.bootstrap.name.c_str(),
            info.bootstrap.address.c_str());
  else
    fprintf(out, "  bootstrap interface: none: %s\n", info.bootstrapError.c_str());
  fprintf(out, "  interfaces up here:");
  if (info.interfaces.empty()) fprintf(out, " none");
  for (const InterfaceInfo& i : info.interfaces) fprintf(out, " %s=%s", i.name.c_str(), i.address.c_str());
  fprintf(out, "\n  RDMA ports:");
  if (info.rdmaPorts.empty()) fprintf(out, " none");
  for (size_t i = 0; i < info.rdmaPorts.size(); ++i)
    fprintf(out, "%s %s", i ? "," : "", info.rdmaPorts[i].c_str());
  if (!info.rdmaNote.empty()) fprintf(out, " (%s)", info.rdmaNote.c_str());
  fprintf(out, "\n  host: %s  id: %s  hash: 0x%016" PRIx64 "\n", info.hostName.c_str(),
          info.hostId.c_str(), info.hostHash);
}

void printKnobTable(FILE* out, const std::vector<KnobInfo>& knobs) {
  size_t wName = 4, wAlias = 10, wValue = 5;
  for (const KnobInfo& k : knobs) {
    wName = std::max(wName, k.name.size());
    wAlias = std::max(wAlias, k.alias.size());
    wValue = std::max(wValue, shownValue(k).size());
  }
  // A very long value (a path list, say) should not push every row off the screen.
  wValue = std::min<size_t>(wValue, 32);
  fprintf(out, "%-*s  %-*s  %-*s  %s\n", static_cast<int>(wName), "NAME", static_cast<int>(wAlias),
          "NCCL ALIAS", static_cast<int>(wValue), "VALUE", "SOURCE");
  for (const KnobInfo& k : knobs) {
    std::string source = k.source;
    if (k.source != "default") source += " (default " + (k.def.empty() ? std::string("\"\"") : k.def) + ")";
    fprintf(out, "%-*s  %-*s  %-*s  %s\n", static_cast<int>(wName), k.name.c_str(),
            static_cast<int>(wAlias), k.alias.empty() ? "-" : k.alias.c_str(),
            static_cast<int>(wValue), shownValue(k).c_str(), source.c_str());
    fprintf(out, "    %s\n", k.help.c_str());
    if (k.jobWide) fprintf(out, "    job-wide: where it applies, every rank of a communicator must have the same value (the init checks)\n");
    if (!k.valid) fprintf(out, "    error: %s\n", k.error.c_str());
  }
}

// JSON string escaping per RFC 8259: quotes, backslashes and control characters.
std::string q(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      case '\r': o += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          snprintf(buf, sizeof(buf), "\\u%04x", c);
          o += buf;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  return o + "\"";
}

const char* b(bool v) { return v ? "true" : "false"; }

std::string knobJson(const KnobInfo& k) {
  std::string s = "{\"name\": " + q(k.name) + ", \"alias\": " + q(k.alias) + ", \"type\": " +
                  q(k.type) + ", \"default\": " + q(k.def) + ", \"value\": " + q(k.value) +
                  ", \"source\": " + q(k.source) + ", \"valid\": " + b(k.valid) +
                  ", \"jobWide\": " + b(k.jobWide);
  if (!k.valid) s += ", \"error\": " + q(k.error);
  return s + ", \"help\": " + q(k.help) + "}";
}

std::string interfaceJson(const InterfaceInfo& i) {
  return "{\"name\": " + q(i.name) + ", \"address\": " + q(i.address) + "}";
}

}  // namespace

void printText(FILE* out, const Info& info) {
  fprintf(out, "Loom %s (implements the NCCL %s API)\n\n", info.version.c_str(),
          info.ncclVersion.c_str());
  printFeatures(out, info);
  printNetwork(out, info);
  fprintf(out, "\nKnobs (%zu; LOOM_* or the NCCL alias sets each, LOOM_* wins):\n", info.knobs.size());
  printKnobTable(out, info.knobs);
  if (int n = info.invalidKnobs())
    fprintf(out, "\n%d knob%s ha%s a malformed value (marked INVALID above)\n", n, n == 1 ? "" : "s",
            n == 1 ? "s" : "ve");
}

void printJson(FILE* out, const Info& info) {
  fprintf(out, "{\n  \"version\": %s,\n  \"ncclVersion\": %s,\n  \"ncclVersionCode\": %d,\n",
          q(info.version).c_str(), q(info.ncclVersion).c_str(), info.ncclVersionCode);
  fprintf(out, "  \"features\": [\n");
  for (size_t i = 0; i < info.features.size(); ++i) {
    const FeatureInfo& f = info.features[i];
    fprintf(out, "    {\"name\": %s, \"key\": %s, \"compiled\": %s, \"available\": %s, \"path\": %s, \"detail\": %s}%s\n",
            q(f.name).c_str(), q(f.key).c_str(), b(f.compiled), b(f.available),
            q(f.path).c_str(), q(f.detail).c_str(), i + 1 < info.features.size() ? "," : "");
  }
  fprintf(out, "  ],\n  \"cpuIsa\": %s,\n  \"cpuIsasSupported\": [", q(info.cpuIsa).c_str());
  for (size_t i = 0; i < info.cpuIsasSupported.size(); ++i)
    fprintf(out, "%s%s", i ? ", " : "", q(info.cpuIsasSupported[i]).c_str());
  fprintf(out, "],\n  \"network\": {\"bootstrapInterface\": %s, ",
          info.bootstrapOk ? interfaceJson(info.bootstrap).c_str() : "null");
  if (!info.bootstrapOk) fprintf(out, "\"bootstrapError\": %s, ", q(info.bootstrapError).c_str());
  fprintf(out, "\"interfaces\": [");
  for (size_t i = 0; i < info.interfaces.size(); ++i)
    fprintf(out, "%s%s", i ? ", " : "", interfaceJson(info.interfaces[i]).c_str());
  fprintf(out, "], \"rdmaPorts\": [");
  for (size_t i = 0; i < info.rdmaPorts.size(); ++i)
    fprintf(out, "%s%s", i ? ", " : "", q(info.rdmaPorts[i]).c_str());
  fprintf(out, "], \"rdmaNote\": %s", q(info.rdmaNote).c_str());
  // The hash as a string: JSON numbers above 2^53 lose bits in most parsers.
  fprintf(out, "},\n  \"host\": {\"name\": %s, \"id\": %s, \"hash\": \"0x%016" PRIx64 "\"},\n",
          q(info.hostName).c_str(), q(info.hostId).c_str(), info.hostHash);
  fprintf(out, "  \"invalidKnobs\": %d,\n  \"knobs\": [\n", info.invalidKnobs());
  for (size_t i = 0; i < info.knobs.size(); ++i)
    fprintf(out, "    %s%s\n", knobJson(info.knobs[i]).c_str(), i + 1 < info.knobs.size() ? "," : "");
  fprintf(out, "  ]\n}\n");
}

void printKnobText(FILE* out, const KnobInfo& k) {
  fprintf(out, "%s\n", k.name.c_str());
  fprintf(out, "  NCCL alias: %s\n", k.alias.empty() ? "-" : k.alias.c_str());
  fprintf(out, "  type:       %s\n", k.type.c_str());
  fprintf(out, "  default:    %s\n", k.def.empty() ? "\"\"" : k.def.c_str());
  fprintf(out, "  value:      %s\n", shownValue(k).c_str());
  if (!k.valid) fprintf(out, "  error:      %s\n", k.error.c_str());
  fprintf(out, "  source:     %s\n", k.source.c_str());
  fprintf(out, "  help:       %s\n", k.help.c_str());
}

void printKnobJson(FILE* out, const KnobInfo& k) { fprintf(out, "%s\n", knobJson(k).c_str()); }

}  // namespace loom::info
