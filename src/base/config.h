// Typed configuration registry. Every knob is declared once (name, NCCL alias, type,
// default, help) next to the code that uses it; `loom-info` lists them all with the value
// in force and where it came from. Values are read from the environment when asked for,
// so a process (or a test) that sets a variable before creating a communicator sees it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

enum class KnobType { kInt, kBool, kString, kSize };

// kJob: a knob that decides what plan, protocol or FIFO shape a rank uses, so every rank of
// a communicator must have the same value (ranks that differ would wait on each other or
// misread each other's data). Each communicator's init compares them across its ranks
// (engine/knob_agreement.h) and fails naming the knob. kRank: each rank's own business.
enum class KnobScope { kRank, kJob };

class KnobBase {
 public:
  KnobBase(const char* name, const char* ncclAlias, KnobType type, std::string def,
           const char* help, KnobScope scope = KnobScope::kRank);
  KnobBase(const KnobBase&) = delete;
  KnobBase& operator=(const KnobBase&) = delete;

  const char* name() const { return name_; }
  const char* ncclAlias() const { return alias_; }  // "" when NCCL has no such knob
  KnobType type() const { return type_; }
  const std::string& defaultValue() const { return def_; }
  const char* help() const { return help_; }
  KnobScope scope() const { return scope_; }

  // The raw string in force and its source ("default", "env LOOM_X", "env NCCL_X").
  std::string raw() const;
  std::string source() const;
  bool isSet() const;
  // The value in force as ranks compare it: numbers, sizes and booleans parsed, strings
  // trimmed and lower-cased; the raw string where it does not parse.
  std::string canonical() const;

 private:
  const char* lookup(const char** from) const;
  const char* name_;
  const char* alias_;
  KnobType type_;
  std::string def_;
  const char* help_;
  KnobScope scope_;
};

class IntKnob : public KnobBase {
 public:
  IntKnob(const char* name, const char* alias, int64_t def, const char* help,
          KnobScope scope = KnobScope::kRank);
  int64_t get() const;  // throws kInvalidArgument naming the variable on a malformed value
};

class BoolKnob : public KnobBase {
 public:
  BoolKnob(const char* name, const char* alias, bool def, const char* help,
           KnobScope scope = KnobScope::kRank)
      : KnobBase(name, alias, KnobType::kBool, def ? "1" : "0", help, scope) {}
  bool get() const;
};

class StringKnob : public KnobBase {
 public:
  StringKnob(const char* name, const char* alias, const char* def, const char* help,
             KnobScope scope = KnobScope::kRank)
      : KnobBase(name, alias, KnobType::kString, def, help, scope) {}
  std::string get() const { return raw(); }
};

// Byte sizes accept K/M/G suffixes (powers of two).
class SizeKnob : public KnobBase {
 public:
  SizeKnob(const char* name, const char* alias, const char* def, const char* help,
           KnobScope scope = KnobScope::kRank)
      : KnobBase(name, alias, KnobType::kSize, def, help, scope) {}
  uint64_t get() const;
};

const std::vector<const KnobBase*>& allKnobs();
// The NCCL_* variables set in this process's environment that no knob reads (as "NAME=value"),
// NCCL_TESTS_* (the benchmarks'), NCCL_PROFILE_* and NCCL_INSPECTOR_* (profiler plugins')
// aside: NCCL's own tuning that Loom's paths ignore, though a stock NCCL serving device
// buffers reads it.
std::vector<std::string> unreadNcclVariables();
const KnobBase* findKnob(const std::string& name);
uint64_t parseSize(const std::string& text, const char* what);

}  // namespace loom
