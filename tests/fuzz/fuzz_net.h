// Small blocking-socket helpers for the network fuzz targets: connect to a listener, push
// an input's bytes, half-close, and wait for the server to hang up.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "base/socket.h"

namespace loomfuzz {

inline int connectTo(const loom::SocketAddr& a) {
  int fd = socket(a.family(), SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (connect(fd, a.sa(), a.len) == 0) return fd;
  // libFuzzer's timers interrupt system calls; the connection goes on in the background.
  if (errno == EINTR) {
    pollfd p{fd, POLLOUT, 0};
    int r;
    while ((r = poll(&p, 1, 5000)) < 0 && errno == EINTR) {
    }
    int err = 0;
    socklen_t len = sizeof(err);
    if (r == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) return fd;
    if (r == 1) errno = err;
  }
  int saved = errno;
  close(fd);
  errno = saved;
  return -1;
}

// Sends what the server will take; a server that hangs up early is fine. With `block`
// false, stops where the socket buffer is full instead of waiting for a reader.
inline void sendSome(int fd, const uint8_t* p, size_t n, bool block = true) {
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL | (block ? 0 : MSG_DONTWAIT));
    if (k <= 0) {
      if (k < 0 && errno == EINTR) continue;
      return;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// Waits until the peer closes (EOF or reset). Returns false after `timeoutMs`.
inline bool waitClosed(int fd, int timeoutMs) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  char buf[4096];
  for (;;) {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    end - std::chrono::steady_clock::now()).count());
    if (left < 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, left);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return false;
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
}

}  // namespace loomfuzz
