#include "topo/load.h"

#include <cstdio>
#include <memory>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "topo/topo_xml.h"

namespace loom::topo {
namespace {

StringKnob kTopoFile("LOOM_TOPO_FILE", "NCCL_TOPO_FILE", "",
                     "Topology XML (NCCL's <system version=\"1\"> format) merged over what is "
                     "detected; the file wins where both describe a device");
StringKnob kTopoDumpFile("LOOM_TOPO_DUMP_FILE", "NCCL_TOPO_DUMP_FILE", "",
                         "Write the topology Loom uses, in NCCL's XML format, to this file");

}  // namespace

System loadSystemFile(const std::string& path) {
  XmlNode xml = readXmlFile(path);
  try {
    System sys = systemFromXml(xml);
    sys.setSource(path);
    return sys;
  } catch (const Error& e) {
    LOOM_THROW(kInvalidArgument, "topology file %s: %s", path.c_str(), e.what());
  }
}

System loadLocalSystem(const DetectOptions& detect) {
  XmlNode xml = detectXml(detect);
  std::string source = "detected";
  const std::string file = kTopoFile.get();
  if (!file.empty()) {
    LOOM_INFO(kLogGraph | kLogEnv, "%s set by environment to %s", kTopoFile.source().c_str(), file.c_str());
    xml = mergeXml(readXmlFile(file), xml);
    source = "detected + " + file;
  }
  System sys;
  try {
    sys = systemFromXml(xml);
  } catch (const Error& e) {
    LOOM_THROW(kInvalidArgument, "topology (%s): %s", source.c_str(), e.what());
  }
  sys.setSource(source);
  LOOM_INFO(kLogGraph, "topology (%s): %d GPUs, %d network ports, %d NUMA domains%s", source.c_str(),
            sys.gpuCount(), sys.netCount(), sys.cpuCount(), sys.hasNvSwitch() ? ", NVSwitch" : "");
  const std::string dump = kTopoDumpFile.get();
  if (!dump.empty()) dumpSystem(sys, dump);
  return sys;
}

void dumpSystem(const System& sys, const std::string& path) {
  std::string text = writeXml(systemToXml(sys));
  std::unique_ptr<FILE, int (*)(FILE*)> f(fopen(path.c_str(), "w"), fclose);
  if (!f) throwErrno("cannot write topology dump %s", path.c_str());
  if (fwrite(text.data(), 1, text.size(), f.get()) != text.size())
    throwErrno("cannot write topology dump %s", path.c_str());
  LOOM_INFO(kLogGraph, "topology written to %s", path.c_str());
}

}  // namespace loom::topo
