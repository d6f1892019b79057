// libFuzzer target: a RAS process report as a peer's status reply carries it
// (api/ras_wire.h). Any input must decode or be refused, never read out of bounds; whatever
// decodes must encode to the same bytes (the format has one encoding per record).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "api/ras_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  loom::ras::ProcessRecord p;
  if (!loom::ras::decodeProcess(in, &p)) return 0;
  if (p.node.size() > loom::ras::kMaxNodeBytes || p.comms.size() > loom::ras::kMaxComms) abort();
  for (const loom::ras::CommRecord& c : p.comms)
    for (const loom::ras::RankRecord& r : c.ranks)
      if (r.rank < 0 || r.rank >= c.nranks) abort();
  if (loom::ras::encodeProcess(p) != in) abort();
  return 0;
}
