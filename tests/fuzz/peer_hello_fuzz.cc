// libFuzzer target: the rank-to-rank hello (bootstrap and transport streams). Bytes that
// were not made with the job's secret never verify, whatever they claim; a hello made by
// makePeerHello verifies only for its own kind and destination and only unaltered.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "base/hmac.h"
#include "bootstrap/wire.h"

namespace {

loom::JobId jobWithSecret(uint8_t fill) {
  loom::JobId id;
  memset(id.secret, fill, sizeof(id.secret));
  id.jobTag = fill;
  return id;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::JobId job = jobWithSecret(0x5a), other = jobWithSecret(0xa5);
  if (size >= sizeof(loom::PeerHello)) {
    loom::PeerHello h;
    memcpy(&h, data, sizeof(h));
    for (uint16_t kind : {uint16_t(2), uint16_t(3), h.kind})
      for (int me : {h.toRank, 0, 1})
        if (loom::verifyPeerHello(job, h, kind, me)) abort();  // forged without the secret
  }
  FuzzedDataProvider in(data, size);
  uint16_t kind = in.ConsumeIntegral<uint16_t>();
  int from = in.ConsumeIntegral<int32_t>(), to = in.ConsumeIntegral<int32_t>();
  uint64_t connId = in.ConsumeIntegral<uint64_t>();
  size_t flipAt = in.ConsumeIntegralInRange<size_t>(0, sizeof(loom::PeerHello) - 1);
  uint8_t flip = in.ConsumeIntegralInRange<uint8_t>(1, 255);
  loom::PeerHello made = loom::makePeerHello(job, kind, from, to, connId);
  if (!loom::verifyPeerHello(job, made, kind, to)) abort();
  if (loom::verifyPeerHello(job, made, static_cast<uint16_t>(kind + 1), to)) abort();
  if (loom::verifyPeerHello(job, made, kind, static_cast<int>(static_cast<unsigned>(to) + 1))) abort();
  if (loom::verifyPeerHello(other, made, kind, to)) abort();  // another job's secret
  loom::PeerHello bad = made;
  reinterpret_cast<uint8_t*>(&bad)[flipAt] ^= flip;
  if (loom::verifyPeerHello(job, bad, kind, to)) abort();  // any altered byte is caught
  return 0;
}
