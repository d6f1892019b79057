// nccl-tests' command line: defaults, every flag in its short, attached and long forms,
// size suffixes, Loom's additions, and the errors.
#include "bench/common/options.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/common/bench_error.h"

namespace loom::bench {
namespace {

Options parse(std::vector<std::string> args) {
  args.insert(args.begin(), "all_reduce_perf");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parseOptions(static_cast<int>(argv.size()), argv.data());
}

std::string parseError(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const BenchError& e) {
    EXPECT_EQ(e.status(), Status::kInvalidUsage);
    return e.what();
  }
  return "<no error>";
}

TEST(BenchOptions, DefaultsAreNcclTests) {
  Options o = parse({});
  EXPECT_EQ(o.nThreads, 1);
  EXPECT_EQ(o.nGpus, 1);
  EXPECT_EQ(o.minBytes, 32u << 20);
  EXPECT_EQ(o.maxBytes, 32u << 20);
  EXPECT_EQ(o.stepBytes, 1u << 20);
  EXPECT_EQ(o.stepFactor, 1u);
  EXPECT_EQ(o.iters, 20);
  EXPECT_EQ(o.warmupIters, 1);
  EXPECT_EQ(o.aggIters, 1);
  EXPECT_EQ(o.runCycles, 1);
  EXPECT_EQ(o.datacheck, 1);
  EXPECT_EQ(o.average, 1);
  EXPECT_EQ(o.root, 0);
  ASSERT_NE(o.type, nullptr);
  EXPECT_STREQ(o.type->name, "float");
  ASSERT_NE(o.op, nullptr);
  EXPECT_STREQ(o.op->name, "sum");
  EXPECT_EQ(o.memoryKind, MemoryKind::kAuto);
  EXPECT_EQ(o.nranks, 0);
  EXPECT_FALSE(o.help);
}

TEST(BenchOptions, SizeSuffixesAreBinary) {
  EXPECT_EQ(parseSize("8"), 8);
  EXPECT_EQ(parseSize("1K"), 1024);
  EXPECT_EQ(parseSize("1k"), 1024);
  EXPECT_EQ(parseSize("128M"), 128.0 * 1024 * 1024);
  EXPECT_EQ(parseSize("2G"), 2.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(parseSize("1.5K"), 1536);
  EXPECT_EQ(parseSize("4 M"), 4.0 * 1024 * 1024);
  EXPECT_LT(parseSize("12X"), 0);
  EXPECT_LT(parseSize("abc"), 0);
  EXPECT_LT(parseSize("-5"), 0);
}

TEST(BenchOptions, EveryShortFlag) {
  Options o = parse({"-t", "3",  "-g", "2",   "-b", "8",    "-e", "128M", "-i", "4K", "-f",
                     "4",  "-n", "7",  "-m",  "2",  "-w",   "5",  "-N",   "3",  "-p", "1",
                     "-c", "2",  "-o", "max", "-d", "half", "-r", "1",    "-z", "3",  "-y",
                     "1",  "-T", "30", "-G",  "4",  "-C",   "1",  "-S",   "1",  "-J", "out.json",
                     "-a", "2",  "-R", "1",   "-x", "1",    "-D", "0",    "-V", "32", "-M",
                     "1",  "-u", "3",  "-I",  "1",  "-K",   "2"});
  EXPECT_EQ(o.nThreads, 3);
  EXPECT_EQ(o.nGpus, 2);
  EXPECT_EQ(o.minBytes, 8u);
  EXPECT_EQ(o.maxBytes, 128u << 20);
  EXPECT_EQ(o.stepBytes, 4096u);
  EXPECT_EQ(o.stepFactor, 4u);
  EXPECT_EQ(o.iters, 7);
  EXPECT_EQ(o.aggIters, 2);
  EXPECT_EQ(o.warmupIters, 5);
  EXPECT_EQ(o.runCycles, 3);
  EXPECT_EQ(o.parallelInit, 1);
  EXPECT_EQ(o.datacheck, 2);
  EXPECT_STREQ(o.op->name, "max");
  EXPECT_STREQ(o.type->name, "half");
  EXPECT_EQ(o.root, 1);
  EXPECT_EQ(o.blocking, 3);
  EXPECT_EQ(o.streamNull, 1);
  EXPECT_EQ(o.timeoutSec, 30);
  EXPECT_EQ(o.cudaGraphLaunches, 4);
  EXPECT_EQ(o.reportCputime, 1);
  EXPECT_EQ(o.reportTimestamps, 1);
  EXPECT_EQ(o.outputFile, "out.json");
  EXPECT_EQ(o.average, 2);
  EXPECT_EQ(o.localRegister, 1);
  EXPECT_EQ(o.ctaPolicy, 1);
  EXPECT_EQ(o.deviceImpl, 0);
  EXPECT_EQ(o.deviceCtaCount, 32);
  EXPECT_EQ(o.memoryReport, 1);
  EXPECT_EQ(o.unalign, 3);
  EXPECT_EQ(o.perIterTiming, 1);
  EXPECT_EQ(o.perIterSkip, 2);
}

TEST(BenchOptions, AttachedAndLongForms) {
  Options o = parse({"-b8", "-e1M", "--stepfactor", "2", "--iters=9", "--datatype", "int32",
                     "--op=prod", "--root", "all", "--warmup_iters", "0", "--nthreads=2", "--check",
                     "0", "--memory_kind", "host"});
  EXPECT_EQ(o.minBytes, 8u);
  EXPECT_EQ(o.maxBytes, 1u << 20);
  EXPECT_EQ(o.stepFactor, 2u);
  EXPECT_EQ(o.iters, 9);
  EXPECT_STREQ(o.type->name, "int32");
  EXPECT_STREQ(o.op->name, "prod");
  EXPECT_EQ(o.root, -1);
  EXPECT_EQ(o.warmupIters, 0);
  EXPECT_EQ(o.nThreads, 2);
  EXPECT_EQ(o.datacheck, 0);
  EXPECT_EQ(o.memoryKind, MemoryKind::kHost);
}

TEST(BenchOptions, AllMeansSweep) {
  Options o = parse({"-d", "all", "-o", "all", "-r", "-1"});
  EXPECT_EQ(o.type, nullptr);
  EXPECT_EQ(o.op, nullptr);
  EXPECT_EQ(o.root, -1);
}

TEST(BenchOptions, UnknownTypeOrOpFallsBackLikeNcclTests) {
  Options o = parse({"-d", "float128", "-o", "xor"});
  EXPECT_STREQ(o.type->name, "float");
  EXPECT_STREQ(o.op->name, "sum");
  ASSERT_EQ(o.notes.size(), 2u);
  EXPECT_EQ(o.notes[0], "invalid type float128, defaulting to float .. ");
  EXPECT_EQ(o.notes[1], "invalid op xor, defaulting to sum .. ");
}

TEST(BenchOptions, MemoryFlagKeepsNcclTestsMeaningForNumbers) {
  EXPECT_EQ(parse({"-M", "1"}).memoryReport, 1);
  EXPECT_EQ(parse({"-M", "1"}).memoryKind, MemoryKind::kAuto);
  EXPECT_EQ(parse({"-M", "device"}).memoryKind, MemoryKind::kDevice);
  EXPECT_EQ(parse({"-M", "host"}).memoryKind, MemoryKind::kHost);
  EXPECT_NE(parseError({"-M", "gpu"}).find("invalid memory kind 'gpu'"), std::string::npos);
}

TEST(BenchOptions, BuiltInLauncherSpellings) {
  EXPECT_EQ(parse({"-np", "4"}).nranks, 4);
  EXPECT_EQ(parse({"--nranks", "3"}).nranks, 3);
  EXPECT_EQ(parse({"--nranks=5"}).nranks, 5);
  // -np must not be read as getopt's "-n p".
  EXPECT_EQ(parse({"-np", "4"}).iters, 20);
}

TEST(BenchOptions, DeviceCtaCountOutOfRangeResetsWithNote) {
  Options o = parse({"-V", "500"});
  EXPECT_EQ(o.deviceCtaCount, 16);
  ASSERT_EQ(o.notes.size(), 1u);
  EXPECT_NE(o.notes[0].find("must be positive and less than 128, got 500"), std::string::npos);
}

TEST(BenchOptions, Errors) {
  EXPECT_EQ(parseError({"-b", "1M", "-e", "8"}),
            "invalid sizes for 'minbytes' and 'maxbytes': 1048576 > 8");
  EXPECT_EQ(parseError({"-b", "12X"}), "invalid size specified for 'minbytes'");
  EXPECT_EQ(parseError({"-e", "oops"}), "invalid size specified for 'maxbytes'");
  EXPECT_EQ(parseError({"-n", "ten"}), "invalid value 'ten' for -n: expected an integer");
  EXPECT_EQ(parseError({"-q", "1"}), "invalid option 'q'");
  EXPECT_EQ(parseError({"--bogus", "1"}), "unrecognized option '--bogus'");
  EXPECT_EQ(parseError({"-n"}), "option '-n' requires an argument");
  EXPECT_EQ(parseError({"stray"}), "unexpected argument 'stray'");
  EXPECT_NE(parseError({"-a", "7"}).find("invalid average mode"), std::string::npos);
  EXPECT_NE(parseError({"-z", "4"}).find("invalid blocking mode"), std::string::npos);
  EXPECT_NE(parseError({"-t", "0"}).find("invalid number of threads"), std::string::npos);
  EXPECT_NE(parseError({"-I", "1", "-n", "5", "-K", "5"}).find("per_iter_skip"), std::string::npos);
}

TEST(BenchOptions, HelpListsEveryFlag) {
  EXPECT_TRUE(parse({"-h"}).help);
  std::string u = usage("all_reduce_perf");
  EXPECT_EQ(u.rfind("USAGE: all_reduce_perf", 0), 0u);
  for (const char* flag : {"-t,--nthreads",
                           "-g,--ngpus",
                           "-b,--minbytes",
                           "-e,--maxbytes",
                           "-i,--stepbytes",
                           "-f,--stepfactor",
                           "-n,--iters",
                           "-m,--agg_iters",
                           "-w,--warmup_iters",
                           "-N,--run_cycles",
                           "-p,--parallel_init",
                           "-c,--check",
                           "-o,--op",
                           "-d,--datatype",
                           "-r,--root",
                           "-z,--blocking",
                           "-y,--stream_null",
                           "-T,--timeout",
                           "-G,--cudagraph",
                           "-C,--report_cputime",
                           "-S,--report_timestamps",
                           "-J,--output_file",
                           "-a,--average",
                           "-R,--local_register",
                           "-x,--cta_policy",
                           "-D,--device_implementation",
                           "-V,--device_cta_count",
                           "-M,--memory",
                           "-u,--unalign",
                           "-I,--per_iter_timing",
                           "-K,--per_iter_skip",
                           "-np,--nranks",
                           "-h,--help"})
    EXPECT_NE(u.find(flag), std::string::npos) << flag;
}

}  // namespace
}  // namespace loom::bench
