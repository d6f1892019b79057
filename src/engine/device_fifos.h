// The device executor's connections (issue 11 items 3 and 4): connection FIFOs in GPU memory,
// laid out as kernels/fifo_sync.h's FifoEndT expects of a device connection. The receiver's
// GPU holds the control block (tail, slot sizes) and the slots, which the sender's kernel
// writes across the link; the sender's GPU holds the head, which the receiver's kernel
// writes. Each side thus polls only its own memory.
//
// A peer in another process reaches the memory through CUDA IPC (cuIpcGetMemHandle of the
// allocation, opened with lazy peer access); a peer in this process (rank threads) takes the
// pointer as it is, its device given peer access to ours at init (engine/device_exec.h).
// Every end also keeps its own step counter in its own GPU's memory: the kernel reads it at
// start and writes it back at the end, so the next launch goes on from there.
//
// A peer on another host is reached through the network instead (engine/device_net.h): each
// end in this rank's own memory, pumped by a proxy thread.
//
// Connections are made on first use of a plan, as the host engine makes its own, and live as
// long as the communicator: the device is synchronized before any of it is unmapped or freed.
#pragma once

#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "base/cuda_driver.h"
#include "kernels/cuda/cuda_kernels_abi.h"
#include "transports/connection.h"

namespace loom {

class Bootstrap;
class DeviceNet;

class DeviceFifos {
 public:
  using ConnKey = std::pair<int, int>;  // (peer, index), as TransportManager names them

  // `sameProcess[r]`: rank r shares this process (plain pointers, no IPC). `setup`: a stream
  // of the executor's own, on `device`, for zeroing the control blocks. `net`: the
  // connections to ranks on other hosts (`remote[r]`), through a network backend; null
  // where every rank is on this host.
  DeviceFifos(Bootstrap& bs, const cuda::Driver& drv, int device, FifoShape shape,
              std::vector<bool> sameProcess, cuda::CuStream setup, DeviceNet* net = nullptr,
              std::vector<bool> remote = {});
  // The device must be idle (the owner synchronizes it): unmaps and frees everything.
  ~DeviceFifos();
  DeviceFifos(const DeviceFifos&) = delete;
  DeviceFifos& operator=(const DeviceFifos&) = delete;

  // Makes the ends not made yet. Collective between each pair: the peer lists the matching
  // keys (our sends are its receives). Throws loom::Error (a driver call failed, a peer sent
  // something that is not an end of this job).
  // `ll`: the LL protocol's connections, others than Simple's (their slots zeroed).
  void connect(std::vector<ConnKey> sends, std::vector<ConnKey> recvs, bool ll);
  // This rank's end of a made connection, as the kernel's table holds it.
  loomCudaFifo end(int peer, int conn, bool send, bool ll) const;

 private:
  struct End {
    cuda::CuDevicePtr own = 0;     // this rank's allocation for the end
    cuda::CuDevicePtr mapped = 0;  // the peer's, opened by IPC (0: none, or a plain pointer)
    loomCudaFifo fifo{};
  };
  struct Msg;

  cuda::CuDevicePtr alloc(size_t bytes, size_t zeroBytes);
  Msg describe(int peer, cuda::CuDevicePtr p) const;
  cuda::CuDevicePtr open(int peer, const Msg& m, End* e);
  void check(cuda::CuResult r, const char* what) const;

  Bootstrap& bs_;
  const cuda::Driver& drv_;
  int device_;
  FifoShape shape_;
  std::vector<bool> sameProcess_;
  cuda::CuStream setup_;
  DeviceNet* net_;
  std::vector<bool> remote_;
  void* zeros_ = nullptr;  // pinned host zeros, the source of every zeroing copy
  std::map<std::tuple<int, int, int>, End> ends_;  // (peer, conn (+256: LL), send)
};

}  // namespace loom
