#include "transports/connection.h"

#include <cstring>

#include "base/error.h"

namespace loom {

Connection::Connection(int peer, std::string transport, const PeerInfo& info,
                       const std::string& where)
    : peer_(peer), peerPid_(info.pid), transport_(std::move(transport)) {
  // The peer's hostname came over the wire: print it only up to its first NUL.
  std::string host(info.hostname, strnlen(info.hostname, sizeof(info.hostname)));
  desc_ = strprintf("rank %d (%s pid %d%s%s) via %s", peer, host.c_str(), info.pid,
                    where.empty() ? "" : ", ", where.c_str(), transport_.c_str());
}

void Connection::readRemote(void*, uint64_t, size_t) const {
  LOOM_THROW(kInternalError, "%s: transport cannot read remote memory", desc_.c_str());
}

}  // namespace loom
