#include "transports/socket/stream_acceptor.h"

#include <set>

#include "base/error.h"
#include "base/log.h"
#include "bootstrap/wire.h"

namespace loom {

StreamAcceptor::StreamAcceptor(const JobId& job, int me, int nranks, SocketAddr addr,
                               uint16_t kind, const char* what)
    : me_(me), addr_(addr) {
  listener_ = Socket::listen(addr_);
  // From here on strangers on the listener are dropped by the acceptor's thread even
  // while no connection is being made; a replayed stream hello counts as a stranger.
  acceptor_ = std::make_unique<HelloAcceptor>(
      &listener_, strprintf("rank %d %s %s", me, what, addr_.str().c_str()),
      [job, me, nranks, kind, seen = std::set<std::string>()](const PeerHello& h) mutable {
        if (!verifyPeerHello(job, h, kind, me) || h.fromRank < 0 || h.fromRank >= nranks)
          return false;
        return seen.insert(std::string(reinterpret_cast<const char*>(h.nonce), sizeof(h.nonce)))
            .second;
      });
}

// The acceptor's thread watches the listener: it stops before the listener closes.
StreamAcceptor::~StreamAcceptor() { acceptor_.reset(); }

std::optional<std::vector<Socket>> StreamAcceptor::tryTake(int from, uint64_t connId, uint32_t n,
                                                           int waitMs) {
  auto arrived = [&] {
    if (from < 0)
      for (const auto& [key, sock] : early_)
        if (std::get<1>(key) == connId && std::get<2>(key) == 0) from = std::get<0>(key);
    if (from < 0) return false;
    for (uint32_t s = 0; s < n; ++s)
      if (!early_.count({from, connId, s})) return false;
    return true;
  };
  if (!arrived()) takeStreams(waitMs);
  if (!arrived()) return std::nullopt;
  std::vector<Socket> out;
  for (uint32_t s = 0; s < n; ++s) {
    auto it = early_.find({from, connId, s});
    out.push_back(std::move(it->second));
    early_.erase(it);
  }
  return out;
}

void StreamAcceptor::takeStreams(int waitMs) {
  for (auto& [h, sock] : acceptor_->take(waitMs)) {
    auto key = std::make_tuple(h.fromRank, h.connId >> 8, static_cast<uint32_t>(h.connId & 0xff));
    if (early_.count(key)) {
      LOOM_WARN("rank %d: dropped a second TCP stream claiming to be %llu/%u of rank %d from %s",
                me_, static_cast<unsigned long long>(h.connId >> 8),
                static_cast<unsigned>(h.connId & 0xff), h.fromRank, sock.peer().str().c_str());
      continue;
    }
    early_[key] = std::move(sock);
  }
}

}  // namespace loom
