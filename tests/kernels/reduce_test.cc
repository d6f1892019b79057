// Every data type x reduction, on every instruction set this CPU has, against the model in
// reduce_model.h; odd lengths for the vector tails; every aliasing the API allows.
#include "kernels/reduce.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/reduce_model.h"

namespace loom {
namespace {

using test::kTypes;
using test::ModelOp;
using test::TypeModel;

constexpr size_t kGuard = 64;  // bytes after each buffer that must stay untouched
constexpr uint8_t kCanary = 0xa5;
constexpr int kRanks = 3;

// A buffer of n elements followed by a guard zone.
struct Buf {
  Buf(const TypeModel& type, size_t n) : t(&type), n(n), bytes(n * type.size + kGuard, kCanary) {}
  uint64_t get(size_t i) const {
    uint64_t v = 0;
    std::memcpy(&v, bytes.data() + i * t->size, t->size);
    return v;
  }
  void set(size_t i, uint64_t v) { std::memcpy(bytes.data() + i * t->size, &v, t->size); }
  void* data() { return bytes.data(); }
  bool guardIntact() const {
    for (size_t i = n * t->size; i < bytes.size(); ++i) {
      if (bytes[i] != kCanary) return false;
    }
    return true;
  }
  const TypeModel* t;
  size_t n;
  std::vector<uint8_t> bytes;
};

Buf randomBuf(const TypeModel& t, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Buf b(t, n);
  for (size_t i = 0; i < n; ++i) b.set(i, test::randomElement(t, rng));
  return b;
}

std::vector<CpuIsa> supportedIsas() {
  std::vector<CpuIsa> out;
  for (int i = 0; i < kNumCpuIsas; ++i) {
    if (cpuIsaSupported(CpuIsa(i))) out.push_back(CpuIsa(i));
  }
  return out;
}

// The reductions a test runs for one type, with what the model says each function does.
struct Case {
  std::string name;
  Reducer red;
  ModelOp op;           // what reduce2 (and reduce after the pre-op) applies
  bool pre = false;     // PreMulSum: reduce scales `local`, pre() scales
  bool post = false;    // SumPostDiv: post() divides (ints) or scales (floats)
  uint64_t scalar = 0;  // PreMulSum / float SumPostDiv factor, as one element
  int divisor = 1;
};

uint64_t floatAvgScalar(const TypeModel& t, int n) { return t.fromDouble(1.0 / n); }

std::vector<Case> casesFor(const TypeModel& t) {
  std::vector<Case> cases;
  const char* names[] = {"sum", "prod", "max", "min"};
  for (int op = 0; op < 4; ++op) {
    cases.push_back({names[op], Reducer::make(t.dtype, op, kRanks), ModelOp(op)});
  }
  // PreMulSum with a user scalar: a fraction (rounding), a negative factor > 1 (overflow).
  std::vector<uint64_t> scalars;
  if (t.family == test::Family::kInt) {
    scalars = {3, uint64_t(-1) & t.mask(), 200};
  } else {
    scalars = {t.fromDouble(0.3), t.fromDouble(-2.5)};
  }
  for (uint64_t s : scalars) {
    Case c{"premulsum" + std::to_string(s), Reducer::preMulSum(t.dtype, &s), ModelOp::kSum};
    c.pre = true;
    c.scalar = s;
    cases.push_back(c);
  }
  Case avg{"avg", Reducer::make(t.dtype, 4, kRanks), ModelOp::kSum};
  if (t.family == test::Family::kInt) {
    avg.post = true;
    avg.divisor = kRanks;
  } else {
    avg.pre = true;
    avg.scalar = floatAvgScalar(t, kRanks);
  }
  cases.push_back(avg);
  Case div{"sumpostdiv", Reducer::sumPostDiv(t.dtype, 5), ModelOp::kSum};
  div.post = true;
  div.divisor = 5;
  if (t.family != test::Family::kInt) div.scalar = floatAvgScalar(t, 5);
  cases.push_back(div);
  return cases;
}

uint64_t modelPre(const TypeModel& t, const Case& c, uint64_t x) {
  return c.pre ? test::modelScale(t, x, c.scalar) : x;
}
uint64_t modelPost(const TypeModel& t, const Case& c, uint64_t x) {
  if (!c.post) return x;
  if (t.family == test::Family::kInt) return test::modelDiv(t, x, c.divisor);
  return test::modelScale(t, x, c.scalar);
}

// Compares got against want element by element; reports the first few mismatches.
void expectMatches(const TypeModel& t, const Buf& got, const std::vector<uint64_t>& want,
                   const std::string& what) {
  ASSERT_TRUE(got.guardIntact()) << what << ": wrote past the end";
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; ++i) {
    if (!test::sameResult(t, got.get(i), want[i])) {
      ++bad;
      ADD_FAILURE() << what << " [" << i << "]: got 0x" << std::hex << got.get(i) << " want 0x"
                    << want[i];
    }
  }
}

class ReduceTest : public ::testing::TestWithParam<int> {
 protected:
  const TypeModel& type() const { return kTypes[GetParam()]; }
};

TEST_P(ReduceTest, AllOpsMatchModel) {
  const TypeModel& t = type();
  for (const Case& c : casesFor(t)) {
    EXPECT_EQ(c.red.hasPre(), c.pre) << c.name;
    EXPECT_EQ(c.red.hasPost(), c.post) << c.name;
    EXPECT_EQ(c.red.eltSize, t.size);
    for (size_t n : {size_t(0), size_t(1), size_t(3), size_t(17), size_t(1000), size_t(1000003)}) {
      bool big = n > 100000;
      Buf in = randomBuf(t, n, 11 + n), local = randomBuf(t, n, 29 + n);
      std::vector<uint64_t> wantReduce(n), wantReduce2(n), wantPre(n), wantPost(n);
      for (size_t i = 0; i < n; ++i) {
        uint64_t a = in.get(i), b = local.get(i);
        wantReduce[i] = test::modelBinary(t, c.op, a, modelPre(t, c, b));
        wantReduce2[i] = test::modelBinary(t, c.op, a, b);
        if (!big) {
          wantPre[i] = modelPre(t, c, b);
          wantPost[i] = modelPost(t, c, a);
        }
      }
      for (CpuIsa isa : supportedIsas()) {
        Reducer r = c.red.withIsa(isa);
        std::string what = std::string(t.name) + " " + c.name + " n=" + std::to_string(n) +
                           " isa=" + cpuIsaName(isa);
        Buf out(t, n);
        r.reduce(out.data(), in.data(), local.data(), n);
        expectMatches(t, out, wantReduce, what + " reduce");
        r.reduce2(out.data(), in.data(), local.data(), n);
        expectMatches(t, out, wantReduce2, what + " reduce2");
        if (big) continue;  // pre/post are checked at every smaller length
        r.pre(out.data(), local.data(), n);
        expectMatches(t, out, wantPre, what + " pre");
        r.post(out.data(), in.data(), n);
        expectMatches(t, out, wantPost, what + " post");
      }
    }
  }
}

// dst may be the same pointer as either input (or both); results must equal out-of-place.
TEST_P(ReduceTest, AliasedDestinations) {
  const TypeModel& t = type();
  for (const Case& c : casesFor(t)) {
    for (size_t n : {size_t(17), size_t(4099), size_t(100003)}) {
      Buf in = randomBuf(t, n, 5 + n), local = randomBuf(t, n, 7 + n);
      std::vector<uint64_t> want(n), wantSelf(n), wantPre(n), wantPost(n);
      for (size_t i = 0; i < n; ++i) {
        uint64_t a = in.get(i), b = local.get(i);
        want[i] = test::modelBinary(t, c.op, a, modelPre(t, c, b));
        wantSelf[i] = test::modelBinary(t, c.op, a, modelPre(t, c, a));
        wantPre[i] = modelPre(t, c, b);
        wantPost[i] = modelPost(t, c, a);
      }
      for (CpuIsa isa : supportedIsas()) {
        Reducer r = c.red.withIsa(isa);
        std::string what = std::string(t.name) + " " + c.name + " n=" + std::to_string(n) +
                           " isa=" + cpuIsaName(isa);
        Buf x = in;
        r.reduce(x.data(), x.data(), local.data(), n);
        expectMatches(t, x, want, what + " dst==in");
        x = local;
        r.reduce(x.data(), in.data(), x.data(), n);
        expectMatches(t, x, want, what + " dst==local");
        x = in;
        r.reduce(x.data(), x.data(), x.data(), n);
        expectMatches(t, x, wantSelf, what + " dst==in==local");
        x = local;
        r.pre(x.data(), x.data(), n);
        expectMatches(t, x, wantPre, what + " pre in place");
        x = in;
        r.post(x.data(), x.data(), n);
        expectMatches(t, x, wantPost, what + " post in place");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, ReduceTest, ::testing::Range(0, kNumDataTypes),
                         [](const auto& info) { return std::string(kTypes[info.param].name); });

}  // namespace
}  // namespace loom
