// libFuzzer target: the receive sides of both TCP stream formats. A SocketConnection (the
// socket transport) is fed the input through one or two stream sockets (a socketpair
// each, the far end closed after the bytes), while this thread plays the executor and
// releases every step it sees. Then the TCP network backend's receive comm gets the same
// bytes while this thread plays the net transport's pump, keeping receives posted. Any
// byte sequence must end in steps (messages) whose sizes fit their slots (receives), or a
// loom::Error; never a crash, an overrun, or a step published twice.
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "base/error.h"
#include "fuzz/fuzz_net.h"
#include "transports/net/tcp_backend.h"
#include "transports/socket/socket_transport.h"

namespace {

// nstreams socketpairs whose far ends got `bytes` (split as the transport's streams are
// fed) and were closed; returns the near ends.
std::vector<loom::Socket> feed(int nstreams, const std::vector<uint8_t>& bytes) {
  std::vector<loom::Socket> streams;
  std::vector<int> far;
  for (int j = 0; j < nstreams; ++j) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) abort();
    streams.emplace_back(sv[0]);
    far.push_back(sv[1]);
  }
  // Stream 0 gets a prefix of the input, stream 1 (if any) the rest.
  size_t split = nstreams == 1 ? bytes.size() : bytes.size() / 2;
  loomfuzz::sendSome(far[0], bytes.data(), split, false);
  if (nstreams == 2) loomfuzz::sendSome(far[1], bytes.data() + split, bytes.size() - split, false);
  for (int f : far) close(f);
  return streams;
}

// The net transport's pump over the TCP backend: a receive posted into each of `depth`
// slots, completed in order, reposted.
void pumpNet(int nstreams, const loom::FifoShape& shape, const std::vector<uint8_t>& bytes) {
  auto comm = loom::makeTcpRecvComm(feed(nstreams, bytes), "fuzz input");
  std::vector<std::vector<uint8_t>> slots(shape.depth, std::vector<uint8_t>(shape.slotBytes + 64, 0xee));
  std::vector<loom::NetRequest*> reqs(shape.depth);
  auto mr = comm->regMr(nullptr, 0, loom::NetMemType::kHost);
  uint64_t posted = 0, done = 0;
  try {
    for (int idle = 0; idle < 4;) {
      bool moved = false;
      while (posted < done + shape.depth) {
        auto& slot = slots[posted % shape.depth];
        loom::NetRequest* r = comm->irecv(slot.data(), shape.slotBytes, 0, mr.get());
        if (!r) break;
        reqs[posted++ % shape.depth] = r;
      }
      size_t got;
      while (done < posted && comm->test(reqs[done % shape.depth], &got)) {
        auto& slot = slots[done % shape.depth];
        if (got > shape.slotBytes) abort();
        for (size_t i = shape.slotBytes; i < slot.size(); ++i)
          if (slot[i] != 0xee) abort();  // written past the receive
        ++done;
        moved = true;
      }
      idle = moved ? 0 : idle + 1;
    }
  } catch (const loom::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("NCCL_DEBUG", "", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int nstreams = in.ConsumeIntegralInRange<int>(1, 2);
  const loom::FifoShape shape{in.ConsumeIntegralInRange<size_t>(1, 64) * 64, in.ConsumeIntegralInRange<int>(2, 4)};
  std::vector<uint8_t> bytes = in.ConsumeRemainingBytes<uint8_t>();
  std::vector<loom::Socket> streams = feed(nstreams, bytes);

  loom::PeerInfo info{};
  info.rank = 1;
  loom::SocketConnection conn(1, info, shape, false, std::move(streams), "fuzz input");
  loom::FifoEnd& fifo = conn.fifo();
  uint64_t lastTail = 0;
  try {
    for (int idle = 0; idle < 4;) {
      bool moved = conn.progress();
      uint64_t tail = loom::HostAtomics::load(fifo.ctrl->tail);
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
  pumpNet(nstreams, shape, bytes);
  return 0;
}
