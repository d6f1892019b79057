// Per-communicator counters (the flight recorders' totals) exported in Prometheus text
// format: an HTTP endpoint (LOOM_METRICS_PORT) and/or a file (LOOM_METRICS_FILE).
#pragma once

#include <string>

namespace loom {

// Called at the end of every communicator's init with the communicator's rank and this
// process's index among the ranks of that communicator on its host. The first call starts
// the exporter (once per process) if a knob asks for it; later calls do nothing.
void startMetricsExporter(int localIndex);

// The metrics of every live communicator of the process, in Prometheus text format.
std::string renderMetrics();

}  // namespace loom
