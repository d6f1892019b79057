#include "engine/knob_agreement.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "base/config.h"
#include "base/error.h"
#include "base/hash.h"

namespace loom {
namespace {

constexpr int kMaxJobKnobs = 16;

// One rank's values, all-gathered only when the digests differ.
struct KnobValues {
  uint32_t count;
  struct {
    char name[32];    // LOOM_*
    char shown[56];   // the raw value, cut short
    char source[32];  // "default", "env NCCL_ALGO"
    uint64_t value;   // fnv1a of the canonical value
  } k[kMaxJobKnobs];
};

template <size_t N>
std::string field(const char (&f)[N]) {
  return std::string(f, strnlen(f, N));
}

}  // namespace

void JobSettingsReader::blame(const std::vector<const KnobBase*>& knobs, const std::string& what) {
  size_t before = malformed_.size();
  for (const KnobBase* k : knobs)
    if (what.find(k->name()) != std::string::npos ||
        (*k->ncclAlias() && what.find(k->ncclAlias()) != std::string::npos))
      malformed_.push_back(k);
  if (malformed_.size() == before) malformed_.insert(malformed_.end(), knobs.begin(), knobs.end());
}

JobSetting JobSettingsReader::published(JobSetting s) const {
  for (const KnobBase* k : malformed_)
    if (k == s.knob) s.value = "malformed: " + k->raw();
  return s;
}

uint64_t jobDigest(const std::vector<JobSetting>& settings) {
  // A mismatch names its setting only among the first kMaxJobKnobs (throwDiffering).
  LOOM_ASSERT(settings.size() <= static_cast<size_t>(kMaxJobKnobs));
  uint64_t h = kFnvOffset;
  for (const JobSetting& s : settings) h = fnv1a(s.value, fnv1a(s.knob->name(), h));
  return h;
}

namespace {

[[noreturn]] void throwDiffering(Bootstrap& bs, const std::vector<PeerInfo>& peers,
                                 const std::vector<JobSetting>& settings, int differing) {
  if (settings.size() > kMaxJobKnobs)
    LOOM_THROW(kInternalError, "%zu job-wide settings; the init compares at most %d", settings.size(),
               kMaxJobKnobs);
  std::vector<KnobValues> all(peers.size());
  KnobValues& mine = all[bs.rank()];
  memset(&mine, 0, sizeof(mine));
  mine.count = static_cast<uint32_t>(settings.size());
  for (size_t i = 0; i < settings.size(); ++i) {
    const KnobBase& k = *settings[i].knob;
    snprintf(mine.k[i].name, sizeof(mine.k[i].name), "%s", k.name());
    mine.k[i].value = fnv1a(settings[i].value);
    const bool own = settings[i].source.empty();
    snprintf(mine.k[i].shown, sizeof(mine.k[i].shown), "%s", own ? k.raw().c_str() : settings[i].shown.c_str());
    snprintf(mine.k[i].source, sizeof(mine.k[i].source), "%s",
             own ? k.source().c_str() : settings[i].source.c_str());
  }
  bs.allGather(all.data(), sizeof(KnobValues));

  const std::string tail = strprintf(
      "; %d of %zu ranks differ from rank 0. Set it alike on every rank: ranks with different "
      "values run different plans or FIFO shapes and would wait on each other",
      differing, peers.size());
  const KnobValues& first = all[0];
  for (size_t r = 1; r < all.size(); ++r) {
    const KnobValues& other = all[r];
    if (peers[r].jobKnobs == peers[0].jobKnobs) continue;
    bool sameList = other.count == first.count && first.count <= kMaxJobKnobs;
    for (uint32_t i = 0; sameList && i < first.count; ++i)
      sameList = field(other.k[i].name) == field(first.k[i].name);
    if (!sameList)
      LOOM_THROW(kInvalidUsage,
                 "rank %zu's Loom compares other job-wide settings than rank 0's: the ranks run "
                 "different Loom builds%s", r, tail.c_str());
    for (uint32_t i = 0; i < first.count; ++i) {
      if (other.k[i].value == first.k[i].value) continue;
      auto side = [&](const KnobValues& v, size_t rank) {
        return strprintf("rank %zu has \"%s\" (%s)", rank, field(v.k[i].shown).c_str(),
                         field(v.k[i].source).c_str());
      };
      // The variable a user set (rank 0's, else the other's); the knob's name if neither did.
      std::string name = field(first.k[i].name);
      for (const std::string& src : {field(first.k[i].source), field(other.k[i].source)})
        if (src.rfind("env ", 0) == 0 || src.rfind("ncclConfig_t ", 0) == 0) {
          name = src.rfind("env ", 0) == 0 ? src.substr(4) : src;
          break;
        }
      LOOM_THROW(kInvalidUsage, "%s differs between ranks: %s, %s%s", name.c_str(),
                 side(first, 0).c_str(), side(other, r).c_str(), tail.c_str());
    }
  }
  // Digests differ but no value does: the per-knob hashes collided.
  LOOM_THROW(kInvalidUsage, "the ranks' job-wide settings differ, but no single one could be "
             "named%s", tail.c_str());
}

}  // namespace

void checkJobSettings(Bootstrap& bs, const std::vector<PeerInfo>& peers,
                      const std::vector<JobSetting>& settings, std::exception_ptr ownError) {
  int differing = 0;
  for (const PeerInfo& p : peers) differing += p.jobKnobs != peers[0].jobKnobs;
  try {
    if (differing) throwDiffering(bs, peers, settings, differing);
  } catch (const Error&) {
    if (ownError) std::rethrow_exception(ownError);  // this rank's own words for its value
    throw;
  }
  if (ownError) std::rethrow_exception(ownError);
}

}  // namespace loom
