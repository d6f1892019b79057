#include "algo/simulate.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <tuple>

#include "base/error.h"

namespace loom {
namespace {

struct Msg {
  size_t bytes;
  std::vector<double> data;  // empty when data is not moved
};
using Key = std::tuple<int, int, int>;  // (from, to, connection)

const char* bufName(Buf b) {
  switch (b) {
    case Buf::kSend: return "send";
    case Buf::kRecv: return "recv";
    case Buf::kScratch: return "scratch";
    case Buf::kAbsolute: return "absolute";
    default: return "-";
  }
}

const char* opName(StepOp op) {
  switch (op) {
    case StepOp::kSend: return "send";
    case StepOp::kRecv: return "recv";
    case StepOp::kRecvReduceSend: return "recvReduceSend";
    case StepOp::kRecvReduceCopy: return "recvReduceCopy";
    case StepOp::kRecvReduceCopySend: return "recvReduceCopySend";
    case StepOp::kRecvCopySend: return "recvCopySend";
    case StepOp::kCopy: return "copy";
    case StepOp::kLocalReduce: return "localReduce";
  }
  return "?";
}

// One channel of one rank: where it is in its steps.
struct Cursor {
  int rank;
  size_t channel;
  size_t step = 0;
  size_t off = 0;  // bytes of the current step already moved
};

class Machine {
 public:
  Machine(const std::vector<Plan>& plans, std::vector<SimBuffers>& bufs, const SimOptions& opt)
      : plans_(plans), bufs_(bufs), opt_(opt) {}

  std::string run(std::vector<SimStats>* statsOut) {
    const int n = static_cast<int>(plans_.size());
    if (bufs_.size() != plans_.size())
      return strprintf("%zu plans but %zu ranks' buffers", plans_.size(), bufs_.size());
    if (opt_.eltSize == 0 || opt_.slotBytes == 0 || opt_.slotBytes % opt_.eltSize != 0)
      return strprintf("FIFO slots of %zu bytes do not hold whole %zu-byte elements", opt_.slotBytes, opt_.eltSize);
    stats_.assign(plans_.size(), SimStats{});
    for (SimStats& s : stats_) s.bytesTo.assign(plans_.size(), 0);
    for (int r = 0; r < n; ++r)
      for (size_t c = 0; c < plans_[r].channels.size(); ++c) cursors_.push_back({r, c});
    for (bool progress = true; progress && error_.empty();) {
      progress = false;
      for (Cursor& cur : cursors_)
        while (error_.empty() && !done(cur) && tryPiece(cur)) progress = true;
    }
    if (statsOut) *statsOut = stats_;
    if (!error_.empty()) return error_;
    std::string stuck;
    for (const Cursor& cur : cursors_)
      if (!done(cur)) stuck += (stuck.empty() ? "" : "; ") + waitingFor(cur);
    if (!stuck.empty()) return "no rank can move: " + stuck;
    for (const auto& [k, q] : fifos_)
      if (!q.empty())
        return strprintf("rank %d sent %zu message(s) to rank %d (connection %d) that it never received",
                         std::get<0>(k), q.size(), std::get<1>(k), std::get<2>(k));
    return "";
  }

 private:
  const std::vector<Plan>& plans_;
  std::vector<SimBuffers>& bufs_;
  const SimOptions& opt_;
  std::vector<Cursor> cursors_;
  std::map<Key, std::deque<Msg>> fifos_;
  std::vector<std::vector<double>> spare_;
  std::vector<SimStats> stats_;
  std::string error_;

  const Step& stepOf(const Cursor& c) const { return plans_[c.rank].channels[c.channel].steps[c.step]; }
  bool done(const Cursor& c) const { return c.step >= plans_[c.rank].channels[c.channel].steps.size(); }

  std::string where(const Cursor& c) const {
    const Step& s = stepOf(c);
    return strprintf("rank %d channel %zu step %zu (%s of %zu bytes)", c.rank, c.channel, c.step, opName(s.op),
                     s.bytes);
  }

  std::string waitingFor(const Cursor& c) const {
    const Step& s = stepOf(c);
    if (stepRecvs(s.op)) {
      auto it = fifos_.find({s.recvPeer, c.rank, s.conn});
      if (it == fifos_.end() || it->second.empty())
        return strprintf("%s waits for rank %d (connection %d)", where(c).c_str(), s.recvPeer, s.conn);
    }
    return strprintf("%s waits for room toward rank %d (connection %d)", where(c).c_str(), s.sendPeer, s.conn);
  }

  std::vector<double>* bufferOf(int rank, Buf b) {
    SimBuffers& m = bufs_[static_cast<size_t>(rank)];
    switch (b) {
      case Buf::kSend: return &m.send;
      case Buf::kRecv: return &m.recv;
      case Buf::kScratch: return &m.scratch;
      default: return nullptr;
    }
  }

  // Where the values [off, off + bytes) of a step's buffer reference are (*at: nullptr
  // when data is not moved); false (error_ set) when the plan reaches outside the buffer.
  bool values(const Cursor& c, BufRef ref, size_t off, size_t bytes, double** at) {
    *at = nullptr;
    if (ref.buf == Buf::kNone) return true;
    if (ref.buf == Buf::kAbsolute) {
      error_ = where(c) + ": addresses outside the request's buffers cannot be simulated";
      return false;
    }
    const size_t begin = ref.offset + off, elt = opt_.eltSize;
    if (begin % elt != 0) {
      error_ = strprintf("%s: %s+%zu is not on an element boundary", where(c).c_str(), bufName(ref.buf), begin);
      return false;
    }
    if (!opt_.moveData) return true;
    std::vector<double>* v = bufferOf(c.rank, ref.buf);
    if ((begin + bytes) / elt > v->size()) {
      error_ = strprintf("%s: %s+%zu..%zu lies outside the %zu-byte buffer", where(c).c_str(), bufName(ref.buf),
                         begin, begin + bytes, v->size() * elt);
      return false;
    }
    *at = v->data() + begin / elt;
    return true;
  }

  bool tryPiece(Cursor& c) {
    const Step& s = stepOf(c);
    const bool recvs = stepRecvs(s.op), sends = stepSends(s.op);
    const size_t elt = opt_.eltSize;
    if (s.bytes % elt != 0) {
      error_ = where(c) + strprintf(": not a whole number of %zu-byte elements", elt);
      return false;
    }
    const size_t n = (recvs || sends) ? std::min(opt_.slotBytes, s.bytes - c.off) : s.bytes;
    std::deque<Msg>* in = nullptr;
    std::deque<Msg>* out = nullptr;
    if (recvs) {
      in = &fifos_[{s.recvPeer, c.rank, s.conn}];
      if (in->empty()) return false;
      if (in->front().bytes != n) {
        error_ = strprintf("%s: rank %d sent %zu bytes where %zu were expected", where(c).c_str(), s.recvPeer,
                           in->front().bytes, n);
        return false;
      }
    }
    if (sends) {
      if (s.sendPeer < 0 || s.sendPeer >= static_cast<int>(plans_.size())) {
        error_ = strprintf("%s: sends to rank %d of %zu", where(c).c_str(), s.sendPeer, plans_.size());
        return false;
      }
      out = &fifos_[{c.rank, s.sendPeer, s.conn}];
      if (opt_.depth > 0 && out->size() >= static_cast<size_t>(opt_.depth)) return false;
    }
    double *src, *dst;
    if (!values(c, s.src, c.off, n, &src) || !values(c, s.dst, c.off, n, &dst)) return false;
    Msg msg{n, {}};
    if (sends && !spare_.empty()) {  // a received message's storage, reused
      msg.data = std::move(spare_.back());
      spare_.pop_back();
    }
    if (opt_.moveData) compute(s, src, dst, in ? in->front().data.data() : nullptr, sends ? &msg.data : nullptr,
                               n / elt);
    if (in) {
      if (in->front().data.capacity() > 0) spare_.push_back(std::move(in->front().data));
      in->pop_front();
    }
    SimStats& st = stats_[static_cast<size_t>(c.rank)];
    if (recvs) st.bytesReceived += n;
    if (out) {
      st.bytesSent += n;
      st.bytesTo[static_cast<size_t>(s.sendPeer)] += n;
      out->push_back(std::move(msg));
    }
    ++st.pieces;
    c.off += n;
    if (c.off >= s.bytes) {
      ++st.steps;
      ++c.step;
      c.off = 0;
    }
    return true;
  }

  // One piece of a step, element by element (plan.h's table of step semantics).
  void compute(const Step& s, const double* src, double* dst, const double* in, std::vector<double>* out,
               size_t k) const {
    const bool scaled = opt_.scaledReduction;
    auto pre = [&](double x) { return scaled && !(s.flags & kSrcPartial) ? 2 * x : x; };
    auto post = [&](double x) { return scaled && !(s.flags & kDstPartial) ? x + 0.5 : x; };
    if (out) out->resize(k);
    // A send whose dst is its src (all-gather in place) has nothing to copy.
    const bool sendCopies = s.op == StepOp::kSend && dst && dst != src;
    for (size_t i = 0; i < k; ++i) {
      switch (s.op) {
        case StepOp::kSend:
          (*out)[i] = pre(src[i]);
          if (sendCopies) dst[i] = post(pre(src[i]));
          break;
        case StepOp::kRecv: dst[i] = post(in[i]); break;
        case StepOp::kRecvReduceSend: (*out)[i] = in[i] + pre(src[i]); break;
        case StepOp::kRecvReduceCopy: dst[i] = post(in[i] + pre(src[i])); break;
        case StepOp::kRecvReduceCopySend: {
          const double v = in[i] + pre(src[i]);
          dst[i] = post(v);
          (*out)[i] = v;
          break;
        }
        case StepOp::kRecvCopySend:
          dst[i] = post(in[i]);
          (*out)[i] = in[i];
          break;
        case StepOp::kCopy: dst[i] = post(pre(src[i])); break;
        case StepOp::kLocalReduce: dst[i] = post(dst[i] + pre(src[i])); break;
      }
    }
  }
};

double input(int rank, size_t i) { return static_cast<double>((rank + 1) * 1000 + static_cast<int>(i % 997)); }
constexpr double kUntouched = -1;  // what recv holds where the collective writes nothing

bool reduces(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter || c == Collective::kReduce;
}

// The value rank `r` must hold at recv[i] after the collective (scaled reductions: see
// SimOptions).
double expected(const CollRequest& req, int n, int r, size_t i) {
  auto sum = [&](size_t at) {
    double v = 0;
    for (int q = 0; q < n; ++q) v += input(q, at);
    return 2 * v + 0.5;
  };
  switch (req.coll) {
    case Collective::kAllReduce: return sum(i);
    case Collective::kReduce: return r == req.root ? sum(i) : kUntouched;
    case Collective::kReduceScatter: return sum(static_cast<size_t>(r) * req.count + i);
    case Collective::kAllGather: return input(static_cast<int>(i / req.count), i % req.count);
    case Collective::kBroadcast: return input(req.root, i);
    default: return std::numeric_limits<double>::quiet_NaN();
  }
}

}  // namespace

std::string runPlans(const std::vector<Plan>& plans, std::vector<SimBuffers>& bufs, const SimOptions& opt,
                     std::vector<SimStats>* stats) {
  for (const Plan& p : plans)
    if (p.sizeFree()) return "a size-free plan: write it out for a count first (expandPlan)";
  return Machine(plans, bufs, opt).run(stats);
}

std::vector<int> JobContexts::contiguous(int nranks, int nhosts) {
  LOOM_CHECK_ARG(nranks >= 1 && nhosts >= 1 && nhosts <= nranks, "%d ranks cannot fill %d hosts", nranks, nhosts);
  std::vector<int> hostOf(static_cast<size_t>(nranks));
  for (int h = 0; h < nhosts; ++h)
    for (int r = nranks * h / nhosts; r < nranks * (h + 1) / nhosts; ++r) hostOf[static_cast<size_t>(r)] = h;
  return hostOf;
}

JobContexts::JobContexts(const std::vector<int>& hostOf, const algo::NodeModel& node, size_t slotBytes, int depth,
                         algo::TunerHook* hook) {
  const int n = static_cast<int>(hostOf.size());
  LOOM_CHECK_ARG(n >= 1, "a job needs at least one rank");
  HostLayout layout;
  std::vector<int> ids;  // host id of layout.hosts[h]
  for (int r = 0; r < n; ++r) {
    auto it = std::find(ids.begin(), ids.end(), hostOf[static_cast<size_t>(r)]);
    if (it == ids.end()) {
      ids.push_back(hostOf[static_cast<size_t>(r)]);
      layout.hosts.emplace_back();
      it = ids.end() - 1;
    }
    layout.hosts[static_cast<size_t>(it - ids.begin())].push_back(r);
  }
  // The ranking is the same on every rank: tune once, copy it.
  PlanContext tuned;
  tuned.nranks = n;
  tuned.layout = layout;
  tuned.slotBytes = slotBytes;
  tuned.depth = depth;
  tuned.loadAlgoFilter();
  tuned.loadChannelBounds();
  tuned.loadTuning(node, hook);
  for (int r = 0; r < n; ++r) {
    auto ctx = std::make_unique<PlanContext>(tuned);
    ctx->rank = r;
    for (size_t h = 0; h < layout.hosts.size(); ++h) {
      auto at = std::find(layout.hosts[h].begin(), layout.hosts[h].end(), r);
      if (at == layout.hosts[h].end()) continue;
      ctx->layout.host = static_cast<int>(h);
      ctx->layout.local = static_cast<int>(at - layout.hosts[h].begin());
    }
    ctx->loadRings();
    ctx_.push_back(std::move(ctx));
  }
}

SimReport simulate(const CollRequest& req, const JobContexts& job, size_t maxElements) {
  const Selection sel = select(req, job[0]);
  for (int r = 1; r < job.nranks(); ++r)
    if (!(select(req, job[r]) == sel)) {
      SimReport report;
      report.selection = sel;
      report.error = strprintf("rank %d selects differently from rank 0", r);
      return report;
    }
  return simulate(req, job, sel, maxElements);
}

SimReport simulate(const CollRequest& req, const JobContexts& job, const Selection& sel, size_t maxElements) {
  SimReport report;
  report.selection = sel;
  const int n = job.nranks();
  const PlanContext& ctx0 = job[0];
  const size_t bytes = modelBytes(req.coll, req.count * req.eltSize, n);
  algo::Estimate e = algo::estimate(ctx0.node, req.coll, sel.algorithm, sel.protocol, bytes, n,
                                    std::max(1, ctx0.layout.nhosts()));
  if (e.feasible) report.predictedUs = e.us;
  for (int r = 0; r < n; ++r) report.plans.push_back(expandPlan(buildPlan(req, job[r], sel), req.count, req.eltSize));

  const size_t sendElems = req.coll == Collective::kReduceScatter ? req.count * n : req.count;
  const size_t recvElems = req.coll == Collective::kAllGather ? req.count * n : req.count;
  size_t total = 0;
  for (const Plan& p : report.plans) total += sendElems + recvElems + p.scratchBytes / req.eltSize + 1;
  SimOptions opt;
  opt.slotBytes = ctx0.slotBytes;
  opt.depth = ctx0.depth;
  opt.eltSize = req.eltSize;
  opt.scaledReduction = reduces(req.coll);
  opt.moveData = total <= maxElements;
  report.dataChecked = opt.moveData;

  std::vector<SimBuffers> bufs(static_cast<size_t>(n));
  if (opt.moveData)
    for (int r = 0; r < n; ++r) {
      SimBuffers& b = bufs[static_cast<size_t>(r)];
      b.send.resize(sendElems);
      for (size_t i = 0; i < sendElems; ++i)
        b.send[i] = req.coll == Collective::kBroadcast && r != req.root ? -7 : input(r, i);
      b.recv.assign(recvElems, kUntouched);
      // Scratch starts as garbage, as the communicator's does: reading it before writing
      // poisons the result.
      const Plan& p = report.plans[static_cast<size_t>(r)];
      b.scratch.assign((p.scratchBytes + req.eltSize - 1) / req.eltSize, std::numeric_limits<double>::quiet_NaN());
    }
  report.error = runPlans(report.plans, bufs, opt, &report.stats);
  if (!report.error.empty() || !opt.moveData) return report;
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < recvElems; ++i) {
      const double want = expected(req, n, r, i), got = bufs[static_cast<size_t>(r)].recv[i];
      if (got != want) {  // NaN (scratch read before written) never equals
        report.error = strprintf("rank %d holds %g at element %zu of its receive buffer where %g belongs", r, got, i,
                                 want);
        return report;
      }
    }
  return report;
}

}  // namespace loom
