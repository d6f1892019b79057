#include "dispatch/fallback.h"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>

#include "base/config.h"
#include "base/error.h"

namespace loom::dispatch {
namespace {

StringKnob kFallback("LOOM_NCCL_FALLBACK", "", "auto",
                     "Who serves device-memory calls: auto (stock NCCL when every rank has it "
                     "and a GPU of its own, else Loom), off (always Loom), force (stock NCCL, "
                     "or the communicator's init fails)");

bool sameDevice(const RankFallbackInfo& a, const RankFallbackInfo& b) {
  if (a.hasUuid && b.hasUuid) return memcmp(a.uuid, b.uuid, sizeof(a.uuid)) == 0;
  return a.hostHash == b.hostHash && a.cudaDev == b.cudaDev;
}

// Why stock NCCL cannot serve these ranks, or "" when it can.
std::string stockUnusable(const std::vector<RankFallbackInfo>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].cudaDev < 0) return strprintf("rank %zu has no CUDA device", r);
  for (size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].stockVersion <= 0)
      return strprintf("rank %zu found no usable stock NCCL library (its INIT log says why)", r);
  for (size_t r = 1; r < ranks.size(); ++r)
    if (ranks[r].stockVersion != ranks[0].stockVersion)
      return strprintf("rank 0 has stock NCCL %d but rank %zu has %d", ranks[0].stockVersion, r,
                       ranks[r].stockVersion);
  for (size_t a = 0; a < ranks.size(); ++a)
    for (size_t b = a + 1; b < ranks.size(); ++b)
      if (sameDevice(ranks[a], ranks[b]))
        return strprintf("ranks %zu and %zu share CUDA device %d, which stock NCCL refuses "
                         "(\"Duplicate GPU detected\")",
                         a, b, ranks[b].cudaDev);
  return "";
}

}  // namespace

FallbackMode fallbackMode() {
  const std::string v = kFallback.get();
  if (v == "auto" || v.empty()) return FallbackMode::kAuto;
  if (v == "off") return FallbackMode::kOff;
  if (v == "force") return FallbackMode::kForce;
  LOOM_THROW(kInvalidArgument, "LOOM_NCCL_FALLBACK=%s: expected auto, off or force", v.c_str());
}

const char* fallbackModeName(FallbackMode m) {
  switch (m) {
    case FallbackMode::kAuto: return "auto";
    case FallbackMode::kOff: return "off";
    case FallbackMode::kForce: return "force";
  }
  return "?";
}

FallbackDecision decideFallback(const std::vector<RankFallbackInfo>& ranks) {
  FallbackDecision d;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].mode != kInvalidMode) continue;
    d.fail = d.badKnob = true;
    d.why = strprintf("rank %zu has a malformed LOOM_NCCL_FALLBACK (expected auto, off or "
                      "force; its log says what it is)", r);
    return d;
  }
  const auto mode = static_cast<FallbackMode>(ranks.at(0).mode);
  for (size_t r = 1; r < ranks.size(); ++r) {
    const auto other = static_cast<FallbackMode>(ranks[r].mode);
    if (other == mode) continue;
    d.fail = mode == FallbackMode::kForce || other == FallbackMode::kForce;
    d.why = strprintf("LOOM_NCCL_FALLBACK differs between ranks (rank 0: %s, rank %zu: %s); "
                      "set it alike on every rank",
                      fallbackModeName(mode), r, fallbackModeName(other));
    return d;
  }
  if (mode == FallbackMode::kOff) {
    d.why = "LOOM_NCCL_FALLBACK=off";
    return d;
  }
  const std::string unusable = stockUnusable(ranks);
  if (unusable.empty()) {
    d.useStock = true;
    d.why = strprintf("LOOM_NCCL_FALLBACK=%s, every rank has stock NCCL %d and a CUDA device "
                      "of its own%s",
                      fallbackModeName(mode), ranks[0].stockVersion,
                      mode == FallbackMode::kAuto ? " (stock NCCL runs device buffers on the GPU; Loom's own path stages them through host memory)" : "");
    return d;
  }
  d.fail = mode == FallbackMode::kForce;
  d.why = strprintf("LOOM_NCCL_FALLBACK=%s, but %s", fallbackModeName(mode), unusable.c_str());
  return d;
}

std::string gpuSharingWarning(const std::vector<RankFallbackInfo>& ranks,
                              const std::vector<int>& pids, int rank, bool mpsRunning) {
  const RankFallbackInfo& me = ranks[static_cast<size_t>(rank)];
  if (mpsRunning || me.cudaDev < 0) return "";
  std::string others;
  bool otherProcess = false;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (static_cast<int>(r) == rank || ranks[r].cudaDev < 0 || !sameDevice(me, ranks[r])) continue;
    if (static_cast<int>(r) < rank) return "";  // the lowest sharing rank says it
    otherProcess |= pids[r] != pids[static_cast<size_t>(rank)];
    others += strprintf("%s%zu (pid %d)", others.empty() ? "" : ", ", r, pids[r]);
  }
  if (!otherProcess) return "";
  return strprintf("rank %d (pid %d) shares CUDA device %d with rank(s) %s, as separate processes, "
                   "and no MPS control daemon runs on this host: their kernels take turns on the "
                   "GPU in time slices, and collectives wait for them. Start MPS "
                   "(nvidia-cuda-mps-control -d) or run such ranks as threads of one process",
                   rank, pids[static_cast<size_t>(rank)], me.cudaDev, others.c_str());
}

std::vector<int> sameContextRanks(const std::vector<RankFallbackInfo>& ranks,
                                  const std::vector<int>& pids, int rank) {
  std::vector<int> out;
  const RankFallbackInfo& me = ranks[static_cast<size_t>(rank)];
  if (me.cudaDev < 0) return out;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (static_cast<int>(r) != rank && ranks[r].cudaDev >= 0 && ranks[r].hostHash == me.hostHash &&
        pids[r] == pids[static_cast<size_t>(rank)] && sameDevice(me, ranks[r]))
      out.push_back(static_cast<int>(r));
  return out;
}

bool processesOnOneDevice(const std::vector<RankFallbackInfo>& ranks, const std::vector<int>& pids) {
  if (ranks.size() < 2) return false;
  const RankFallbackInfo& first = ranks[0];
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].cudaDev < 0 || ranks[r].hostHash != first.hostHash || !sameDevice(first, ranks[r]))
      return false;
    for (size_t q = 0; q < r; ++q)
      if (pids[q] == pids[r]) return false;
  }
  return true;
}

bool mpsControlRunning() {
  const char* dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string path = std::string(dir && *dir ? dir : "/tmp/nvidia-mps") + "/control";
  struct stat st;
  return stat(path.c_str(), &st) == 0 && (S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode));
}

}  // namespace loom::dispatch
