// Host identity: which ranks share a machine (and so can use shared memory). The
// LOOM_HOSTID knob lets one machine pose as several hosts for testing.
//
// Ranks are on one host when they see the same hostname, boot id, network namespace and
// pid namespace (docs/multihost.md). The namespaces count because shared memory between
// them is not what a user who separated them expects, and because the shm transport
// reaches its peer by pid (pidfd, cross-memory reads), which means nothing across pid
// namespaces. LOOM_HOSTID, when set, is the whole identity.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

std::string hostName();
// FNV-1a of hostIdString(); equal on ranks of one host, stable across processes and builds.
uint64_t hostHash();
// LOOM_HOSTID when set; else "<hostname>:<boot id>", followed by "/netns:<inode>" and
// "/pidns:<inode>" for namespaces other than the machine's initial ones.
std::string hostIdString();
// The inode of this process's pid namespace (0 if unknown). Pids name processes only
// within one: shared memory's peer checks (pidfd, process_vm_readv, "same process") are
// only valid between processes whose pid namespaces match.
uint64_t pidNamespace();
// CPUs the processes of this host may share: the cgroup's effective cpuset where there is
// one, else the online CPUs. Not this process's affinity mask: a launcher that binds each
// rank to its own core leaves one CPU per rank, not one for all of them.
int hostCpus();

}  // namespace loom
