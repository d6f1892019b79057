// The step primitive (kernels/step_primitive.h) with the host Ops: every shape of piece the
// plans use against an element-wise model, pieces larger than a block, and the FIFO
// protocol between threads (wait, post, wrap-around, back-pressure) driven only through
// runStepPiece.
#include "kernels/step_primitive.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "kernels/cpu_step_ops.h"

namespace loom {
namespace {

constexpr int kFloat = 7;  // ncclFloat32

struct Ops : CpuStepOps {
  const void* received(FifoEndT<HostAtomics>& f, StepPiece&) const { return f.recvSlot(); }
};

enum Kind { kSum, kPre, kPost };  // sum; PreMulSum by 2; SumPostDiv by 4 (x 0.25)

Reducer reducerFor(Kind k) {
  float two = 2;
  if (k == kPre) return Reducer::preMulSum(kFloat, &two);
  if (k == kPost) return Reducer::sumPostDiv(kFloat, 4);
  return Reducer::make(kFloat, 0, 4);
}

struct Shape {
  bool a, b, out, dst, bPartial, postDst;
};

// Every combination a plan produces: send, send+copy, recv, recvReduceSend,
// recvReduceCopy(Send), recvCopySend, copy, localReduce (a == dst), with and without
// partial sources and final destinations.
class PieceShapes : public ::testing::TestWithParam<std::tuple<Kind, size_t>> {};

TEST_P(PieceShapes, MatchModel) {
  const auto [kind, n] = GetParam();
  const Reducer red = reducerFor(kind);
  const float pre = kind == kPre ? 2.f : 1.f, post = kind == kPost ? 0.25f : 1.f;
  int checked = 0;
  for (int mask = 0; mask < 64; ++mask) {
    Shape s{bool(mask & 1), bool(mask & 2), bool(mask & 4), bool(mask & 8), bool(mask & 16),
            bool(mask & 32)};
    if (!s.a && !s.b) continue;                 // no value
    if (!s.out && !s.dst) continue;             // nowhere to write
    if (s.postDst && !s.dst) continue;
    if (s.bPartial && !s.b) continue;
    // aIsDst: localReduce, or a payload fetched straight into dst.
    for (bool aIsDst : {false, true}) {
      if (aIsDst && !(s.a && s.dst && (!s.out || !s.b))) continue;
      std::vector<float> a(n), b(n), out(n + 1, -7), dst(n + 1, -9);
      for (size_t i = 0; i < n; ++i) {
        a[i] = float(i % 97);
        b[i] = float((i * 7) % 89);
      }
      if (aIsDst) dst.assign(a.begin(), a.end()), dst.push_back(-9);
      StepPiece p;
      p.a = s.a ? (aIsDst ? dst.data() : a.data()) : nullptr;
      p.b = s.b ? b.data() : nullptr;
      p.out = s.out ? out.data() : nullptr;
      p.dst = s.dst ? dst.data() : nullptr;
      p.bytes = n * sizeof(float);
      p.bPartial = s.bPartial;
      p.postDst = s.postDst;
      Ops ops;
      ops.red = &red;
      computePiece(p, ops);
      for (size_t i = 0; i < n; ++i) {
        float bv = s.b ? (s.bPartial ? b[i] : b[i] * pre) : 0;
        float v = s.a && s.b ? a[i] + bv : s.a ? a[i] : bv;
        if (s.out) {
          ASSERT_EQ(out[i], v) << "mask " << mask << " i " << i;
        }
        if (s.dst) {
          ASSERT_EQ(dst[i], s.postDst ? v * post : v) << "mask " << mask << " i " << i;
        }
      }
      EXPECT_EQ(out[n], -7);  // nothing past the piece
      EXPECT_EQ(dst[n], -9);
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

// 5 elements, a piece smaller than a block, and one of several blocks plus a tail.
INSTANTIATE_TEST_SUITE_P(StepPrimitive, PieceShapes,
                         ::testing::Combine(::testing::Values(kSum, kPre, kPost),
                                            ::testing::Values(size_t(5), size_t(1000),
                                                              size_t(3 * 4096 + 13))));

// A FIFO of depth 2 and 16-float slots in one process.
struct TestFifo {
  FifoCtrl ctrl{};
  std::vector<char> slots = std::vector<char>(2 * 64);
  FifoEndT<HostAtomics> end() {
    FifoEndT<HostAtomics> e;
    e.ctrl = &ctrl;
    e.slots = slots.data();
    e.slotBytes = 64;
    e.depth = 2;
    return e;
  }
};

// rank 0 sends, rank 1 adds its own data and forwards (recvReduceSend), rank 2 receives
// the sums; 1000 pieces through depth-2 FIFOs, each thread only polling runStepPiece.
TEST(StepPrimitive, PipelineThroughFifosBetweenThreads) {
  constexpr size_t kElts = 16, kPieces = 1000, kTotal = kElts * kPieces;
  std::vector<float> x(kTotal), y(kTotal), z(kTotal, -1);
  for (size_t i = 0; i < kTotal; ++i) {
    x[i] = float(i % 1000);
    y[i] = float(3 * (i % 777));
  }
  const Reducer red = Reducer::make(kFloat, 0, 3);
  TestFifo f01, f12;
  auto run = [&](FifoEndT<HostAtomics>* rf, FifoEndT<HostAtomics>* sf, const float* src,
                 float* dst) {
    Ops ops;
    ops.red = &red;
    for (size_t k = 0; k < kPieces;) {
      StepPiece p;
      p.bytes = kElts * sizeof(float);
      p.b = src ? src + k * kElts : nullptr;
      p.dst = dst ? dst + k * kElts : nullptr;
      if (runStepPiece(rf, sf, p, ops)) ++k;
      else std::this_thread::yield();
    }
  };
  FifoEndT<HostAtomics> s0 = f01.end(), r1 = f01.end(), s1 = f12.end(), r2 = f12.end();
  std::thread t0(run, nullptr, &s0, x.data(), nullptr);
  std::thread t1(run, &r1, &s1, y.data(), nullptr);
  std::thread t2(run, &r2, nullptr, nullptr, z.data());
  t0.join();
  t1.join();
  t2.join();
  for (size_t i = 0; i < kTotal; ++i) ASSERT_EQ(z[i], x[i] + y[i]) << i;
  EXPECT_EQ(f01.ctrl.tail, kPieces);
  EXPECT_EQ(f12.ctrl.head, kPieces);
  EXPECT_EQ(f12.ctrl.info[(kPieces - 1) % 2].bytes, kElts * sizeof(float));
}

// A full FIFO refuses the sender, an empty one the receiver; nothing moves then.
TEST(StepPrimitive, WaitsWithoutMoving) {
  const Reducer red = Reducer::make(kFloat, 0, 2);
  Ops ops;
  ops.red = &red;
  TestFifo f;
  FifoEndT<HostAtomics> s = f.end(), r = f.end();
  float src[16] = {1}, dst[16] = {};
  StepPiece recv;
  recv.dst = dst;
  recv.bytes = sizeof dst;
  EXPECT_FALSE(runStepPiece(&r, static_cast<FifoEndT<HostAtomics>*>(nullptr), recv, ops));
  for (int i = 0; i < 2; ++i) {
    StepPiece p;
    p.b = src;
    p.bytes = sizeof src;
    EXPECT_TRUE(runStepPiece(static_cast<FifoEndT<HostAtomics>*>(nullptr), &s, p, ops));
  }
  StepPiece third;
  third.b = src;
  third.bytes = sizeof src;
  EXPECT_FALSE(runStepPiece(static_cast<FifoEndT<HostAtomics>*>(nullptr), &s, third, ops));
  EXPECT_EQ(s.step, 2u);
  EXPECT_TRUE(runStepPiece(&r, static_cast<FifoEndT<HostAtomics>*>(nullptr), recv, ops));
  EXPECT_EQ(dst[0], 1.f);
  EXPECT_TRUE(runStepPiece(static_cast<FifoEndT<HostAtomics>*>(nullptr), &s, third, ops));
}

}  // namespace
}  // namespace loom
