// loom-doctor's output: one line per check (text), or one JSON document with the same
// facts plus the machine-readable ones.
#include <cmath>
#include <cstdio>

#include "base/error.h"
#include "base/host.h"
#include "doctor.h"
#include "loom/loom.h"

namespace loom::doctor {

const char* statusName(Status s) {
  switch (s) {
    case Status::kPass: return "PASS";
    case Status::kWarn: return "WARN";
    case Status::kFail: return "FAIL";
    case Status::kSkip: return "SKIP";
  }
  return "?";
}

std::string jsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return strprintf("%.0f", v);
  return strprintf("%.6g", v);
}

std::string jsonBool(bool v) { return v ? "true" : "false"; }

std::string humanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return b == std::floor(b) ? strprintf("%.0f %s", b, units[u]) : strprintf("%.1f %s", b, units[u]);
}

namespace {

int count(const std::vector<Check>& checks, Status s) {
  int n = 0;
  for (const Check& c : checks) n += c.status == s;
  return n;
}

}  // namespace

void printText(FILE* out, const std::vector<Check>& checks, bool verbose) {
  fprintf(out, "loom-doctor: Loom %s on %s\n", LOOM_VERSION_STRING, hostName().c_str());
  for (const Check& c : checks) {
    fprintf(out, "%s  %-12s %s", statusName(c.status), c.name.c_str(), c.found.c_str());
    if (!c.fix.empty() && (c.status == Status::kWarn || c.status == Status::kFail))
      fprintf(out, "  => fix: %s", c.fix.c_str());
    fputc('\n', out);
    if (verbose)
      for (const std::string& line : c.detail) fprintf(out, "      %s\n", line.c_str());
  }
  fprintf(out, "%d PASS, %d WARN, %d FAIL, %d SKIP\n", count(checks, Status::kPass), count(checks, Status::kWarn),
          count(checks, Status::kFail), count(checks, Status::kSkip));
}

void printJson(FILE* out, const std::vector<Check>& checks) {
  fprintf(out, "{\"version\":%s,\"host\":%s,\"checks\":[", jsonString(LOOM_VERSION_STRING).c_str(),
          jsonString(hostName()).c_str());
  for (size_t i = 0; i < checks.size(); ++i) {
    const Check& c = checks[i];
    fprintf(out, "%s\n  {\"name\":%s,\"status\":%s,\"found\":%s,\"fix\":%s,\"facts\":{", i ? "," : "",
            jsonString(c.name).c_str(), jsonString(statusName(c.status)).c_str(), jsonString(c.found).c_str(),
            jsonString(c.fix).c_str());
    for (size_t f = 0; f < c.facts.size(); ++f)
      fprintf(out, "%s%s:%s", f ? "," : "", jsonString(c.facts[f].first).c_str(), c.facts[f].second.c_str());
    fputs("}}", out);
  }
  fprintf(out, "\n],\"summary\":{\"pass\":%d,\"warn\":%d,\"fail\":%d,\"skip\":%d}}\n", count(checks, Status::kPass),
          count(checks, Status::kWarn), count(checks, Status::kFail), count(checks, Status::kSkip));
}

}  // namespace loom::doctor
