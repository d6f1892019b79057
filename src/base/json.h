// The little JSON Loom writes (tools' --json output, flight-recorder dumps, status replies).
#pragma once

#include <string>

namespace loom {

// `s` as a JSON string literal, quotes included (control characters escaped).
std::string jsonString(const std::string& s);

}  // namespace loom
