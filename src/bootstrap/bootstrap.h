// Out-of-band channel among the ranks of one communicator: rendezvous through the root,
// then authenticated rank-to-rank send/recv with tags, all-gather and barrier. Used for
// setup (addresses, transport handshakes), never on the data path.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "base/socket.h"
#include "bootstrap/unique_id.h"

namespace loom {

struct PeerHello;

class Bootstrap {
 public:
  // Joins the job: connects to the root (retrying until it is up), proves the secret,
  // waits for every rank's address. Bounded by LOOM_BOOTSTRAP_TIMEOUT.
  Bootstrap(const JobId& job, int rank, int nranks, const std::atomic<bool>* abortFlag);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const JobId& job() const { return job_; }
  const NetInterface& iface() const { return iface_; }
  const SocketAddr& peerAddr(int r) const { return peers_[r]; }

  void send(int peer, uint32_t tag, const void* data, size_t len);
  // Receives exactly `len` bytes sent with `tag` by `peer`.
  void recv(int peer, uint32_t tag, void* data, size_t len);
  // allData holds nranks slots of `bytes`; this rank's slot is filled on entry.
  void allGather(void* allData, size_t bytes);
  void barrier();

  // Called about every 100 ms while this rank waits for `peer`; throws (kRemoteError) when
  // it knows the peer is dead, so waits on a dead peer end early rather than time out.
  void setLivenessCheck(std::function<void(int peer)> check) { liveness_ = std::move(check); }

  // Throws if the communicator was aborted or `peer` is known to be dead (the liveness
  // check): for waits outside the bootstrap that depend on a peer (transport setup).
  void checkPeer(int peer, const char* what);

  // Status queries (a peer diagnosing a stall, loom-status): answered on the listener's own
  // thread with what `source` returns, so a rank busy or stuck in a collective still
  // answers (a stopped process does not). They authenticate with statusKey(), not the
  // job's secret, so a key given to a monitoring tool opens nothing else.
  // `source(detail)` gets the query's detail level (the hello's connId: 0 = brief).
  void setStatusSource(std::function<std::string(uint64_t detail)> source);
  // Asks `peer` for its status; "" when it does not answer within timeoutSec.
  std::string queryStatus(int peer, double timeoutSec, uint64_t detail = 0);
  // What a query to `peer` needs, so that it can be made without this object (which its
  // communicator's destroy may free meanwhile).
  struct StatusTarget {
    SocketAddr addr;
    JobId statusJob;
    int from = 0, to = 0;
  };
  StatusTarget statusTarget(int peer) const { return {peers_[peer], statusJob_, rank_, peer}; }
  static std::string queryStatusAt(const StatusTarget& t, double timeoutSec, uint64_t detail);
  // HMAC(secret, "loom-status-key"): what a status query proves it knows.
  static std::array<uint8_t, 32> statusKey(const JobId& job);
  // Status replies: a 4-byte little-endian length, then the payload. (PeerHello kinds:
  // 2 bootstrap, 3 socket stream, 4 net stream, 5 UCX control, 6 verbs control, 7 status.)
  static constexpr uint16_t kStatusHelloKind = 7;

  // Tags below this are free for callers; the bootstrap's own collectives use the rest.
  static constexpr uint32_t kUserTagLimit = 0x80000000u;

 private:
  struct Msg {
    uint32_t tag;
    std::vector<uint8_t> data;
  };
  Socket& sendSocket(int peer);
  Socket& recvSocket(int peer, Deadline deadline);
  void acceptSome(int waitMs);
  void readMsg(int peer, Deadline deadline);
  void checkAbort(const char* what, int peer) const;
  void probePeer(int peer);  // throws when nothing listens at the peer's address any more
  Deadline opDeadline() const;

  JobId job_;
  int rank_;
  int nranks_;
  const std::atomic<bool>* abort_;
  NetInterface iface_;
  Socket listener_;
  std::unique_ptr<class HelloAcceptor> acceptor_;
  std::vector<SocketAddr> peers_;
  std::vector<Socket> out_;
  std::vector<Socket> in_;
  std::vector<std::deque<Msg>> stash_;
  uint32_t collSeq_ = 0;
  std::recursive_mutex mu_;
  double timeoutSec_;
  std::function<void(int)> liveness_;
  JobId statusJob_;  // the job with statusKey() for a secret
  std::mutex statusMu_;
  std::function<std::string(uint64_t)> statusSource_;
  bool serveStatus(const PeerHello& h, const Socket& s);
};

}  // namespace loom
