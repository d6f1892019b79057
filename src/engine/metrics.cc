#include "engine/metrics.h"

namespace loom {

void startMetricsExporter(int) {}
std::string renderMetrics() { return ""; }

}  // namespace loom
