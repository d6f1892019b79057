#include "transports/net/listener.h"

#include <cstring>

#include "base/error.h"

namespace loom {

void HandleAddr::set(const SocketAddr& a, int rank) {
  if (a.len > sizeof(bytes))
    LOOM_THROW(kInternalError, "rank %d: a %u-byte listener address does not fit a net handle",
               rank, static_cast<unsigned>(a.len));
  len = a.len;
  memcpy(bytes, &a.storage, a.len);
}

bool HandleAddr::get(SocketAddr* a) const {
  if (len > sizeof(bytes) || len < sizeof(sa_family_t)) return false;
  memcpy(&a->storage, bytes, len);
  a->len = len;
  return (a->family() == AF_INET && a->len == sizeof(sockaddr_in)) ||
         (a->family() == AF_INET6 && a->len == sizeof(sockaddr_in6));
}

std::unique_ptr<StreamAcceptor> makeNetAcceptor(const NetContext& ctx, uint16_t kind,
                                                const char* what) {
  SocketAddr a = ctx.iface.addr;
  a.setPort(0);
  return std::make_unique<StreamAcceptor>(ctx.job, ctx.rank, ctx.nranks, a, kind, what);
}

NetProperties bootstrapIfaceProperties(const NetContext& ctx) {
  NetProperties p;
  p.name = ctx.iface.name.empty() ? ctx.iface.addr.str() : ctx.iface.name;
  p.ptrSupport = kNetPtrHost;
  p.speedMbps = 10000;
  p.latencyUs = 0;
  p.maxRecvs = 1;
  return p;
}

}  // namespace loom
