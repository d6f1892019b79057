// libFuzzer target: the bootstrap listener of a live rank. A two-rank communicator (ranks
// as threads of this process) is made once; each input is a stranger's connection to
// rank 0's bootstrap listener, after which both ranks run an out-of-band barrier, during
// which rank 0 accepts, reads and drops the stranger. Every 128 inputs (and at exit) an
// all-reduce on the pair must still give the right answer. (The transport listener is
// read only while connections are being made; its hello is the PeerHello that
// peer_hello_fuzz covers, and its stream format is socket_stream_fuzz's.)
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "api/comm.h"
#include "fuzz/fuzz_net.h"

namespace {

ncclComm_t gComm[2];
// Never destroyed: rank 1's thread still waits on them while the process exits.
std::mutex& gMu = *new std::mutex;
std::condition_variable& gCv = *new std::condition_variable;
uint64_t gAsked = 0, gDone = 0;  // steps requested of rank 1 / finished by it
enum class Work { kBarrier, kAllReduce } gWork;
bool gOk = true;
uint64_t gInputs = 0, gUnread = 0;

bool allReduce(int rank) {
  std::vector<int64_t> v(4099);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (rank + 1) * static_cast<int64_t>(i);
  if (ncclAllReduce(v.data(), v.data(), v.size(), ncclInt64, ncclSum, gComm[rank], nullptr) != ncclSuccess) {
    fprintf(stderr, "peer_port_fuzz: rank %d all-reduce failed: %s\n", rank, ncclGetLastError(gComm[rank]));
    return false;
  }
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != 3 * static_cast<int64_t>(i)) {
      fprintf(stderr, "peer_port_fuzz: rank %d all-reduce [%zu] = %lld\n", rank, i, static_cast<long long>(v[i]));
      return false;
    }
  return true;
}

bool step(int rank, Work w) {
  if (w == Work::kAllReduce) return allReduce(rank);
  try {
    gComm[rank]->core->bootstrap().barrier();
  } catch (const std::exception& e) {
    fprintf(stderr, "peer_port_fuzz: rank %d barrier failed: %s\n", rank, e.what());
    return false;
  }
  return true;
}

// Rank 1 does whatever rank 0 (the fuzzer's thread) asks for.
void rank1Loop() {
  uint64_t seen = 0;
  for (;;) {
    Work w;
    {
      std::unique_lock<std::mutex> lock(gMu);
      gCv.wait(lock, [&] { return gAsked > seen; });
      w = gWork;
    }
    bool ok = step(1, w);
    std::lock_guard<std::mutex> lock(gMu);
    gOk &= ok;
    gDone = ++seen;
    gCv.notify_all();
  }
}

void together(Work w) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(gMu);
    gWork = w;
    ticket = ++gAsked;
    gCv.notify_all();
  }
  bool ok = step(0, w);
  std::unique_lock<std::mutex> lock(gMu);
  gCv.wait(lock, [&] { return gDone >= ticket; });
  if (!ok || !gOk) abort();
}

void report() {
  fprintf(stderr, "peer_port_fuzz: %llu strangers, %llu not yet read by rank 0 after a barrier\n",
          static_cast<unsigned long long>(gInputs), static_cast<unsigned long long>(gUnread));
  together(Work::kAllReduce);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("NCCL_DEBUG", "", 1);
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) abort();
  std::thread t([&] {
    if (ncclCommInitRank(&gComm[1], 2, id, 1) != ncclSuccess) abort();
  });
  if (ncclCommInitRank(&gComm[0], 2, id, 0) != ncclSuccess) abort();
  t.join();
  std::thread(rank1Loop).detach();
  together(Work::kAllReduce);
  atexit(report);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const loom::SocketAddr& listener = gComm[0]->core->bootstrap().peerAddr(0);
  int fd = loomfuzz::connectTo(listener);
  if (fd < 0) {
    fprintf(stderr, "peer_port_fuzz: cannot connect to rank 0's bootstrap listener %s: %s\n",
            listener.str().c_str(), strerror(errno));
    abort();
  }
  loomfuzz::sendSome(fd, data, size, false);
  shutdown(fd, SHUT_WR);
  // Rank 0 reads strangers while it waits for out-of-band messages.
  bool closed = false;
  for (int i = 0; i < 3 && !closed; ++i) {
    together(Work::kBarrier);
    closed = loomfuzz::waitClosed(fd, i == 2 ? 3000 : 50);
  }
  gUnread += !closed;
  close(fd);
  if (++gInputs % 128 == 0) together(Work::kAllReduce);
  return 0;
}
