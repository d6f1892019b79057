// The generic network transport: one connection type that pumps FIFO slots through any
// NetBackend. The sender's pump posts each published slot as one isend and releases it
// to the executor once the backend reports it sent; the receiver's pump keeps an irecv
// posted into every free slot and publishes slots in order as they complete. Both FIFOs
// live in local memory, so the executor's protocol is the one it runs over shm.
//
// Chosen for pairs of ranks that shm does not serve when NCCL_NET names a backend;
// otherwise inert (the built-in socket transport carries those pairs).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "base/error.h"
#include "base/time.h"
#include "transports/net/net_backend.h"
#include "transports/registry.h"

namespace loom {

// Where a network connection's FIFO lives when its owner provides it (the device
// executor's: the control block in pinned host memory mapped for the GPU, the slots there
// too or in GPU memory that the backend reaches directly, GPUDirect RDMA). Null: host
// memory of the connection's own (the host engine's).
struct NetFifoMemory {
  FifoCtrl* ctrl = nullptr;  // host address, zeroed, as long as the connection
  char* slots = nullptr;     // depth * slotBytes, where the backend reads or writes
  NetMemType type = NetMemType::kHost;  // kCuda: a receiver flushes (iflush) before publishing
  int dmabufFd = -1;         // kCuda: the slots' DMA-BUF (-1: none), registered as such
  uint64_t dmabufOffset = 0;
};

class NetConnection : public Connection {
 public:
  // Exactly one of `send` / `recv` is set: the side of the connection this rank holds.
  NetConnection(int peer, const PeerInfo& info, FifoShape shape, const std::string& transport,
                std::unique_ptr<NetSendComm> send, std::unique_ptr<NetRecvComm> recv,
                const std::string& where, const NetFifoMemory* memory = nullptr);
  // A sender whose connect is still under way: the proxy thread finishes it. Loom makes
  // every connection of a communicator before it accepts any, and some backends' connect
  // completes only once the peer's accept has progressed, so it cannot be waited for here.
  NetConnection(int peer, const PeerInfo& info, FifoShape shape, const std::string& transport,
                std::shared_ptr<NetBackend> backend, int dev, const NetHandle& handle,
                std::unique_ptr<NetStage> stage, double timeoutSec, const std::string& where,
                const NetFifoMemory* memory = nullptr);
  ~NetConnection() override;
  // The backend's error, if it has failed (the device executor's watchdog asks).
  std::optional<Error> failure() const;

  bool needsProgress() const override { return true; }
  // The communicator's proxy thread pumps it; mu_ keeps close() and checkPeer() on the
  // executor's thread out of a pump in progress.
  bool progressOnProxy() const override { return true; }
  bool progress() override;
  // The backend's error, once the executor waits on this connection. A receiver keeps
  // receives posted ahead, so a peer that finished and closed is an error only when this
  // side still expects data.
  void checkPeer() const override;
  void awaitConnected() const override;
  void close() override;

 private:
  bool pumpSend();
  bool pumpRecv();
  void allocate(FifoShape shape, const NetFifoMemory* memory);
  void attach();  // registers the FIFO's slots with the comm now held
  uint64_t flushed(uint64_t received);  // how many received steps the GPU may read
  bool finishConnect();
  Error located(const Error& e) const;  // e, naming this connection (describe())

  struct PendingConnect {
    std::shared_ptr<NetBackend> backend;
    int dev;
    NetHandle handle;
    std::unique_ptr<NetStage> stage;
    double timeoutSec;
    Deadline deadline;
  };
  std::unique_ptr<PendingConnect> pending_;

  bool sender_;
  std::unique_ptr<NetSendComm> send_;
  std::unique_ptr<NetRecvComm> recv_;
  std::unique_ptr<NetMr> mr_;  // the FIFO's slots, registered with the comm
  void* mem_ = nullptr;        // the FIFO, when the connection allocated it
  NetFifoMemory memory_;       // where the FIFO lives
  NetRequest* flushReq_ = nullptr;  // kCuda receiver: the flush in flight ...
  uint64_t flushing_ = 0;           // ... of the steps below this
  uint64_t flushed_ = 0;            // steps received and flushed
  std::optional<Error> recvError_;  // a receive failed: raised once what came before is published
  std::optional<Error> postError_;  // a receive failed to post: raised once those posted are in
  NetRequest* reqs_[kMaxFifoDepth] = {};
  uint64_t posted_ = 0;  // steps handed to the backend
  uint64_t done_ = 0;    // steps the backend completed (published to the FIFO)
  std::optional<Error> error_;
  std::atomic<bool> failed_{false};  // error_ is set (failure() reads it without mu_)
  mutable std::mutex mu_;  // progress() vs close() / checkPeer()
};

std::unique_ptr<Transport> makeNetTransport(const TransportContext& ctx);

// LOOM_NET_CONNECT_TIMEOUT: seconds a backend may take to connect or accept a connection.
double netConnectTimeoutSec();
// The connection `listen` accepts from `peer`, polled until it comes: throws when the peer is
// gone (unless its connection may still be on its way) or after LOOM_NET_CONNECT_TIMEOUT.
std::unique_ptr<NetRecvComm> netAccept(Bootstrap& bs, int peer, const char* what, NetListenComm& listen);

// Rails: the device (NIC) of a connection among a backend's `devices`, picked by the
// receiver; the sender uses the same index (rail-aligned: both ends on NIC i), folded into
// its own count of devices. Local rank o's first channel is on NIC o (on rail-optimised
// hosts local rank o drives GPU o, whose closest NIC is NIC o, as the topology's rails
// say); its further channels step by the host's rank count, so a host's ranks spread
// their channels over every NIC and never share one while others idle.
inline int netRail(int localRank, int localRanks, int connIndex, int devices) {
  return devices > 1 ? (localRank + connIndex * localRanks) % devices : 0;
}
// The device executor's rails (engine/device_net.h): the same, starting from the NIC closest
// to the rank's GPU (`gpuRail`, the topology's) instead of the local rank.
inline int netGpuRail(int gpuRail, int localRanks, int connIndex, int devices) {
  return devices > 1 ? (gpuRail + connIndex * localRanks) % devices : 0;
}

}  // namespace loom
