// Every live flight recorder of the process, for what looks at all of them: SIGUSR1
// (dumps every communicator to LOOM_DUMP_DIR) and the metrics exporter.
#pragma once

#include <functional>

namespace loom {

class FlightRecorder;

void registerRecorder(FlightRecorder* r);    // the first one installs the SIGUSR1 handler
void unregisterRecorder(FlightRecorder* r);  // waits for a dump in progress to finish
// Calls fn on every live recorder, under the registry's lock (none goes away meanwhile).
void forEachRecorder(const std::function<void(const FlightRecorder&)>& fn);

}  // namespace loom
