#include "kernels/reduce.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "kernels/cpu_kernels.h"

namespace loom {
namespace {

[[noreturn]] __attribute__((format(printf, 2, 3))) void fail(KernelErrc code, const char* fmt,
                                                              ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  throw KernelError(code, msg);
}

std::atomic<CpuIsaChooser> gChooser{nullptr};

constexpr const char* kDtypeNames[kNumDataTypes] = {"int8",   "uint8",    "int32",  "uint32",
                                                    "int64",  "uint64",   "half",   "float",
                                                    "double", "bfloat16", "f8e4m3", "f8e5m2"};
constexpr size_t kDtypeSizes[kNumDataTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

bool isFloatType(int dtype) { return dtype >= int(DataType::kFloat16); }

template <size_t kSize>
void copyElements(void* dst, const void* src, size_t n, const RedScalars&) {
  if (dst != src && n != 0) std::memcpy(dst, src, n * kSize);
}

RedUnaryFn copyFn(size_t eltSize) {
  switch (eltSize) {
    case 1:
      return copyElements<1>;
    case 2:
      return copyElements<2>;
    case 4:
      return copyElements<4>;
    default:
      return copyElements<8>;
  }
}

// The bits of `v` rounded (RNE) to one element of the float type dtype, the way NCCL
// rounds its Avg factor: through float, except for double.
uint64_t floatScalarBits(int dtype, double v) {
  switch (DataType(dtype)) {
    case DataType::kFloat16:
      return floatToHalf(float(v));
    case DataType::kBfloat16:
      return floatToBf16(float(v));
    case DataType::kFloat8e4m3:
      return floatToFp8e4m3(float(v));
    case DataType::kFloat8e5m2:
      return floatToFp8e5m2(float(v));
    case DataType::kFloat32:
      return floatBits(float(v));
    default:
      return doubleBits(v);
  }
}

// The compute-type value of a scalar given as one element of dtype.
RedScalars scalarsFromBits(int dtype, uint64_t bits) {
  RedScalars s;
  switch (DataType(dtype)) {
    case DataType::kFloat16:
      s.f32 = scalarFromBits<DataType::kFloat16>(bits);
      break;
    case DataType::kBfloat16:
      s.f32 = scalarFromBits<DataType::kBfloat16>(bits);
      break;
    case DataType::kFloat8e4m3:
      s.f32 = scalarFromBits<DataType::kFloat8e4m3>(bits);
      break;
    case DataType::kFloat8e5m2:
      s.f32 = scalarFromBits<DataType::kFloat8e5m2>(bits);
      break;
    case DataType::kFloat32:
      s.f32 = scalarFromBits<DataType::kFloat32>(bits);
      break;
    case DataType::kFloat64:
      s.f64 = scalarFromBits<DataType::kFloat64>(bits);
      break;
    default:
      s.u64 = bits;
      break;  // the loops truncate to the integer type
  }
  return s;
}

// What this CPU can run and the loops built for it; apart from the choice among them, so
// that a chooser may ask cpuIsaSupported() while activeCpuIsa() is being decided.
struct KernelTables {
  CpuKernelTable table[kNumCpuIsas];
  bool supported[kNumCpuIsas] = {};
  CpuIsa best = CpuIsa::kGeneric;

  KernelTables() {
    __builtin_cpu_init();
    fillGenericKernels(&table[int(CpuIsa::kGeneric)]);
    supported[int(CpuIsa::kGeneric)] = true;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
      fillAvx2Kernels(&table[int(CpuIsa::kAvx2)]);
      supported[int(CpuIsa::kAvx2)] = true;
    }
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c")) {
      fillAvx512Kernels(&table[int(CpuIsa::kAvx512)]);
      supported[int(CpuIsa::kAvx512)] = true;
    }
    for (int i = kNumCpuIsas - 1; i >= 0; --i) {
      if (supported[i]) {
        best = CpuIsa(i);
        break;
      }
    }
  }
};

const KernelTables& tables() {
  static const KernelTables t;
  return t;
}

CpuIsa chooseActive() {
  CpuIsa best = tables().best;
  CpuIsaChooser chooser = gChooser.load();
  if (!chooser) return best;
  CpuIsa pick = chooser(best);
  return cpuIsaSupported(pick) ? pick : best;
}

void checkDtype(int dtype) {
  if (!dtypeValid(dtype)) [[unlikely]]
    fail(KernelErrc::kInvalidArgument, "invalid data type %d (valid: 0..%d, ncclDataType_t)",
         dtype, kNumDataTypes - 1);
}

void checkRanks(int nranks) {
  if (nranks < 1)
    fail(KernelErrc::kInvalidArgument, "invalid rank count %d for a reduction", nranks);
}

}  // namespace

bool cpuIsaSupported(CpuIsa isa) {
  int i = int(isa);
  return i >= 0 && i < kNumCpuIsas && tables().supported[i];
}

CpuIsa bestCpuIsa() { return tables().best; }

CpuIsa activeCpuIsa() {
  static const CpuIsa active = chooseActive();
  return active;
}

void setCpuIsaChooser(CpuIsaChooser chooser) { gChooser.store(chooser); }

const char* cpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kGeneric:
      return "generic";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool dtypeValid(int dtype) { return dtype >= 0 && dtype < kNumDataTypes; }

size_t dtypeSize(int dtype) {
  checkDtype(dtype);
  return kDtypeSizes[dtype];
}

const char* dtypeName(int dtype) { return dtypeValid(dtype) ? kDtypeNames[dtype] : "unknown"; }

const char* redKindName(RedKind kind) {
  switch (kind) {
    case RedKind::kSum:
      return "sum";
    case RedKind::kProd:
      return "prod";
    case RedKind::kMax:
      return "max";
    case RedKind::kMin:
      return "min";
    case RedKind::kPreMulSum:
      return "premulsum";
    case RedKind::kSumPostDiv:
      return "sumpostdiv";
  }
  return "unknown";
}

Reducer Reducer::make(int dtype, int ncclOp, int nranks) {
  checkDtype(dtype);
  if (ncclOp < 0 || ncclOp > 4)
    fail(KernelErrc::kInvalidArgument,
         "invalid reduction op %d (valid: 0 sum, 1 prod, 2 max, 3 min, 4 avg, or an op from "
         "ncclRedOpCreatePreMulSum)",
         ncclOp);
  checkRanks(nranks);
  if (ncclOp == 4) {
    if (!isFloatType(dtype)) return sumPostDiv(dtype, nranks);
    uint64_t bits = floatScalarBits(dtype, 1.0 / nranks);
    return preMulSum(dtype, &bits);
  }
  Reducer r;
  r.dtype = dtype;
  r.eltSize = kDtypeSizes[dtype];
  r.kind = RedKind(ncclOp);  // sum, prod, max, min share NCCL's numbering
  r.isa = activeCpuIsa();
  r.resolve();
  return r;
}

Reducer Reducer::preMulSum(int dtype, const void* hostScalar) {
  checkDtype(dtype);
  if (!hostScalar) fail(KernelErrc::kInvalidArgument, "PreMulSum scalar pointer is null");
  Reducer r;
  r.dtype = dtype;
  r.eltSize = kDtypeSizes[dtype];
  r.kind = RedKind::kPreMulSum;
  std::memcpy(&r.scalarBits, hostScalar, r.eltSize);
  r.scalars = scalarsFromBits(dtype, r.scalarBits);
  r.isa = activeCpuIsa();
  r.resolve();
  return r;
}

Reducer Reducer::sumPostDiv(int dtype, int nranks) {
  checkDtype(dtype);
  checkRanks(nranks);
  Reducer r;
  r.dtype = dtype;
  r.eltSize = kDtypeSizes[dtype];
  r.kind = RedKind::kSumPostDiv;
  if (isFloatType(dtype)) {
    r.scalarBits = floatScalarBits(dtype, 1.0 / nranks);
    r.scalars = scalarsFromBits(dtype, r.scalarBits);
  } else {
    r.scalarBits = uint64_t(nranks);
    r.scalars.u64 = uint64_t(nranks);
  }
  r.isa = activeCpuIsa();
  r.resolve();
  return r;
}

Reducer Reducer::withIsa(CpuIsa isa) const {
  if (!cpuIsaSupported(isa))
    fail(KernelErrc::kInvalidUsage, "CPU reduction loops for %s requested, but this CPU lacks %s",
         cpuIsaName(isa), cpuIsaName(isa));
  Reducer r = *this;
  r.isa = isa;
  r.resolve();
  return r;
}

void Reducer::resolve() {
  const CpuKernelTable& t = tables().table[int(isa)];
  switch (kind) {
    case RedKind::kSum:
    case RedKind::kProd:
    case RedKind::kMax:
    case RedKind::kMin:
      reduceFn_ = reduce2Fn_ = t.binary[dtype][int(kind)];
      preFn_ = postFn_ = copyFn(eltSize);
      break;
    case RedKind::kPreMulSum:
      reduceFn_ = t.preSum[dtype];
      reduce2Fn_ = t.binary[dtype][int(RedKind::kSum)];
      preFn_ = t.pre[dtype];
      postFn_ = copyFn(eltSize);
      break;
    case RedKind::kSumPostDiv:
      reduceFn_ = reduce2Fn_ = t.binary[dtype][int(RedKind::kSum)];
      preFn_ = copyFn(eltSize);
      postFn_ = t.post[dtype];
      break;
  }
  if (!reduceFn_ || !reduce2Fn_ || !preFn_ || !postFn_)
    fail(KernelErrc::kInternalError, "internal error: no CPU loop for %s %s on %s",
         dtypeName(dtype), redKindName(kind), cpuIsaName(isa));
}

}  // namespace loom
