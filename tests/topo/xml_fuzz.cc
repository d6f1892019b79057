// libFuzzer target: the topology XML parser, the model built from it and the dump written
// back. Any input must end in a value or a loom::Error, never a crash, hang or sanitizer
// report; whatever the writer produces must parse back to the same document.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "base/error.h"
#include "topo/topo_xml.h"
#include "topo/xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom::topo;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  XmlNode root;
  try {
    root = parseXml(text);
  } catch (const loom::Error&) {
    return 0;
  }
  const std::string written = writeXml(root);
  try {
    if (writeXml(parseXml(written)) != written) abort();  // the writer's output is a fixed point
  } catch (const loom::Error&) {
    abort();  // the writer produced something its own parser rejects
  }
  try {
    System sys = systemFromXml(root);
    const std::string dump = writeXml(systemToXml(sys));
    System again = systemFromXml(parseXml(dump));  // Loom's dump must load back
    if (again.gpuCount() != sys.gpuCount() || again.netCount() != sys.netCount()) abort();
  } catch (const loom::Error&) {
  }
  return 0;
}
