#include "engine/flat_plan.h"

#include <cstring>
#include <limits>

#include "base/error.h"

namespace loom {
namespace {

size_t align8(size_t n) { return (n + 7) & ~size_t(7); }

}  // namespace

FlatPlanBlock::FlatPlanBlock(const Plan& plan) {
  size_t nLoops = 0, nSteps = 0;
  for (const ChannelPlan& ch : plan.channels) {
    nLoops += ch.loops.size();
    nSteps += ch.steps.size();
    for (const Loop& l : ch.loops) nSteps += l.body.size();
  }
  FlatPlan h{};
  h.magic = kFlatPlanMagic;
  h.nChannels = static_cast<uint32_t>(plan.channels.size());
  h.shares = plan.shares;
  h.scratchBytes = plan.scratchBytes;
  h.channelsAt = static_cast<uint32_t>(align8(sizeof(FlatPlan)));
  h.loopsAt = static_cast<uint32_t>(align8(h.channelsAt + h.nChannels * sizeof(FlatChannel)));
  h.stepsAt = static_cast<uint32_t>(align8(h.loopsAt + nLoops * sizeof(FlatLoop)));
  const size_t total = align8(h.stepsAt + nSteps * sizeof(Step));
  if (total > std::numeric_limits<uint32_t>::max())
    LOOM_THROW(kInternalError, "a plan of %zu steps is too large for the interpreter", nSteps);
  h.bytes = static_cast<uint32_t>(total);
  h.nLoops = static_cast<uint32_t>(nLoops);
  h.nSteps = static_cast<uint32_t>(nSteps);
  words_.assign(total / 8, 0);
  char* base = reinterpret_cast<char*>(words_.data());
  std::memcpy(base, &h, sizeof h);
  auto* chans = reinterpret_cast<FlatChannel*>(base + h.channelsAt);
  auto* loops = reinterpret_cast<FlatLoop*>(base + h.loopsAt);
  auto* steps = reinterpret_cast<Step*>(base + h.stepsAt);
  uint32_t li = 0, si = 0;
  for (size_t c = 0; c < plan.channels.size(); ++c) {
    const ChannelPlan& ch = plan.channels[c];
    chans[c] = {si, static_cast<uint32_t>(ch.steps.size()), li, static_cast<uint32_t>(ch.loops.size())};
    for (const Step& s : ch.steps) steps[si++] = s;
    for (const Loop& l : ch.loops) {
      if (l.body.size() > std::numeric_limits<uint16_t>::max())
        LOOM_THROW(kInternalError, "a loop body of %zu steps is too large for the interpreter",
                   l.body.size());
      loops[li++] = {l.perIter, si, static_cast<uint16_t>(l.body.size()), l.pieces,
                     static_cast<uint8_t>(l.atLeastOnce), l.lag};
      for (const Step& s : l.body) steps[si++] = s;
    }
  }
}

}  // namespace loom
