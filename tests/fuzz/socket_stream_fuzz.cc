// libFuzzer target: the receive side of the TCP transport. A SocketConnection is fed the
// input through one or two stream sockets (a socketpair each, the far end closed after
// the bytes), while this thread plays the executor and releases every step it sees. Any
// byte sequence must end in steps whose sizes fit their slots, or a loom::Error; never a
// crash, an overrun, or a step published twice.
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "base/error.h"
#include "fuzz/fuzz_net.h"
#include "transports/socket/socket_transport.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("NCCL_DEBUG", "", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int nstreams = in.ConsumeIntegralInRange<int>(1, 2);
  const loom::FifoShape shape{in.ConsumeIntegralInRange<size_t>(1, 64) * 64, in.ConsumeIntegralInRange<int>(2, 4)};
  std::vector<loom::Socket> streams;
  std::vector<int> far;
  for (int j = 0; j < nstreams; ++j) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) abort();
    streams.emplace_back(sv[0]);
    far.push_back(sv[1]);
  }
  // Stream 0 gets a prefix of the input, stream 1 (if any) the rest.
  std::vector<uint8_t> bytes = in.ConsumeRemainingBytes<uint8_t>();
  size_t split = nstreams == 1 ? bytes.size() : bytes.size() / 2;
  loomfuzz::sendSome(far[0], bytes.data(), split, false);
  if (nstreams == 2) loomfuzz::sendSome(far[1], bytes.data() + split, bytes.size() - split, false);
  for (int f : far) close(f);

  loom::PeerInfo info{};
  info.rank = 1;
  loom::SocketConnection conn(1, info, shape, false, std::move(streams), "fuzz input");
  loom::FifoEnd& fifo = conn.fifo();
  uint64_t lastTail = 0;
  try {
    for (int idle = 0; idle < 4;) {
      bool moved = conn.progress();
      uint64_t tail = loom::loadAcquire(fifo.ctrl->tail);
      if (tail < lastTail) abort();  // steps are never taken back
      lastTail = tail;
      while (fifo.canRecv()) {
        if (fifo.recvInfo().bytes > shape.slotBytes || fifo.recvInfo().remote != 0) abort();
        fifo.release();
      }
      idle = moved ? 0 : idle + 1;
    }
    conn.checkPeer();  // the sender is gone: reported, never waited on
  } catch (const loom::Error&) {
  }
  return 0;
}
