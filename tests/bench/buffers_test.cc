// The buffers a benchmark times are written before the first timed call, whatever -c says:
// a one-rank run of the real harness with a collective that looks at both whole buffers
// when it is first called (the first warm-up call, before any timing).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "bench/common/collectives.h"
#include "bench/common/runner.h"

namespace loom::bench {
namespace {

// The real all-reduce, and at its first call a count of the elements of the send and
// receive buffers (`bytes` each, from their start) that are not the value 1 of the type.
class FirstCallProbe : public Collective {
 public:
  FirstCallProbe(const TypeInfo& type, size_t bytes) : type_(type), bytes_(bytes) {}
  const char* name() const override { return real_.name(); }
  Counts counts(size_t count, size_t eltSize, int nranks) const override {
    return real_.counts(count, eltSize, nranks);
  }
  double algBytesFactor(int nranks) const override { return real_.algBytesFactor(nranks); }
  double busBwFactor(int nranks) const override { return real_.busBwFactor(nranks); }
  bool sweepsOps() const override { return real_.sweepsOps(); }
  bool sweepsRoots() const override { return real_.sweepsRoots(); }
  void fill(const DataContext& c) const override { real_.fill(c); }
  int64_t check(const DataContext& c) const override { return real_.check(c); }
  ncclResult_t run(const CallArgs& a) const override {
    if (calls_++ == 0) {
      notOnes_ = countNotOnes(a.send) + countNotOnes(a.recv);
    }
    return real_.run(a);
  }

  int calls() const { return calls_; }
  int64_t notOnes() const { return notOnes_; }

 private:
  int64_t countNotOnes(const void* buf) const {
    unsigned char one[8] = {};
    storeValue(type_.type, one, 0, 1.0);
    const char* p = static_cast<const char*>(buf);
    int64_t wrong = 0;
    for (size_t off = 0; off + type_.size <= bytes_; off += type_.size)
      wrong += memcmp(p + off, one, type_.size) != 0;
    return wrong;
  }

  const Collective& real_ = allReduceCollective();
  const TypeInfo& type_;
  size_t bytes_;
  mutable int calls_ = 0;
  mutable int64_t notOnes_ = -1;
};

void expectWrittenBeforeTiming(std::vector<const char*> args) {
  std::string what;
  for (const char* a : args) what += std::string(a) + " ";
  args.insert(args.begin(), "buffers_test");
  RunInputs in;
  in.opts = parseOptions(static_cast<int>(args.size()), args.data());
  ASSERT_NE(in.opts.type, nullptr) << what;
  FirstCallProbe probe(*in.opts.type, in.opts.maxBytes);
  in.coll = &probe;
  in.programName = "buffers_test";
  BenchProcess process(in);
  EXPECT_EQ(process.run(), 0) << what;
  EXPECT_GT(probe.calls(), 1) << what;
  EXPECT_EQ(probe.notOnes(), 0) << what << ": elements not written before the first call";
}

TEST(BenchBuffers, WrittenBeforeTheFirstCallWithoutChecks) {
  expectWrittenBeforeTiming({"-b", "64K", "-e", "64K", "-n", "2", "-w", "1", "-c", "0"});
  expectWrittenBeforeTiming({"-b", "8", "-e", "1M", "-f", "4", "-n", "1", "-c", "0", "-d",
                             "int8"});
}

TEST(BenchBuffers, WrittenBeforeTheFirstCallWithChecks) {
  expectWrittenBeforeTiming({"-b", "64K", "-e", "64K", "-n", "2", "-w", "1", "-c", "1", "-d",
                             "half"});
}

}  // namespace
}  // namespace loom::bench
