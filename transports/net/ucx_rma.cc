// UCX with RMA put (NCCL_NET=UCX_RMA): the receiver exposes its buffers and writes a
// clear-to-send record for every receive it posts; the sender puts the message straight
// into the receive buffer, then (fenced behind it) a completion flag into the receiver's
// flag array, which the receiver polls. Receiver-to-sender records (rkeys, clear-to-send)
// travel on the connection's control stream, so the receiver needs no endpoint of its
// own; the sender's goodbye goes the other way, as with tagged messages.
#include "transports/net/ucx_comm.h"

#ifdef LOOM_UCX_HEADERS
#include <atomic>
#include <cstring>
#include <functional>
#include <map>

namespace loom::ucxnet {
namespace {

constexpr uint32_t kRecordMagic = 0x4c555252;  // "LURR"
enum RecordType : uint32_t { kRkey = 1, kCts = 2 };
constexpr uint64_t kFlagsId = 0;  // the receiver's flag array
constexpr uint64_t kNoRegion = UINT64_MAX;
// A completion flag is one 8-byte word, written by one aligned put so that it lands whole:
// the message's number + 1 (low 24 bits) above its size (40 bits; all ones: it did not fit).
constexpr int kSizeBits = 40;
constexpr uint64_t kOversize = (uint64_t{1} << kSizeBits) - 1;
constexpr uint64_t kSeqMask = (uint64_t{1} << (64 - kSizeBits)) - 1;
uint64_t flagWord(uint64_t seq, uint64_t bytes) {
  return (((seq + 1) & kSeqMask) << kSizeBits) | (bytes < kOversize ? bytes : kOversize);
}
constexpr uint32_t kMaxRkeyBytes = 64 << 10;

// Receiver to sender. kRkey: region `id` starts at `addr` and its packed rkey (`bytes`
// long) follows. kCts: receive `seq` may take `bytes` at `addr`, inside region `id`.
struct Record {
  uint32_t magic;
  uint32_t type;
  uint64_t id;
  uint64_t addr;
  uint64_t bytes;
  uint64_t seq;
};

// A region of the receiver's memory mapped for remote puts, its rkey announced.
struct Region {
  ucp_mem_h memh = nullptr;
  uint64_t id = 0;
  uintptr_t base = 0;
  size_t len = 0;
};

class RmaMr : public NetMr {
 public:
  RmaMr(const Region* r, std::function<void()> release) : region(r), release_(std::move(release)) {}
  ~RmaMr() override {
    if (release_) release_();
  }
  const Region* region;  // null: nothing registered (size 0); the comm owns it

 private:
  std::function<void()> release_;  // unmaps the region
};

class RmaRecvComm : public NetRecvComm, UcxComm {
 public:
  RmaRecvComm(std::shared_ptr<Worker> w, Socket control, std::string who)
      : UcxComm(std::move(w), std::move(control), 0, std::move(who)) {
    std::lock_guard<std::mutex> lk(w_->mu);
    memset(flags_, 0, sizeof(flags_));
    announce(map(reinterpret_cast<uintptr_t>(flags_), sizeof(flags_)));
  }

  ~RmaRecvComm() override {
    std::lock_guard<std::mutex> lk(w_->mu);
    for (UcxRequest& r : reqs_)
      if (r.busy) dropRegion(r.region);
    for (auto& [id, r] : regions_) api_.memUnmap(w_->context, r.memh);
  }

  std::unique_ptr<NetMr> regMr(void* data, size_t bytes, NetMemType type) override {
    if (type != NetMemType::kHost)
      LOOM_THROW(kInvalidUsage, "%s: the UCX backend moves host memory only (CUDA memory needs "
                 "the CUDA executor, not built yet)", who_.c_str());
    std::lock_guard<std::mutex> lk(w_->mu);
    if (!data || bytes == 0) return std::make_unique<RmaMr>(nullptr, nullptr);
    const Region& r = map(reinterpret_cast<uintptr_t>(data), bytes);
    announce(r);
    uint64_t id = r.id;
    return std::make_unique<RmaMr>(&r, [this, id] {
      std::lock_guard<std::mutex> g(w_->mu);
      dropRegion(id);
    });
  }

  // The request slot is the receive's number modulo the depth, as is its flag: a flag is
  // written only after its clear-to-send, which goes out only once the slot's previous
  // receive was reported.
  NetRequest* irecv(void* data, size_t capacity, int, NetMr* mr) override {
    std::lock_guard<std::mutex> lk(w_->mu);
    UcxRequest& r = reqs_[posted_ % kMaxRequests];
    if (r.busy) return nullptr;
    auto at = reinterpret_cast<uintptr_t>(data);
    const Region* region = mr ? static_cast<RmaMr*>(mr)->region : nullptr;
    uint64_t own = kNoRegion;
    // A receive outside its registration (tests post such) gets a region of its own,
    // unmapped once the receive is over.
    if (capacity > 0 && !(region && at >= region->base && at + capacity <= region->base + region->len)) {
      region = &map(at, capacity);
      announce(*region);
      own = region->id;
    }
    Record c{kRecordMagic, kCts, region ? region->id : kFlagsId, at, capacity, posted_};
    // A sender that closed cannot take it: the receive then fails in test(), and only if
    // it is one the sender's goodbye does not cover.
    send(&c, sizeof(c));
    r = UcxRequest{};
    r.region = own;
    r.busy = true;
    r.seq = posted_++;
    r.bytes = capacity;
    return &r;
  }

  NetRequest* iflush(void*, size_t, NetMr*) override { return nullptr; }

  bool test(NetRequest* req, size_t* bytes) override {
    std::lock_guard<std::mutex> lk(w_->mu);
    UcxRequest* r = check(req);
    const uint64_t* f = &flags_[r->seq % kMaxRequests];
    if (!arrived(f, r->seq)) {
      w_->progress();
      if (!arrived(f, r->seq)) {
        checkSender(r->seq);
        return false;
      }
    }
    uint64_t got = __atomic_load_n(f, __ATOMIC_ACQUIRE) & kOversize;
    r->busy = false;
    dropRegion(r->region);
    r->region = kNoRegion;
    if (got == kOversize)
      LOOM_THROW(kRemoteError, "%s: a message larger than its %zu-byte receive was sent",
                 who_.c_str(), r->bytes);
    *bytes = got;
    return true;
  }

 private:
  static bool arrived(const uint64_t* f, uint64_t seq) {
    return (__atomic_load_n(f, __ATOMIC_ACQUIRE) >> kSizeBits) == ((seq + 1) & kSeqMask);
  }

  // Unmaps a region (the sender's rkey for it is never used again: ids are not reused).
  void dropRegion(uint64_t id) {
    if (id == kNoRegion) return;
    auto it = regions_.find(id);
    if (it == regions_.end()) return;
    api_.memUnmap(w_->context, it->second.memh);
    regions_.erase(it);
  }

  const Region& map(uintptr_t base, size_t len) {
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = reinterpret_cast<void*>(base);
    p.length = len;
    Region r;
    r.id = nextId_++;
    r.base = base;
    r.len = len;
    ucs_status_t s = api_.memMap(w_->context, &p, &r.memh);
    if (s != UCS_OK)
      LOOM_THROW(kSystemError, "%s: ucp_mem_map of %zu bytes failed: %s", who_.c_str(), len,
                 api_.statusText(s).c_str());
    return regions_[r.id] = r;
  }

  void announce(const Region& r) {
    void* blob = nullptr;
    size_t n = 0;
    ucs_status_t s = api_.rkeyPack(w_->context, r.memh, &blob, &n);
    if (s != UCS_OK)
      LOOM_THROW(kSystemError, "%s: ucp_rkey_pack failed: %s", who_.c_str(),
                 api_.statusText(s).c_str());
    Record k{kRecordMagic, kRkey, r.id, r.base, n, 0};
    std::vector<char> msg(sizeof(k) + n);
    memcpy(msg.data(), &k, sizeof(k));
    memcpy(msg.data() + sizeof(k), blob, n);
    api_.rkeyBufferRelease(blob);
    send(msg.data(), msg.size());
  }

  // Writes a record to the sender. One that closed cannot take it: that is not an error
  // here; a receive that needed the sender then fails in test(), as its goodbye says.
  void send(const void* p, size_t n) {
    try {
      control_.sendAll(p, n, Deadline::in(10), who_.c_str());
    } catch (const Error&) {
    }
  }

  alignas(64) uint64_t flags_[kMaxRequests];
  std::map<uint64_t, Region> regions_;
  uint64_t nextId_ = kFlagsId;
};

class RmaSendComm : public UcxSender {
 public:
  RmaSendComm(std::shared_ptr<Worker> w, ucp_ep_h ep, bool peerMode, EpError* err,
              Socket control, std::string who)
      : UcxSender(std::move(w), ep, peerMode, err, std::move(control), 0, std::move(who)) {}
  ~RmaSendComm() override { close(); }

  // Waits (returns null) until the receiver's clear-to-send for this message is here.
  NetRequest* isend(const void* data, size_t bytes, int, NetMr*) override {
    std::lock_guard<std::mutex> lk(w_->mu);
    failIfBroken(0);
    UcxRequest& r = reqs_[posted_ % kMaxRequests];
    Record& c = cts_[posted_ % kMaxRequests];
    if (r.busy || c.magic != kRecordMagic || c.seq != posted_) {
      readRecords();
      if (r.busy || c.magic != kRecordMagic || c.seq != posted_) return nullptr;
    }
    r = UcxRequest{};
    r.busy = true;
    r.seq = posted_;
    r.bytes = bytes;
    r.flag = flagWord(posted_, bytes <= c.bytes ? bytes : kOversize);
    if (bytes > 0 && bytes <= c.bytes) r.ucx = put(data, bytes, c.addr, rkey(c.id));
    // The flag lands after the data: the fence orders the two puts at the receiver.
    ucs_status_t s = api_.workerFence(w_->worker);
    if (s != UCS_OK)
      LOOM_THROW(kRemoteError, "%s: ucp_worker_fence failed: %s", who_.c_str(),
                 api_.statusText(s).c_str());
    const Rkey& f = rkey(kFlagsId);
    r.ucx2 = put(&r.flag, sizeof(r.flag), f.base + (posted_ % kMaxRequests) * sizeof(r.flag),
                 f);
    if (!r.ucx && !r.ucx2) ++completed_;  // both puts complete already
    c.magic = 0;
    ++posted_;
    return &r;
  }

 private:
  struct Rkey {
    ucp_rkey_h rkey = nullptr;
    uint64_t base = 0;
  };

  const Rkey& rkey(uint64_t id) {
    auto it = rkeys_.find(id);
    if (it == rkeys_.end())
      LOOM_THROW(kRemoteError, "%s: the receiver named region %llu before announcing it",
                 who_.c_str(), static_cast<unsigned long long>(id));
    return it->second;
  }

  void* put(const void* data, size_t bytes, uint64_t addr, const Rkey& k) {
    ucp_request_param_t p{};
    ucs_status_ptr_t s = api_.putNbx(ep_, data, bytes, addr, k.rkey, &p);
    if (UCS_PTR_IS_ERR(s))
      LOOM_THROW(kRemoteError, "%s: ucp_put_nbx failed: %s", who_.c_str(),
                 api_.statusText(UCS_PTR_STATUS(s)).c_str());
    return s;  // null: complete already
  }

  // Takes in what the receiver wrote: rkeys (unpacked for this endpoint) and
  // clear-to-send records (kept by message number).
  void readRecords() {
    while (!eof_) {
      size_t want = sizeof(Record);
      if (have_ >= sizeof(Record)) {
        Record h;
        memcpy(&h, buf_.data(), sizeof(h));
        if (h.magic != kRecordMagic || (h.type != kRkey && h.type != kCts) ||
            (h.type == kRkey && (h.bytes == 0 || h.bytes > kMaxRkeyBytes)))
          LOOM_THROW(kRemoteError, "%s: malformed record on the control stream", who_.c_str());
        if (h.type == kRkey) want += h.bytes;
        if (have_ >= want) {
          take(h);
          memmove(buf_.data(), buf_.data() + want, have_ - want);
          have_ -= want;
          continue;
        }
      }
      if (buf_.size() < want) buf_.resize(want);
      bool eof = false;
      size_t n = 0;
      try {
        n = control_.tryRecv(buf_.data() + have_, want - have_, who_.c_str(), &eof);
      } catch (const Error&) {
        eof = true;
      }
      if (eof) markEnded();
      if (n == 0) return;
      have_ += n;
    }
  }

  void take(const Record& h) {
    if (h.type == kCts) {
      if (h.seq < posted_ || h.seq >= posted_ + kMaxRequests)
        LOOM_THROW(kRemoteError, "%s: clear-to-send for message %llu out of order",
                   who_.c_str(), static_cast<unsigned long long>(h.seq));
      cts_[h.seq % kMaxRequests] = h;
      return;
    }
    Rkey k;
    k.base = h.addr;
    ucs_status_t s = api_.epRkeyUnpack(ep_, buf_.data() + sizeof(Record), &k.rkey);
    if (s != UCS_OK)
      LOOM_THROW(kRemoteError, "%s: ucp_ep_rkey_unpack failed: %s (no UCX transport can put "
                 "into the receiver's memory? check UCX_TLS)", who_.c_str(),
                 api_.statusText(s).c_str());
    if (auto it = rkeys_.find(h.id); it != rkeys_.end()) api_.rkeyDestroy(it->second.rkey);
    rkeys_[h.id] = k;
  }

  // Failure checks read the stream at most every millisecond (a system call each);
  // isend() reads it at once when the clear-to-send it needs is not here yet.
  bool controlEnded() override {
    uint64_t now = nowNs();
    if (now - lastPoll_ >= 1000000) {
      lastPoll_ = now;
      readRecords();
    }
    return eof_;
  }
  // An rkey goes only once no operation of UCP's uses it: after an unclean close some
  // may, so they are left (a few bytes each, on the abort path only).
  void releaseRemote(bool clean) override {
    if (clean)
      for (auto& [id, k] : rkeys_) api_.rkeyDestroy(k.rkey);
    rkeys_.clear();
  }

  Record cts_[kMaxRequests] = {};
  std::map<uint64_t, Rkey> rkeys_;
  std::vector<char> buf_;  // records being read
  size_t have_ = 0;
};

}  // namespace

std::unique_ptr<NetSendComm> makeRmaSendComm(std::shared_ptr<Worker> w, ucp_ep_h ep,
                                             bool peerMode, EpError* err, Socket control,
                                             std::string who) {
  return std::make_unique<RmaSendComm>(std::move(w), ep, peerMode, err, std::move(control),
                                       std::move(who));
}

std::unique_ptr<NetRecvComm> makeRmaRecvComm(std::shared_ptr<Worker> w, Socket control,
                                             std::string who) {
  return std::make_unique<RmaRecvComm>(std::move(w), std::move(control), std::move(who));
}

}  // namespace loom::ucxnet
#endif
