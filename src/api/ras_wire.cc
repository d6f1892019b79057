#include "api/ras_wire.h"

#include <algorithm>
#include <cstring>

namespace loom::ras {
namespace {

constexpr uint32_t kMagic = 0x4c525031;  // "LRP1"

class Writer {
 public:
  template <class T>
  void put(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void bytes(std::string_view s) { out_.append(s); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <class T>
  bool get(T* v) {
    if (in_.size() < sizeof(T)) return false;
    memcpy(v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  bool bytes(size_t n, std::string* out) {
    if (in_.size() < n) return false;
    out->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool done() const { return in_.empty(); }

 private:
  std::string_view in_;
};

enum : uint8_t { kFinalize = 1, kDestroy = 2, kAbort = 4 };

}  // namespace

std::string encodeProcess(const ProcessRecord& p) {
  Writer w;
  w.put(kMagic);
  std::string_view node(p.node.data(), std::min(p.node.size(), kMaxNodeBytes));
  w.put(static_cast<uint16_t>(node.size()));
  w.bytes(node);
  w.put(p.pid);
  w.put(p.hostHash);
  w.put(p.pidNs);
  w.put(p.cudaDevs);
  w.put(static_cast<uint32_t>(p.comms.size()));
  for (const CommRecord& c : p.comms) {
    w.put(c.hash);
    w.put(c.secondary[0]);
    w.put(c.secondary[1]);
    w.put(c.nranks);
    w.put(static_cast<uint32_t>(c.ranks.size()));
    for (const RankRecord& r : c.ranks) {
      w.put(r.rank);
      w.put(r.cudaDev);
      w.put(r.initState);
      w.put(r.asyncError);
      w.put(static_cast<uint8_t>((r.finalizeCalled ? kFinalize : 0) | (r.destroyFlag ? kDestroy : 0) |
                                 (r.abortFlag ? kAbort : 0)));
      for (uint64_t n : r.collCounts) w.put(n);
    }
  }
  return w.take();
}

bool decodeProcess(std::string_view bytes, ProcessRecord* out) {
  Reader r(bytes);
  uint32_t magic = 0, ncomms = 0;
  uint16_t nodeLen = 0;
  if (!r.get(&magic) || magic != kMagic || !r.get(&nodeLen) || nodeLen > kMaxNodeBytes ||
      !r.bytes(nodeLen, &out->node) || !r.get(&out->pid) || !r.get(&out->hostHash) ||
      !r.get(&out->pidNs) || !r.get(&out->cudaDevs) || !r.get(&ncomms) || ncomms > kMaxComms)
    return false;
  out->comms.clear();
  for (uint32_t i = 0; i < ncomms; ++i) {
    CommRecord c;
    uint32_t nlocal = 0;
    if (!r.get(&c.hash) || !r.get(&c.secondary[0]) || !r.get(&c.secondary[1]) || !r.get(&c.nranks) ||
        c.nranks < 1 || c.nranks > kMaxCommRanks || !r.get(&nlocal) || nlocal > kMaxLocalRanks ||
        nlocal > static_cast<uint32_t>(c.nranks))
      return false;
    c.ranks.resize(nlocal);
    for (RankRecord& k : c.ranks) {
      uint8_t flags = 0;
      if (!r.get(&k.rank) || k.rank < 0 || k.rank >= c.nranks || !r.get(&k.cudaDev) ||
          !r.get(&k.initState) || !r.get(&k.asyncError) || !r.get(&flags) || flags > 7)
        return false;
      k.finalizeCalled = flags & kFinalize;
      k.destroyFlag = flags & kDestroy;
      k.abortFlag = flags & kAbort;
      for (uint64_t& n : k.collCounts)
        if (!r.get(&n)) return false;
    }
    out->comms.push_back(std::move(c));
  }
  return r.done();
}

}  // namespace loom::ras
