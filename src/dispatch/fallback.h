// Which library serves a communicator's device-memory calls: Loom, or stock NCCL through a
// shadow communicator (LOOM_NCCL_FALLBACK=auto|off|force).
//
// Each rank describes what it has (a stock library, a CUDA device and its identity); the
// ranks all-gather these descriptions, and every rank computes the same decision from the
// same list, so either every rank creates its shadow or none does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::dispatch {

enum class FallbackMode { kAuto, kOff, kForce };

// LOOM_NCCL_FALLBACK, read on each call; throws kInvalidArgument for an unknown value.
FallbackMode fallbackMode();
const char* fallbackModeName(FallbackMode m);

// One rank's contribution, exchanged as plain bytes.
struct RankFallbackInfo {
  uint64_t hostHash = 0;
  int32_t cudaDev = -1;       // -1: the rank has no CUDA device (host-only)
  int32_t stockVersion = 0;   // 0: no usable stock library on this rank
  uint8_t uuid[16] = {};      // all zero when the driver cannot say
  uint8_t hasUuid = 0;
  uint8_t mode = 0;           // this rank's FallbackMode, or kInvalidMode
  // Passed through for the engine: this rank asks for the device executor
  // (LOOM_DEVICE_EXECUTOR=kernel); it serves a communicator only where every rank asks.
  uint8_t wantsKernel = 0;
  uint8_t pad[5] = {};
};
// A rank whose LOOM_NCCL_FALLBACK is malformed says so, so that every rank fails alike.
constexpr uint8_t kInvalidMode = 255;
static_assert(sizeof(RankFallbackInfo) == 40, "exchanged as bytes: keep it padding-free");

struct FallbackDecision {
  bool useStock = false;  // create the shadow and route device calls to it
  bool fail = false;      // LOOM_NCCL_FALLBACK=force could not be honoured: init fails
  bool badKnob = false;   // ... because a rank's LOOM_NCCL_FALLBACK is malformed
  std::string why;        // for the INIT log, loom-info and refusals
};

// Pure function of its argument, so the same on every rank. Every rank's mode must agree;
// a disagreement decides against the fallback (and fails when any rank asked for force).
FallbackDecision decideFallback(const std::vector<RankFallbackInfo>& ranks);

// Processes sharing a GPU run their kernels by time slices unless NVIDIA's Multi-Process
// Service runs on the host: a rank's collective waits for a peer process whose kernel is
// not resident. The warning `rank` gives when another process (`pids[r]` differs) of the
// ranks has its GPU and `mpsRunning` is false; "" when none does or MPS runs. Only the
// lowest rank of those sharing a GPU says it (one line per GPU, not one per rank).
std::string gpuSharingWarning(const std::vector<RankFallbackInfo>& ranks,
                              const std::vector<int>& pids, int rank, bool mpsRunning);

// Whether every rank is a process of its own on one host's one CUDA device (their
// collectives meet on a board: engine/device_board.h). The same on every rank.
bool processesOnOneDevice(const std::vector<RankFallbackInfo>& ranks, const std::vector<int>& pids);

// The other ranks that run in `rank`'s process (same host and pid) on its CUDA device:
// threads sharing one CUDA context, whose streams the hardware may serialize behind each
// other (engine/staged.h says what the staged path does about it). Empty when none does.
std::vector<int> sameContextRanks(const std::vector<RankFallbackInfo>& ranks,
                                  const std::vector<int>& pids, int rank);

// Whether an MPS control daemon listens on this host: its pipe directory
// (CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps) holds the control socket.
bool mpsControlRunning();

}  // namespace loom::dispatch
