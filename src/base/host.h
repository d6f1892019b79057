// Host identity: which ranks share a machine (and so can use shared memory). The
// LOOM_HOSTID knob lets one machine pose as several hosts for testing.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

std::string hostName();
// Hash of hostname + boot id (or LOOM_HOSTID when set); equal on ranks of one host.
uint64_t hostHash();
std::string hostIdString();

}  // namespace loom
