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

StreamAcceptor& BootstrapIfaceBackend::acceptor() {
  if (!acceptor_) {
    SocketAddr a = ctx_.iface.addr;
    a.setPort(0);
    acceptor_ = std::make_unique<StreamAcceptor>(ctx_.job, ctx_.rank, ctx_.nranks, a, kind_, what_);
  }
  return *acceptor_;
}

void BootstrapIfaceBackend::checkDev(int dev) const {
  if (dev != 0)
    LOOM_THROW(kInvalidArgument, "%s net backend: device %d does not exist (it has 1)", name_,
               dev);
}

NetProperties BootstrapIfaceBackend::properties(int dev) {
  checkDev(dev);
  NetProperties p;
  p.name = ctx_.iface.name.empty() ? ctx_.iface.addr.str() : ctx_.iface.name;
  p.ptrSupport = kNetPtrHost;
  p.speedMbps = 10000;
  p.latencyUs = 0;
  p.maxRecvs = 1;
  return p;
}

}  // namespace loom
