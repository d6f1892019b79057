// The collectives that move blocks between ranks rather than reducing one buffer:
// all-gather, reduce-scatter, all-to-all, gather, scatter, send/recv, barrier.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "backend.h"

namespace loom_torch {
namespace {

using c10d::OpType;

void checkCpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), "loom: ", what, ": a ", t.device(), " tensor; the loom ",
              "backend moves CPU tensors (for CUDA tensors use backend \"nccl\" with Loom's ",
              "libnccl.so.2 preloaded: LD_PRELOAD=<prefix>/lib/nccl/libnccl.so.2)");
}

// Tensors as bytes: block moves need no element type, so every dtype (complex, bool,
// float8) goes the same way.
void* bytesOf(const at::Tensor& c) { return c.data_ptr(); }
size_t nbytes(const at::Tensor& c) { return static_cast<size_t>(c.numel()) * c.element_size(); }
// Elements as Loom counts them: complex as pairs of reals.
size_t elements(const at::Tensor& c) { return static_cast<size_t>(c.numel()) * (c.is_complex() ? 2 : 1); }

}  // namespace

// The reduce-scatter family needs the element type; the declarations live in backend.cpp.
ncclDataType_t ncclTypeOf(const at::Tensor& t);
ncclRedOp_t ncclOpOf(const c10d::ReduceOp& op, const at::Tensor& t);

c10::intrusive_ptr<c10d::Work> LoomBackend::_allgather_base(at::Tensor& out, at::Tensor& in,
                                                            const c10d::AllgatherOptions&) {
  checkCpu(in, "all_gather_into_tensor");
  checkCpu(out, "all_gather_into_tensor");
  TORCH_CHECK(out.numel() == in.numel() * size_ && out.scalar_type() == in.scalar_type(),
              "loom: all_gather_into_tensor: output must hold world_size x input elements of ",
              "the input's type");
  at::Tensor o = out, i = in;
  return enqueue(OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {o}, [this, o, i] {
    at::Tensor ic = i.contiguous();
    Dense od = output(o);
    check(api_.allGather(bytesOf(ic), bytesOf(od.work), nbytes(ic), ncclUint8, comm_, nullptr),
          "all_gather_into_tensor");
    od.copyBack();
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::allgather(std::vector<std::vector<at::Tensor>>& outs,
                                                      std::vector<at::Tensor>& ins,
                                                      const c10d::AllgatherOptions&) {
  TORCH_CHECK(ins.size() == 1 && outs.size() == 1 && static_cast<int>(outs[0].size()) == size_,
              "loom: all_gather takes one input and world_size outputs per process");
  checkCpu(ins[0], "all_gather");
  for (const at::Tensor& o : outs[0])
    TORCH_CHECK(o.numel() == ins[0].numel() && o.scalar_type() == ins[0].scalar_type(),
                "loom: all_gather: every output must match the input's size and type");
  std::vector<at::Tensor> list = outs[0];
  at::Tensor in = ins[0];
  return enqueue(OpType::ALLGATHER, "all_gather", list, [this, list, in] {
    at::Tensor ic = in.contiguous();
    at::Tensor flat = at::empty({size_ * ic.numel()}, ic.options());
    check(api_.allGather(bytesOf(ic), bytesOf(flat), nbytes(ic), ncclUint8, comm_, nullptr),
          "all_gather");
    for (int r = 0; r < size_; ++r)
      list[r].copy_(flat.narrow(0, r * ic.numel(), ic.numel()).view(list[r].sizes()));
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outLists, std::vector<at::Tensor>& ins,
    const c10d::AllgatherOptions&) {
  TORCH_CHECK(outLists.size() == static_cast<size_t>(size_), "loom: all_gather_coalesced takes world_size output lists");
  for (const auto& l : outLists) TORCH_CHECK(l.size() == ins.size(), "loom: all_gather_coalesced: list sizes differ");
  for (const at::Tensor& t : ins) checkCpu(t, "all_gather_coalesced");
  auto lists = outLists;
  std::vector<at::Tensor> inputs = ins, all;
  for (const auto& l : lists) all.insert(all.end(), l.begin(), l.end());
  return enqueue(OpType::ALLGATHER_COALESCED, "all_gather_coalesced", all, [this, lists, inputs] {
    std::vector<at::Tensor> ics, flats;
    for (const at::Tensor& in : inputs) {
      ics.push_back(in.contiguous());
      flats.push_back(at::empty({size_ * in.numel()}, in.options()));
    }
    grouped("all_gather_coalesced", [&] {
      ncclResult_t rc = ncclSuccess;
      for (size_t k = 0; k < ics.size() && rc == ncclSuccess; ++k)
        rc = api_.allGather(bytesOf(ics[k]), bytesOf(flats[k]), nbytes(ics[k]), ncclUint8, comm_,
                            nullptr);
      return rc;
    });
    for (int r = 0; r < size_; ++r)
      for (size_t k = 0; k < inputs.size(); ++k)
        lists[r][k].copy_(flats[k].narrow(0, r * inputs[k].numel(), inputs[k].numel()).view(lists[r][k].sizes()));
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const c10d::AllgatherOptions&) {
  TORCH_CHECK(outs.size() == ins.size(), "loom: all_gather_into_tensor_coalesced: list sizes differ");
  for (size_t k = 0; k < ins.size(); ++k) {
    checkCpu(ins[k], "all_gather_into_tensor_coalesced");
    TORCH_CHECK(outs[k].numel() == ins[k].numel() * size_, "loom: all_gather_into_tensor_coalesced: ",
                "output ", k, " must hold world_size x its input");
  }
  std::vector<at::Tensor> o = outs, i = ins;
  return enqueue(LOOM_OP_COALESCED, "all_gather_into_tensor_coalesced", o, [this, o, i] {
    std::vector<at::Tensor> ics;
    std::vector<Dense> ods;
    for (size_t k = 0; k < i.size(); ++k) {
      ics.push_back(i[k].contiguous());
      ods.push_back(output(o[k]));
    }
    grouped("all_gather_into_tensor_coalesced", [&] {
      ncclResult_t rc = ncclSuccess;
      for (size_t k = 0; k < ics.size() && rc == ncclSuccess; ++k)
        rc = api_.allGather(bytesOf(ics[k]), bytesOf(ods[k].work), nbytes(ics[k]), ncclUint8, comm_,
                            nullptr);
      return rc;
    });
    for (Dense& d : ods) d.copyBack();
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::_reduce_scatter_base(
    at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) {
  checkCpu(in, "reduce_scatter_tensor");
  checkCpu(out, "reduce_scatter_tensor");
  TORCH_CHECK(in.numel() == out.numel() * size_ && out.scalar_type() == in.scalar_type(),
              "loom: reduce_scatter_tensor: input must hold world_size x output elements of the output's type");
  ncclRedOp_t op = ncclOpOf(opts.reduceOp, in);
  ncclDataType_t type = ncclTypeOf(in);
  at::Tensor o = out, i = in;
  return enqueue(OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {o}, [this, o, i, op, type] {
    at::Tensor ic = i.contiguous();
    Dense od = output(o);
    check(api_.reduceScatter(bytesOf(ic), bytesOf(od.work), elements(od.work), type, op, comm_, nullptr),
          "reduce_scatter_tensor");
    od.copyBack();
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::reduce_scatter(std::vector<at::Tensor>& outs,
                                                           std::vector<std::vector<at::Tensor>>& ins,
                                                           const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outs.size() == 1 && ins.size() == 1 && static_cast<int>(ins[0].size()) == size_,
              "loom: reduce_scatter takes one output and world_size inputs per process");
  checkCpu(outs[0], "reduce_scatter");
  for (const at::Tensor& t : ins[0])
    TORCH_CHECK(t.numel() == outs[0].numel() && t.scalar_type() == outs[0].scalar_type(),
                "loom: reduce_scatter: every input must match the output's size and type");
  ncclRedOp_t op = ncclOpOf(opts.reduceOp, outs[0]);
  ncclDataType_t type = ncclTypeOf(outs[0]);
  at::Tensor o = outs[0];
  std::vector<at::Tensor> list = ins[0];
  return enqueue(OpType::REDUCE_SCATTER, "reduce_scatter", {o}, [this, o, list, op, type] {
    std::vector<at::Tensor> flat;
    for (const at::Tensor& t : list) flat.push_back(t.reshape({-1}));
    at::Tensor ic = at::cat(flat);
    Dense od = output(o);
    check(api_.reduceScatter(bytesOf(ic), bytesOf(od.work), elements(od.work), type, op, comm_, nullptr),
          "reduce_scatter");
    od.copyBack();
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outs.size() == ins.size(), "loom: reduce_scatter_tensor_coalesced: list sizes differ");
  std::vector<ncclRedOp_t> ops;
  std::vector<ncclDataType_t> types;
  for (size_t k = 0; k < ins.size(); ++k) {
    checkCpu(ins[k], "reduce_scatter_tensor_coalesced");
    TORCH_CHECK(ins[k].numel() == outs[k].numel() * size_, "loom: reduce_scatter_tensor_coalesced: ",
                "input ", k, " must hold world_size x its output");
    ops.push_back(ncclOpOf(opts.reduceOp, ins[k]));
    types.push_back(ncclTypeOf(ins[k]));
  }
  std::vector<at::Tensor> o = outs, i = ins;
  return enqueue(LOOM_OP_COALESCED, "reduce_scatter_tensor_coalesced", o, [this, o, i, ops, types] {
    std::vector<at::Tensor> ics;
    std::vector<Dense> ods;
    for (size_t k = 0; k < i.size(); ++k) {
      ics.push_back(i[k].contiguous());
      ods.push_back(output(o[k]));
    }
    grouped("reduce_scatter_tensor_coalesced", [&] {
      ncclResult_t rc = ncclSuccess;
      for (size_t k = 0; k < ics.size() && rc == ncclSuccess; ++k)
        rc = api_.reduceScatter(bytesOf(ics[k]), bytesOf(ods[k].work), elements(ods[k].work), types[k],
                                ops[k], comm_, nullptr);
      return rc;
    });
    for (Dense& d : ods) d.copyBack();
  });
}

// Sends and receives of one group: `send[p]` bytes to rank p, `recv[p]` from it.
void LoomBackend::exchange(const std::vector<std::pair<const void*, size_t>>& send,
                           const std::vector<std::pair<void*, size_t>>& recv, const char* what) {
  grouped(what, [&] {
    ncclResult_t rc = ncclSuccess;
    for (int p = 0; p < size_ && rc == ncclSuccess; ++p) {
      if (send[p].first) rc = api_.send(send[p].first, send[p].second, ncclUint8, p, comm_, nullptr);
      if (recv[p].first && rc == ncclSuccess)
        rc = api_.recv(recv[p].first, recv[p].second, ncclUint8, p, comm_, nullptr);
    }
    return rc;
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::alltoall_base(at::Tensor& out, at::Tensor& in,
                                                          std::vector<int64_t>& outSplits,
                                                          std::vector<int64_t>& inSplits,
                                                          const c10d::AllToAllOptions&) {
  checkCpu(in, "all_to_all_single");
  checkCpu(out, "all_to_all_single");
  TORCH_CHECK(in.scalar_type() == out.scalar_type(), "loom: all_to_all_single: types differ");
  auto splits = [&](const at::Tensor& t, std::vector<int64_t> s, const char* which) {
    int64_t rows = t.dim() ? t.size(0) : 1;
    if (s.empty()) {
      TORCH_CHECK(rows % size_ == 0, "loom: all_to_all_single: ", which, " has ", rows,
                  " rows, not a multiple of world_size");
      s.assign(size_, rows / size_);
    }
    TORCH_CHECK(static_cast<int>(s.size()) == size_, "loom: all_to_all_single: ", which,
                " splits must have world_size entries");
    int64_t sum = 0;
    for (int64_t x : s) sum += x;
    TORCH_CHECK(sum == rows, "loom: all_to_all_single: ", which, " splits add up to ", sum,
                ", not its ", rows, " rows");
    return s;
  };
  std::vector<int64_t> os = splits(out, outSplits, "output"), is = splits(in, inSplits, "input");
  at::Tensor o = out, i = in;
  return enqueue(OpType::ALLTOALL_BASE, "all_to_all_single", {o}, [this, o, i, os, is] {
    at::Tensor ic = i.contiguous();
    Dense od = output(o);
    at::Tensor& oc = od.work;
    size_t rowIn = ic.dim() && ic.size(0) ? nbytes(ic) / ic.size(0) : nbytes(ic);
    size_t rowOut = oc.dim() && oc.size(0) ? nbytes(oc) / oc.size(0) : nbytes(oc);
    std::vector<std::pair<const void*, size_t>> send(size_);
    std::vector<std::pair<void*, size_t>> recv(size_);
    size_t a = 0, b = 0;
    for (int p = 0; p < size_; ++p) {
      send[p] = {static_cast<const char*>(bytesOf(ic)) + a, is[p] * rowIn};
      recv[p] = {static_cast<char*>(bytesOf(oc)) + b, os[p] * rowOut};
      a += is[p] * rowIn;
      b += os[p] * rowOut;
    }
    exchange(send, recv, "all_to_all_single");
    od.copyBack();
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::alltoall(std::vector<at::Tensor>& outs,
                                                     std::vector<at::Tensor>& ins,
                                                     const c10d::AllToAllOptions&) {
  TORCH_CHECK(static_cast<int>(outs.size()) == size_ && static_cast<int>(ins.size()) == size_,
              "loom: all_to_all takes world_size inputs and outputs");
  for (const at::Tensor& t : ins) checkCpu(t, "all_to_all");
  for (const at::Tensor& t : outs) checkCpu(t, "all_to_all");
  std::vector<at::Tensor> o = outs, i = ins;
  return enqueue(OpType::ALLTOALL, "all_to_all", o, [this, o, i] {
    std::vector<at::Tensor> ics;
    std::vector<Dense> ods;
    std::vector<std::pair<const void*, size_t>> send(size_);
    std::vector<std::pair<void*, size_t>> recv(size_);
    for (int p = 0; p < size_; ++p) {
      ics.push_back(i[p].contiguous());
      ods.push_back(output(o[p]));
      send[p] = {bytesOf(ics[p]), nbytes(ics[p])};
      recv[p] = {bytesOf(ods[p].work), nbytes(ods[p].work)};
    }
    exchange(send, recv, "all_to_all");
    for (Dense& d : ods) d.copyBack();
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::gather(std::vector<std::vector<at::Tensor>>& outs,
                                                   std::vector<at::Tensor>& ins,
                                                   const c10d::GatherOptions& opts) {
  int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(ins.size() == 1, "loom: gather takes one input per process");
  checkCpu(ins[0], "gather");
  bool me = rank_ == root;
  TORCH_CHECK(!me || (outs.size() == 1 && static_cast<int>(outs[0].size()) == size_),
              "loom: gather: the root takes world_size outputs");
  std::vector<at::Tensor> list = me ? outs[0] : std::vector<at::Tensor>{};
  at::Tensor in = ins[0];
  return enqueue(OpType::GATHER, "gather", list, [this, list, in, root, me] {
    at::Tensor ic = in.contiguous();
    std::vector<std::pair<const void*, size_t>> send(size_, {nullptr, 0});
    std::vector<std::pair<void*, size_t>> recv(size_, {nullptr, 0});
    std::vector<at::Tensor> ocs;
    if (me) {
      for (int p = 0; p < size_; ++p) {
        ocs.push_back(at::empty_like(ic));
        if (p != root) recv[p] = {bytesOf(ocs[p]), nbytes(ic)};
      }
    } else {
      send[root] = {bytesOf(ic), nbytes(ic)};
    }
    exchange(send, recv, "gather");
    if (me)
      for (int p = 0; p < size_; ++p) list[p].copy_((p == root ? ic : ocs[p]).view(list[p].sizes()));
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::scatter(std::vector<at::Tensor>& outs,
                                                    std::vector<std::vector<at::Tensor>>& ins,
                                                    const c10d::ScatterOptions& opts) {
  int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(outs.size() == 1, "loom: scatter takes one output per process");
  checkCpu(outs[0], "scatter");
  bool me = rank_ == root;
  TORCH_CHECK(!me || (ins.size() == 1 && static_cast<int>(ins[0].size()) == size_),
              "loom: scatter: the root takes world_size inputs");
  std::vector<at::Tensor> list = me ? ins[0] : std::vector<at::Tensor>{};
  at::Tensor out = outs[0];
  return enqueue(OpType::SCATTER, "scatter", {out}, [this, list, out, root, me] {
    Dense od = output(out);
    at::Tensor& oc = od.work;
    std::vector<std::pair<const void*, size_t>> send(size_, {nullptr, 0});
    std::vector<std::pair<void*, size_t>> recv(size_, {nullptr, 0});
    std::vector<at::Tensor> ics;
    if (me) {
      for (int p = 0; p < size_; ++p) {
        ics.push_back(list[p].contiguous());
        if (p != root) send[p] = {bytesOf(ics[p]), nbytes(ics[p])};
      }
    } else {
      recv[root] = {bytesOf(oc), nbytes(oc)};
    }
    exchange(send, recv, "scatter");
    if (me) oc.copy_(ics[root].view(oc.sizes()));
    od.copyBack();
  });
}

// NCCL has no tags: messages between two ranks match in the order they were posted.
c10::intrusive_ptr<c10d::Work> LoomBackend::send(std::vector<at::Tensor>& ts, int dst, int) {
  TORCH_CHECK(ts.size() == 1, "loom: send takes one tensor");
  checkCpu(ts[0], "send");
  at::Tensor t = ts[0];
  return enqueue(OpType::SEND, "send to rank " + std::to_string(dst), {t}, [this, t, dst] {
    at::Tensor c = t.contiguous();
    check(api_.send(bytesOf(c), nbytes(c), ncclUint8, dst, comm_, nullptr), "send");
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::recv(std::vector<at::Tensor>& ts, int src, int) {
  TORCH_CHECK(ts.size() == 1, "loom: recv takes one tensor");
  checkCpu(ts[0], "recv");
  at::Tensor t = ts[0];
  return enqueue(OpType::RECV, "recv from rank " + std::to_string(src), {t}, [this, t, src] {
    Dense d = output(t);
    check(api_.recv(bytesOf(d.work), nbytes(d.work), ncclUint8, src, comm_, nullptr), "recv");
    d.copyBack();
  });
}

c10::intrusive_ptr<c10d::Work> LoomBackend::barrier(const c10d::BarrierOptions&) {
  return enqueue(OpType::BARRIER, "barrier", {}, [this] {
    int32_t one = 1;
    check(api_.allReduce(&one, &one, 1, ncclInt32, ncclSum, comm_, nullptr), "barrier");
  });
}

}  // namespace loom_torch
