// libFuzzer target: the 128 bytes of an ncclUniqueId as JobId::decode reads them. Any
// input must decode or throw loom::Error; whatever decodes must survive encode/decode
// unchanged and print its root address.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "base/error.h"
#include "bootstrap/unique_id.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t in[loom::kUniqueIdBytes] = {};
  memcpy(in, data, size < sizeof(in) ? size : sizeof(in));
  loom::JobId id;
  try {
    id = loom::JobId::decode(in);
  } catch (const loom::Error&) {
    return 0;
  }
  const std::string addr = id.root.str();
  uint8_t out[loom::kUniqueIdBytes];
  id.encode(out);
  loom::JobId again;
  try {
    again = loom::JobId::decode(out);
  } catch (const loom::Error&) {
    abort();  // an id Loom wrote itself must decode
  }
  if (again.root.str() != addr || again.jobTag != id.jobTag ||
      memcmp(again.secret, id.secret, sizeof(id.secret)) != 0 || again.root.port() != id.root.port())
    abort();
  uint8_t twice[loom::kUniqueIdBytes];
  again.encode(twice);
  if (memcmp(out, twice, sizeof(out)) != 0) abort();  // encoding is a fixed point
  return 0;
}
