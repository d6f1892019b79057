// What loom-info reports, gathered once (collect.cc) and printed as text or JSON
// (report.cc), so both forms always carry the same facts.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace loom::info {

struct FeatureInfo {
  const char* name;  // "host memory", "CUDA", ...
  const char* key;   // JSON key: "hostMemory", "cuda", ...
  bool compiled = false;
  bool available = false;  // loomGetFeatures' verdict
  std::string path;        // the library the loader picked; "" when none or built in
  std::string detail;      // "built in", "NCCL 2.28.9", or what was tried when not found
};

struct KnobInfo {
  std::string name, alias, type, def, value, source, help;
  bool valid = true;
  std::string error;  // why `value` does not parse, when !valid
  bool jobWide = false;  // every rank of a communicator must have the same value (KnobScope::kJob)
};

struct InterfaceInfo {
  std::string name, address;
};

struct Info {
  std::string version;      // Loom's, LOOM_VERSION_STRING
  std::string ncclVersion;  // the NCCL API implemented, from nccl.h
  int ncclVersionCode = 0;
  std::vector<FeatureInfo> features;
  std::string cpuIsa;                  // the reduction kernels' instruction set in use
  std::vector<std::string> cpuIsasSupported;
  bool bootstrapOk = false;
  InterfaceInfo bootstrap;             // when bootstrapOk
  std::string bootstrapError;          // otherwise
  std::vector<InterfaceInfo> interfaces;  // every usable interface on this host
  std::vector<std::string> rdmaPorts;     // every RDMA port ("rxe0:1 ACTIVE Ethernet (RoCE)")
  std::string rdmaNote;  // why there are none, or what NCCL_IB_HCA selects (or its error)
  std::string hostName, hostId;
  uint64_t hostHash = 0;
  std::vector<KnobInfo> knobs;  // sorted by name

  int invalidKnobs() const;
};

Info collect();
// One knob, looked up by its Loom or NCCL name (exact, then ignoring case); false if none.
bool collectKnob(const std::string& name, KnobInfo* out);
// Knob names that contain `fragment` (ignoring case and a LOOM_/NCCL_ prefix), for hints.
std::vector<std::string> similarKnobs(const std::string& fragment);

void printText(FILE* out, const Info& info);
void printJson(FILE* out, const Info& info);
void printKnobText(FILE* out, const KnobInfo& k);
void printKnobJson(FILE* out, const KnobInfo& k);

}  // namespace loom::info
