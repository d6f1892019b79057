// Loom's reductions on host memory: a Reducer is a fully resolved (data type, op, scalar)
// whose per-element arithmetic is kernels/arith.h, run by SIMD loops picked once for this
// CPU. The CUDA executor passes the same (dtype, kind, scalarBits) to loomCudaReduce
// (kernels/cuda/cuda_kernels_abi.h), which runs the same arithmetic on the device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/arith.h"
#include "kernels/kernel_error.h"

namespace loom {

// Instruction sets the CPU loops are built for; the best one this CPU supports is used
// unless the CPU ISA chooser picks another.
enum class CpuIsa : int { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };
constexpr int kNumCpuIsas = 3;
bool cpuIsaSupported(CpuIsa isa);
CpuIsa bestCpuIsa();    // the widest this CPU supports
CpuIsa activeCpuIsa();  // what Reducers use: the chooser's pick, else bestCpuIsa()
const char* cpuIsaName(CpuIsa isa);

// kernels/ reads no configuration (it depends on nothing in src/): the layer that owns it
// installs a chooser (src/base/cpu_isa_knob.cc applies LOOM_CPU_ISA), which is asked once,
// at the first activeCpuIsa(), given bestCpuIsa(). A pick this CPU lacks is ignored.
using CpuIsaChooser = CpuIsa (*)(CpuIsa best);
void setCpuIsaChooser(CpuIsaChooser chooser);

bool dtypeValid(int dtype);
size_t dtypeSize(int dtype);       // throws KernelError kInvalidArgument for an unknown type
const char* dtypeName(int dtype);  // nccl-tests' names ("float", "bfloat16", ...); "unknown"
const char* redKindName(RedKind kind);

// Scalars of a reduction in the compute type of each data type family.
struct RedScalars {
  float f32 = 0;     // fp16, bf16, fp8, fp32: PreMulSum factor / SumPostDiv factor
  double f64 = 0;    // fp64
  uint64_t u64 = 0;  // integers: PreMulSum factor (two's complement) / SumPostDiv divisor
};

using RedBinaryFn = void (*)(void* dst, const void* a, const void* b, size_t n,
                             const RedScalars& s);
using RedUnaryFn = void (*)(void* dst, const void* src, size_t n, const RedScalars& s);

// The factories throw KernelError kInvalidArgument for a bad data type, op, rank count or
// scalar.
struct Reducer {
  // ncclOp: 0 sum, 1 prod, 2 max, 3 min, 4 avg. Avg becomes what NCCL makes of it:
  // floats -> PreMulSum by 1/nranks (rounded to the data type), integers -> SumPostDiv.
  static Reducer make(int dtype, int ncclOp, int nranks);
  // ncclRedOpCreatePreMulSum: hostScalar points at one element of type dtype.
  static Reducer preMulSum(int dtype, const void* hostScalar);
  // Sum, then divide by nranks at the end (floats: multiply by 1/nranks rounded to the
  // type). make() only uses it for integer Avg; floats are here for the executors' tests.
  static Reducer sumPostDiv(int dtype, int nranks);

  // The same reduction run by the loops built for another instruction set (tests, bench).
  // Throws KernelError kInvalidUsage if this CPU lacks it.
  Reducer withIsa(CpuIsa isa) const;

  int dtype = -1;
  size_t eltSize = 0;
  RedKind kind = RedKind::kSum;
  // PreMulSum: the scalar as one element of dtype (low bytes). SumPostDiv: nranks for
  // integers, 1/nranks as one element of dtype for floats. What loomCudaReduce takes.
  uint64_t scalarBits = 0;
  RedScalars scalars;
  CpuIsa isa = CpuIsa::kGeneric;

  bool hasPre() const { return kind == RedKind::kPreMulSum; }
  bool hasPost() const { return kind == RedKind::kSumPostDiv; }

  // Buffers hold n elements; dst may be the same pointer as an input but must not
  // otherwise overlap one.
  // dst[i] = in[i] OP pre(local[i]): `in` has already been through the reduction,
  // `local` is this rank's own contribution.
  void reduce(void* dst, const void* in, const void* local, size_t n) const {
    reduceFn_(dst, in, local, n, scalars);
  }
  // dst[i] = a[i] OP b[i], both already pre-scaled.
  void reduce2(void* dst, const void* a, const void* b, size_t n) const {
    reduce2Fn_(dst, a, b, n, scalars);
  }
  // dst[i] = pre(src[i]); a copy when !hasPre().
  void pre(void* dst, const void* src, size_t n) const { preFn_(dst, src, n, scalars); }
  // dst[i] = post(src[i]); a copy when !hasPost().
  void post(void* dst, const void* src, size_t n) const { postFn_(dst, src, n, scalars); }

 private:
  void resolve();  // fills the function pointers from (dtype, kind, isa)

  RedBinaryFn reduceFn_ = nullptr;
  RedBinaryFn reduce2Fn_ = nullptr;
  RedUnaryFn preFn_ = nullptr;
  RedUnaryFn postFn_ = nullptr;
};

}  // namespace loom
