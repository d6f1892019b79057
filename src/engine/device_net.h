// The device executor's connections to ranks on other hosts (issue 12): the FIFO protocol of
// kernels/fifo_sync.h again, each end in this rank's own memory, pumped through a network
// backend by a proxy thread of the executor's (transports/net/net_transport.h's
// NetConnection: the host engine's network connection, given this memory). The kernel
// never calls into a network library; the proxy never touches a collective.
//
// Memory: the control block and the end's step counter in pinned host memory mapped for the
// GPU (the kernel publishes and polls the counters there, the proxy reads and writes them);
// the slots there too, or in GPU memory where GPUDirect RDMA applies (gdr()):
//   - a receiver's slots when the backend's device takes CUDA pointers (NCCL_PTR_CUDA or
//     NCCL_PTR_DMABUF) and the GPU-NIC path is no farther than NCCL_NET_GDR_LEVEL: the NIC
//     writes into GPU memory, and every batch of received steps is flushed (iflush) before
//     the kernel may read it;
//   - a sender's slots as well with NCCL_NET_GDR_READ=1 (the NIC reads GPU memory).
// GPU memory is registered through its DMA-BUF (cuMemGetHandleForAddressRange) where the
// backend's device has NCCL_PTR_DMABUF and the driver gives one, else as CUDA memory.
//
// The backend: NCCL_NET's, else the first net plugin that starts, else verbs where an RDMA
// port is active (as the host engine chooses), else Loom's TCP backend ("Socket").
// Rails: a receiving end's first connection is on the NIC closest to this rank's GPU (the
// topology's rail, matched to the backend's devices by name), further ones step by the
// host's rank count; where the topology does not place the GPU or its NIC among the
// backend's devices, the local rank stands in for the GPU (as on the host engine). The
// sender uses the receiver's device index (rail-aligned, NCCL_CROSS_NIC's default). One
// instance per communicator; connections live as long as it, and go only once the device is
// idle (the owner synchronizes it).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/cuda_driver.h"
#include "base/error.h"
#include "kernels/cuda/cuda_kernels_abi.h"
#include "transports/connection.h"
#include "transports/net/net_backend.h"
#include "transports/peer_info.h"
#include "transports/proxy.h"

namespace loom {

class Bootstrap;
class NetConnection;

class DeviceNet {
 public:
  using ConnKey = std::pair<int, int>;  // (peer, index)

  // Starts the backend. Throws loom::Error (it cannot start, or has no device).
  DeviceNet(Bootstrap& bs, const cuda::Driver& drv, const std::vector<PeerInfo>& peers, int device,
            FifoShape shape);
  // The device must be idle: stops the proxy, closes the connections, frees their memory.
  ~DeviceNet();
  DeviceNet(const DeviceNet&) = delete;
  DeviceNet& operator=(const DeviceNet&) = delete;

  const std::string& backendName() const { return name_; }

  // Connecting is collective between each pair of ranks, in three phases that every rank
  // runs in this order with the same keys as DeviceFifos::connect (its peer lists the
  // matching ones), the phases of all peers interleaved with the exchanges of local ends:
  // 1. listen: a receiving end per key in `recvs`, its handle sent to the peer;
  // 2. connect: a sending end per key in `sends`, to the handle the peer sent (finished on
  //    the proxy thread where the backend's connect needs the peer's accept);
  // 3. accept: every receiving end of phase 1, once its sender has connected.
  // Each phase returns the ends it made as the kernel's table holds them. `tagOffset`
  // keeps the exchanges of different connection sets apart.
  std::vector<loomCudaFifo> listen(const std::vector<ConnKey>& recvs, int tagOffset);
  std::vector<loomCudaFifo> connectSends(const std::vector<ConnKey>& sends, int tagOffset);
  void accept();

  // A launch queued outside a capture will take `steps` more steps from the receiving end
  // (peer, conn): what failure() compares with what has arrived.
  void expect(int peer, int conn, uint64_t steps);
  // Once every kernel has ended, none stopped early: warns where a receiving end's kernels
  // took another number of steps than expect() counted (a miscount would report a peer's
  // normal close as a failure, or miss a real one).
  void checkCounts() const;
  // A launch was captured into a CUDA graph: its replays take steps no one counts.
  void captured() { captured_ = true; }
  // A connection's failure, as the watchdog reports it, when it concerns a kernel. A
  // sending end that failed has lost a step. A receiving end matters only while a queued
  // kernel still expects steps it has not received (a peer that finished and closed fails
  // the receives posted ahead of its last message, which no kernel needs). Once a launch
  // was captured, steps are not counted: a receiving end's failure is then reported when a
  // kernel is in flight (`inFlight`) and has consumed all it received, for 2 s.
  // nullopt: nothing to report.
  std::optional<Error> failure(bool inFlight);

 private:
  struct End;
  struct Listening;
  End& make(int peer, int conn, bool send, int dev);
  bool gdr(int dev, bool send) const;
  int rail(int conn) const;
  void check(cuda::CuResult r, const char* what) const;

  Bootstrap& bs_;
  const cuda::Driver& drv_;
  std::vector<PeerInfo> peers_;
  int rank_, device_;
  FifoShape shape_;
  int localRank_ = 0, localRanks_ = 1;
  int gdrLevel_;     // NCCL_NET_GDR_LEVEL, as a topo::PathType
  bool gdrRead_;     // NCCL_NET_GDR_READ
  std::vector<int> distance_;  // per backend device: its path from this rank's GPU (topo::PathType)
  int gpuRail_ = -1;           // the backend device of the GPU's closest NIC (-1: not known)
  std::string name_;
  std::shared_ptr<NetBackend> backend_;
  std::mutex mu_;  // ends_ and their connections: connect (a launching thread) vs failure (the watchdog)
  std::vector<std::unique_ptr<End>> ends_;
  std::vector<Listening> listening_;  // phase 1 to 3
  std::atomic<bool> captured_{false};
  Proxy proxy_;  // declared last: stopped before the connections go
};

}  // namespace loom
