#include "bench/common/split.h"

#include <strings.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "bench/common/bench_error.h"

namespace loom::bench {
namespace {

// A whole integer (base 0: decimal, 0x hex, 0 octal), blanks around it allowed.
bool parseLong(const char* s, int base, long* out) {
  char* end = nullptr;
  errno = 0;
  long v = strtol(s, &end, base);
  if (errno != 0 || end == s) return false;
  while (*end == ' ' || *end == '\t') ++end;
  if (*end != '\0') return false;
  *out = v;
  return true;
}

}  // namespace

int TestSplit::colorOf(int proc) const {
  switch (op) {
    case '&': return static_cast<int>(proc & value);
    case '|': return static_cast<int>(proc | value);
    case '%': return static_cast<int>(proc % value);
    case '/': return static_cast<int>(proc / value);
    default: return 0;
  }
}

std::vector<int> TestSplit::groupSizes(int nProcs) const {
  std::map<int, int> count;
  for (int p = 0; p < nProcs; ++p) ++count[colorOf(p)];
  std::vector<int> sizes;
  for (const auto& [color, n] : count) sizes.push_back(n);
  return sizes;
}

TestSplit parseTestSplit() {
  TestSplit t;
  if (const char* mask = getenv("NCCL_TESTS_SPLIT_MASK"); mask && *mask) {
    t.spec = std::string("NCCL_TESTS_SPLIT_MASK=") + mask;
    if (!parseLong(mask, 16, &t.value) || t.value < 0)
      benchFail(Status::kInvalidUsage, "%s: expected a hexadecimal mask (0x7)", t.spec.c_str());
    t.op = '&';
    return t;
  }
  const char* spec = getenv("NCCL_TESTS_SPLIT");
  if (!spec || !*spec) return t;
  t.spec = std::string("NCCL_TESTS_SPLIT=") + spec;
  static const struct {
    const char* word;
    char op;
  } kOps[] = {{"AND", '&'}, {"&", '&'}, {"OR", '|'}, {"|", '|'},
              {"MOD", '%'}, {"%", '%'}, {"DIV", '/'}, {"/", '/'}};
  const char* s = spec;
  while (*s == ' ' || *s == '\t') ++s;
  for (const auto& k : kOps) {
    if (strncasecmp(s, k.word, strlen(k.word)) != 0) continue;
    if (parseLong(s + strlen(k.word), 0, &t.value) && t.value >= 0 &&
        !((k.op == '%' || k.op == '/') && t.value == 0)) {
      t.op = k.op;
      return t;
    }
    break;
  }
  benchFail(Status::kInvalidUsage,
            "%s: expected AND, OR, MOD or DIV (or &, |, %%, /) and a non-negative integer, "
            "not 0 for MOD and DIV (\"MOD 8\": one group per local rank of 8-GPU hosts)",
            t.spec.c_str());
}

}  // namespace loom::bench
