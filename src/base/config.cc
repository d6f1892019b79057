#include "base/config.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace loom {
namespace {
std::vector<const KnobBase*>& registry() {
  static std::vector<const KnobBase*> knobs;
  return knobs;
}

// The variable a malformed value came from: a user who set NCCL_X must see NCCL_X.
std::string origin(const KnobBase& k) {
  std::string src = k.source();
  return src.rfind("env ", 0) == 0 ? src.substr(4) : k.name();
}
}  // namespace

KnobBase::KnobBase(const char* name, const char* alias, KnobType type, std::string def,
                   const char* help, KnobScope scope)
    : name_(name), alias_(alias ? alias : ""), type_(type), def_(std::move(def)), help_(help),
      scope_(scope) {
  registry().push_back(this);
}

const char* KnobBase::lookup(const char** from) const {
  if (const char* v = getenv(name_); v && *v) {
    *from = name_;
    return v;
  }
  if (*alias_) {
    if (const char* v = getenv(alias_); v && *v) {
      *from = alias_;
      return v;
    }
  }
  *from = nullptr;
  return nullptr;
}

std::string KnobBase::raw() const {
  const char* from;
  const char* v = lookup(&from);
  return v ? v : def_;
}

std::string KnobBase::source() const {
  const char* from;
  lookup(&from);
  return from ? std::string("env ") + from : "default";
}

bool KnobBase::isSet() const {
  const char* from;
  return lookup(&from) != nullptr;
}

std::string KnobBase::canonical() const {
  try {
    switch (type_) {
      case KnobType::kInt: return std::to_string(static_cast<const IntKnob*>(this)->get());
      case KnobType::kSize: return std::to_string(static_cast<const SizeKnob*>(this)->get());
      case KnobType::kBool: return static_cast<const BoolKnob*>(this)->get() ? "1" : "0";
      case KnobType::kString: break;
    }
  } catch (const Error&) {
    return raw();  // malformed: its own rank reports it; as a value it differs from any good one
  }
  std::string s = raw();
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  s = b == std::string::npos ? "" : s.substr(b, e - b + 1);
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  return s;
}

IntKnob::IntKnob(const char* name, const char* alias, int64_t def, const char* help,
                 KnobScope scope)
    : KnobBase(name, alias, KnobType::kInt, std::to_string(def), help, scope) {}

int64_t IntKnob::get() const {
  std::string s = raw();
  char* end = nullptr;
  errno = 0;
  long long v = strtoll(s.c_str(), &end, 0);
  if (errno != 0 || end == s.c_str() || *end != '\0')
    LOOM_THROW(kInvalidArgument, "%s=%s is not an integer", origin(*this).c_str(), s.c_str());
  return v;
}

bool BoolKnob::get() const {
  std::string s = raw();
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), ::tolower);
  if (l == "1" || l == "true" || l == "yes" || l == "on") return true;
  if (l == "0" || l == "false" || l == "no" || l == "off") return false;
  LOOM_THROW(kInvalidArgument, "%s=%s is not a boolean (use 0/1)", origin(*this).c_str(),
             s.c_str());
}

uint64_t parseSize(const std::string& text, const char* what) {
  char* end = nullptr;
  errno = 0;
  // strtoull would quietly turn "-1" into 2^64-1.
  bool negative = text.find('-') != std::string::npos;
  unsigned long long v = strtoull(text.c_str(), &end, 0);
  if (negative || errno != 0 || end == text.c_str())
    LOOM_THROW(kInvalidArgument, "%s=%s is not a size", what, text.c_str());
  uint64_t mult = 1;
  switch (*end) {
    case 'k': case 'K': mult = 1ull << 10; ++end; break;
    case 'm': case 'M': mult = 1ull << 20; ++end; break;
    case 'g': case 'G': mult = 1ull << 30; ++end; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0') LOOM_THROW(kInvalidArgument, "%s=%s is not a size", what, text.c_str());
  if (v > UINT64_MAX / mult)
    LOOM_THROW(kInvalidArgument, "%s=%s is too large", what, text.c_str());
  return v * mult;
}

uint64_t SizeKnob::get() const { return parseSize(raw(), origin(*this).c_str()); }

const std::vector<const KnobBase*>& allKnobs() { return registry(); }

std::vector<std::string> unreadNcclVariables() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (name.rfind("NCCL_", 0) != 0) continue;
    // The benchmarks', and the profiler plugins' (NVIDIA's example plugin, NCCL Inspector).
    if (name.rfind("NCCL_TESTS_", 0) == 0 || name.rfind("NCCL_PROFILE_", 0) == 0 ||
        name.rfind("NCCL_INSPECTOR_", 0) == 0)
      continue;
    if (!findKnob(name)) out.push_back(entry);
  }
  std::sort(out.begin(), out.end());
  return out;
}

const KnobBase* findKnob(const std::string& name) {
  for (const KnobBase* k : registry())
    if (name == k->name() || name == k->ncclAlias()) return k;
  return nullptr;
}

}  // namespace loom
