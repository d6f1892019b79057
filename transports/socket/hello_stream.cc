#include "transports/socket/hello_stream.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace loom {

HelloStream::HelloStream(const SocketAddr& addr, const PeerHello& hello, std::string who)
    : hello_(hello), who_(std::move(who)) {
  int fd = ::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throwErrno("%s: socket", who_.c_str());
  sock_ = Socket(fd);
  // Completion (even an immediate one) is seen by advance(), which polls for it.
  if (::connect(fd, addr.sa(), addr.len) != 0 && errno != EINPROGRESS)
    LOOM_THROW(kRemoteError, "%s: connect failed: %s", who_.c_str(), strerror(errno));
}

bool HelloStream::advance() {
  if (!connected_) {
    pollfd p{sock_.fd(), POLLOUT, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(sock_.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) LOOM_THROW(kRemoteError, "%s: connect failed: %s", who_.c_str(), strerror(err));
    connected_ = true;
    sock_.setNoDelay();
    sock_.setLivenessTimeout();
  }
  while (sent_ < sizeof(hello_)) {
    size_t n = sock_.trySend(reinterpret_cast<const char*>(&hello_) + sent_,
                             sizeof(hello_) - sent_, who_.c_str());
    if (n == 0) return false;
    sent_ += n;
  }
  return true;
}

}  // namespace loom
