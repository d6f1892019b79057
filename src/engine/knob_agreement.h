// Settings every rank of a communicator must share (knobs marked KnobScope::kJob in
// base/config.h): NCCL_ALGO, NCCL_PROTO, the FIFO shape, the host executor and its protocol.
// A rank launched with another value would run other plans than its peers and wait on them
// until LOOM_TIMEOUT, or misread their FIFOs. Each rank publishes a digest of what it will
// run with in its PeerInfo; the init compares the all-gathered digests and, where one
// differs, fails on every rank alike, naming the knob, two ranks and their values.
// (LOOM_DEVICE_LL_BYTES is compared by the device executor, which alone reads it.)
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "base/config.h"
#include "bootstrap/bootstrap.h"
#include "transports/peer_info.h"

namespace loom {

// One job-wide knob as this rank will use it: `value` is its effect in a canonical form
// (parsed masks and numbers, so that "Ring" and "ring" agree; "" where it does not apply on
// this rank, as LOOM_INTERP_PROTO without LOOM_EXECUTOR=interp); the knob gives the name,
// the text and its source for the message.
struct JobSetting {
  const KnobBase* knob;
  std::string value;
  // Where the value is not the knob's own (a communicator's config): what a mismatch shows
  // and where it came from, instead of the knob's raw value and source.
  std::string shown = {};
  std::string source = {};
};

// Reads settings whose parsing may fail, for the exchange: a malformed value becomes a
// marker (so that every rank still takes part and the peers hear which knob is wrong), and
// the first such error is kept to be raised once the peers have been told.
class JobSettingsReader {
 public:
  // Runs read(), which parses `knobs`; on an error, the knobs its message names (Loom's
  // parse errors name the variable: "LOOM_FIFO_DEPTH=abc is not an integer"), or all of
  // them, get the marker value.
  template <class Read>
  void read(const std::vector<const KnobBase*>& knobs, Read read) {
    try {
      read();
    } catch (const std::exception& e) {
      if (!error_) error_ = std::current_exception();
      blame(knobs, e.what());
    }
  }
  // `s` as published: its value, or the marker when its read failed.
  JobSetting published(JobSetting s) const;
  std::exception_ptr error() const { return error_; }

 private:
  void blame(const std::vector<const KnobBase*>& knobs, const std::string& what);
  std::exception_ptr error_;
  std::vector<const KnobBase*> malformed_;
};

uint64_t jobDigest(const std::vector<JobSetting>& settings);

// Throws kInvalidUsage where a rank's jobKnobs digest differs from rank 0's. Collective in
// that case: every rank sees the same digests, and all of them then all-gather their values
// to say which knob differs. `ownError` (a malformed value of this rank's) is raised instead
// of the comparison's verdict, after the ranks have compared.
void checkJobSettings(Bootstrap& bs, const std::vector<PeerInfo>& peers,
                      const std::vector<JobSetting>& settings, std::exception_ptr ownError);

}  // namespace loom
