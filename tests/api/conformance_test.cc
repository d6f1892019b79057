// Loom's include/nccl.h against NVIDIA's nccl.h (NCCL 2.28.9), at compile time, plus the
// library-level entry points of libloom at run time.
//
// How the static part works: NVIDIA's header is included normally (global namespace) and
// every macro it defines is captured into namespace `ref` and #undef'd. Loom's header is
// then included a second time inside namespace `ours`, with the CUDA headers turned off
// (so its own cudaStream_t declaration is the one checked) and its functions renamed (a
// generated header #defines ncclX to loomConformance_ncclX: two extern "C" functions of
// the same name would be the same entity). Then for every enumerator, macro, struct field,
// initializer value and function, the two are compared with static_assert, types included:
// RefT<> maps each of ours' types to NVIDIA's so that whole function types can be compared.
// A disagreement does not compile.
//
// The runtime part parses NVIDIA's header to make sure the lists below name everything it
// declares, and calls the version/error/memory/feature entry points through NVIDIA's
// declarations, linked to libloom.so.
#include <dlfcn.h>
#include <stdlib.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

#include <gtest/gtest.h>

// Exported by NCCL (and Loom) but declared in no header.
extern "C" void ncclResetDebugInitInternal();

// ---------------------------------------------------------------- NVIDIA's nccl.h
#include LOOM_REFERENCE_NCCL_H

// Integer-valued macros; each is captured as ref::k<NAME> and compared with ours, value and type.
#define LOOM_INT_MACROS(M)                                                                      \
  M(NCCL_MAJOR) M(NCCL_MINOR) M(NCCL_PATCH) M(NCCL_VERSION_CODE) M(NCCL_UNIQUE_ID_BYTES)        \
  M(NCCL_CONFIG_UNDEF_INT) M(NCCL_SPLIT_NOCOLOR) M(NCCL_WIN_DEFAULT) M(NCCL_WIN_COLL_SYMMETRIC) \
  M(NCCL_WIN_REQUIRED_ALIGNMENT) M(NCCL_CTA_POLICY_DEFAULT) M(NCCL_CTA_POLICY_EFFICIENCY)       \
  M(NCCL_CTA_POLICY_ZERO) M(NCCL_SHRINK_DEFAULT) M(NCCL_SHRINK_ABORT) M(NCCL_REVOKE_DEFAULT)
// The other macros, checked one by one below; listed for the coverage test.
#define LOOM_OTHER_MACROS(M)                                                               \
  M(NCCL_H_) M(NCCL_SUFFIX) M(NCCL_VERSION) M(NCCL_COMM_NULL) M(NCCL_CONFIG_UNDEF_PTR)      \
  M(NCCL_UNDEF_FLOAT) M(NCCL_CONFIG_INITIALIZER) M(NCCL_SIM_INFO_INITIALIZER)

// Every function of nccl.h; pncclX is checked with ncclX.
#define LOOM_FUNCTIONS(F)                                                                        \
  F(MemAlloc) F(MemFree) F(GetVersion) F(GetUniqueId) F(CommInitRankConfig) F(CommInitRank)      \
  F(CommInitAll) F(CommFinalize) F(CommDestroy) F(CommAbort) F(CommRevoke) F(CommSplit)          \
  F(CommShrink) F(CommInitRankScalable) F(GetErrorString) F(GetLastError) F(ResetDebugInit)      \
  F(CommGetAsyncError) F(CommCount) F(CommCuDevice) F(CommUserRank) F(CommRegister)              \
  F(CommDeregister) F(CommWindowRegister) F(CommWindowDeregister) F(RedOpCreatePreMulSum)        \
  F(RedOpDestroy) F(Reduce) F(Bcast) F(Broadcast) F(AllReduce) F(ReduceScatter) F(AllGather)     \
  F(AlltoAll) F(Gather) F(Scatter) F(Send) F(Recv) F(GroupStart) F(GroupEnd) F(GroupSimulateEnd)

// Every enumerator (without the "nccl" prefix).
#define LOOM_ENUMERATORS(E)                                                                     \
  E(Success) E(UnhandledCudaError) E(SystemError) E(InternalError) E(InvalidArgument)           \
  E(InvalidUsage) E(RemoteError) E(InProgress) E(NumResults)                                    \
  E(NumOps_dummy)                                                                               \
  E(Sum) E(Prod) E(Max) E(Min) E(Avg) E(NumOps) E(MaxRedOp)                                     \
  E(Int8) E(Char) E(Uint8) E(Int32) E(Int) E(Uint32) E(Int64) E(Uint64) E(Float16) E(Half)      \
  E(Float32) E(Float) E(Float64) E(Double) E(Bfloat16) E(Float8e4m3) E(Float8e5m2) E(NumTypes)  \
  E(ScalarDevice) E(ScalarHostImmediate)

#define LOOM_ENUM_TYPES(T) \
  T(ncclResult_t) T(ncclRedOp_dummy_t) T(ncclRedOp_t) T(ncclDataType_t) T(ncclScalarResidence_t)

#define LOOM_CONFIG_FIELDS(F)                                                                \
  F(size) F(magic) F(version) F(blocking) F(cgaClusterSize) F(minCTAs) F(maxCTAs) F(netName) \
  F(splitShare) F(trafficClass) F(commName) F(collnetEnable) F(CTAPolicy) F(shrinkShare)     \
  F(nvlsCTAs) F(nChannelsPerNetPeer) F(nvlinkCentricSched)
#define LOOM_SIM_INFO_FIELDS(F) F(size) F(magic) F(version) F(estimatedTime)

namespace ref {
#define LOOM_CAPTURE(name) constexpr auto k##name = name;
LOOM_INT_MACROS(LOOM_CAPTURE)
#undef LOOM_CAPTURE
constexpr std::string_view kSuffix = NCCL_SUFFIX;
constexpr int version(int x, int y, int z) { return NCCL_VERSION(x, y, z); }
constexpr bool commNullIsNull = NCCL_COMM_NULL == nullptr;
constexpr bool undefPtrIsNull = NCCL_CONFIG_UNDEF_PTR == nullptr;
constexpr auto kUndefFloat = NCCL_UNDEF_FLOAT;
constexpr ncclConfig_t kConfig = NCCL_CONFIG_INITIALIZER;
constexpr ncclSimInfo_t kSimInfo = NCCL_SIM_INFO_INITIALIZER;
}  // namespace ref

#undef NCCL_H_
#undef NCCL_MAJOR
#undef NCCL_MINOR
#undef NCCL_PATCH
#undef NCCL_SUFFIX
#undef NCCL_VERSION_CODE
#undef NCCL_VERSION
#undef NCCL_COMM_NULL
#undef NCCL_UNIQUE_ID_BYTES
#undef NCCL_CONFIG_UNDEF_INT
#undef NCCL_CONFIG_UNDEF_PTR
#undef NCCL_SPLIT_NOCOLOR
#undef NCCL_UNDEF_FLOAT
#undef NCCL_WIN_DEFAULT
#undef NCCL_WIN_COLL_SYMMETRIC
#undef NCCL_WIN_REQUIRED_ALIGNMENT
#undef NCCL_CTA_POLICY_DEFAULT
#undef NCCL_CTA_POLICY_EFFICIENCY
#undef NCCL_CTA_POLICY_ZERO
#undef NCCL_SHRINK_DEFAULT
#undef NCCL_SHRINK_ABORT
#undef NCCL_REVOKE_DEFAULT
#undef NCCL_CONFIG_INITIALIZER
#undef NCCL_SIM_INFO_INITIALIZER

// ---------------------------------------------------------------- Loom's nccl.h
#define LOOM_NCCL_NO_CUDA_HEADERS 1
#include "conformance_renames.h"  // generated: #define ncclX loomConformance_ncclX
namespace ours {
#include LOOM_OUR_NCCL_H
// Expanded here, so that sizeof(ncclConfig_t) in the initializer means ours.
constexpr ncclConfig_t kConfig = NCCL_CONFIG_INITIALIZER;
constexpr ncclSimInfo_t kSimInfo = NCCL_SIM_INFO_INITIALIZER;
}  // namespace ours
#include "conformance_unrenames.h"  // generated: #undef ncclX ...

// ---------------------------------------------------------------- the comparison
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // ncclResetDebugInit

#ifndef NCCL_H_
#error "Loom's nccl.h must use NVIDIA's include guard NCCL_H_"
#endif

namespace {

// RefT<T>: T with each of ours' types replaced by NVIDIA's, through pointers, const and
// function types. A type of ours with no mapping stays as it is and so compares unequal.
template <typename T>
struct Ref {
  using type = T;
};
template <typename T>
using RefT = typename Ref<T>::type;
template <typename T>
struct Ref<T*> {
  using type = RefT<T>*;
};
template <typename T>
struct Ref<const T> {
  using type = const RefT<T>;
};
template <typename T, size_t N>
struct Ref<T[N]> {
  using type = RefT<T>[N];
};
template <typename R, typename... A>
struct Ref<R(A...)> {
  using type = RefT<R>(RefT<A>...);
};
#define LOOM_MAP(t) \
  template <>       \
  struct Ref<ours::t> { using type = ::t; };
LOOM_ENUM_TYPES(LOOM_MAP)
LOOM_MAP(ncclUniqueId)
LOOM_MAP(ncclConfig_t)
LOOM_MAP(ncclSimInfo_t)
#undef LOOM_MAP

template <typename A, typename B>
constexpr bool kSame = std::is_same_v<RefT<A>, B>;

// Opaque handles and the stream: the struct tags must be NVIDIA's (struct ncclComm,
// struct ncclWindow_vidmem, struct CUstream_st) so the types, and C++ mangling, agree.
static_assert(std::is_same_v<ours::ncclComm_t, ::ncclComm_t>, "ncclComm_t");
static_assert(std::is_same_v<ours::ncclWindow_t, ::ncclWindow_t>, "ncclWindow_t");
static_assert(std::is_same_v<ours::cudaStream_t, ::cudaStream_t>,
              "cudaStream_t without the CUDA headers must be CUDA's struct CUstream_st*");

// Struct tags (part of the C++ mangling of functions taking these types).
static_assert(std::is_same_v<ours::ncclConfig_v22800, ours::ncclConfig_t>, "ncclConfig_v22800");
static_assert(std::is_same_v<ours::ncclSimInfo_v22200, ours::ncclSimInfo_t>, "ncclSimInfo_v22200");

// Enums: same size and signedness, every enumerator the same value and of the same type.
#define LOOM_CHECK_ENUM_TYPE(t)                                                                 \
  static_assert(std::is_same_v<std::underlying_type_t<ours::t>, std::underlying_type_t<::t>>, \
                "underlying type of " #t);                                                      \
  static_assert(sizeof(ours::t) == sizeof(::t), "sizeof " #t);
LOOM_ENUM_TYPES(LOOM_CHECK_ENUM_TYPE)
#define LOOM_CHECK_ENUMERATOR(e)                                                            \
  static_assert(static_cast<long long>(ours::nccl##e) == static_cast<long long>(::nccl##e), \
                "value of nccl" #e);                                                        \
  static_assert(kSame<decltype(ours::nccl##e), decltype(::nccl##e)>, "enum type of nccl" #e);
LOOM_ENUMERATORS(LOOM_CHECK_ENUMERATOR)

// Macros.
#define LOOM_CHECK_INT_MACRO(name)                                                        \
  static_assert(ref::k##name == (name), #name);                                           \
  static_assert(std::is_same_v<std::remove_const_t<decltype(ref::k##name)>, decltype(name)>, \
                "type of " #name);
LOOM_INT_MACROS(LOOM_CHECK_INT_MACRO)
static_assert(ref::kSuffix == std::string_view(NCCL_SUFFIX), "NCCL_SUFFIX");
static_assert(ref::commNullIsNull && NCCL_COMM_NULL == nullptr, "NCCL_COMM_NULL");
static_assert(ref::undefPtrIsNull && NCCL_CONFIG_UNDEF_PTR == nullptr, "NCCL_CONFIG_UNDEF_PTR");
static_assert(ref::kUndefFloat == NCCL_UNDEF_FLOAT, "NCCL_UNDEF_FLOAT");
static_assert(std::is_same_v<std::remove_const_t<decltype(ref::kUndefFloat)>,
                             decltype(NCCL_UNDEF_FLOAT)>,
              "type of NCCL_UNDEF_FLOAT");
constexpr bool versionMacroAgrees() {
  for (int x = 0; x <= 4; ++x)
    for (int y = 0; y <= 40; ++y)
      for (int z = 0; z <= 20; ++z)
        if (ref::version(x, y, z) != NCCL_VERSION(x, y, z)) return false;
  return true;
}
static_assert(versionMacroAgrees(), "NCCL_VERSION(X,Y,Z) on 0..4 x 0..40 x 0..20");
static_assert(NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH) == 22809, "NCCL 2.28.9");

// Structs: size, alignment, and each field's offset and type; initializer values.
static_assert(sizeof(ours::ncclUniqueId) == 128 && sizeof(::ncclUniqueId) == 128, "ncclUniqueId");
static_assert(offsetof(ours::ncclUniqueId, internal) == offsetof(::ncclUniqueId, internal));
static_assert(kSame<decltype(ours::ncclUniqueId::internal), decltype(::ncclUniqueId::internal)>);
#define LOOM_CHECK_LAYOUT(s)                                        \
  static_assert(sizeof(ours::s) == sizeof(::s), "sizeof " #s);     \
  static_assert(alignof(ours::s) == alignof(::s), "alignof " #s);
LOOM_CHECK_LAYOUT(ncclConfig_t)
LOOM_CHECK_LAYOUT(ncclSimInfo_t)
LOOM_CHECK_LAYOUT(ncclUniqueId)
// k: the initializer values, ours::k (expanded in ours) and ref::k (NVIDIA's).
#define LOOM_CHECK_FIELD(s, k, f)                                                         \
  static_assert(offsetof(ours::s, f) == offsetof(::s, f), "offset of " #s "::" #f);       \
  static_assert(kSame<decltype(ours::s::f), decltype(::s::f)>, "type of " #s "::" #f);    \
  static_assert(ours::k.f == ref::k.f, "initializer value of " #s "::" #f);
#define LOOM_CHECK_CONFIG_FIELD(f) LOOM_CHECK_FIELD(ncclConfig_t, kConfig, f)
#define LOOM_CHECK_SIM_FIELD(f) LOOM_CHECK_FIELD(ncclSimInfo_t, kSimInfo, f)
LOOM_CONFIG_FIELDS(LOOM_CHECK_CONFIG_FIELD)
LOOM_SIM_INFO_FIELDS(LOOM_CHECK_SIM_FIELD)
static_assert(ours::kConfig.size == sizeof(::ncclConfig_t) && ours::kConfig.magic == 0xcafebeef);
static_assert(ours::kSimInfo.size == sizeof(::ncclSimInfo_t) && ours::kSimInfo.magic == 0x74685283);

// Functions: the full type, return and every parameter, of ncclX and pncclX.
#define LOOM_CHECK_FUNCTION(f)                                                                 \
  static_assert(kSame<decltype(ours::loomConformance_nccl##f), decltype(::nccl##f)>,            \
                "signature of nccl" #f);                                                       \
  static_assert(kSame<decltype(ours::loomConformance_pnccl##f), decltype(::pnccl##f)>,          \
                "signature of pnccl" #f);
LOOM_FUNCTIONS(LOOM_CHECK_FUNCTION)

#pragma GCC diagnostic pop

// ---------------------------------------------------------------- runtime tests

#define LOOM_STRINGIFY_PREFIXED(x) "nccl" #x,
#define LOOM_STRINGIFY(x) #x,

std::string readFile(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<std::string> matches(const std::string& text, const std::regex& re) {
  std::set<std::string> out;
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it)
    out.insert((*it)[1].str());
  return out;
}

// The lists above must name everything NVIDIA's header declares, or the static checks
// would silently skip what is missing.
TEST(ConformanceTest, ListsCoverReferenceHeader) {
  std::string text = readFile(LOOM_REFERENCE_NCCL_H_PATH);
  ASSERT_FALSE(text.empty()) << LOOM_REFERENCE_NCCL_H_PATH;

  std::set<std::string> functions;
  for (const char* f : {LOOM_FUNCTIONS(LOOM_STRINGIFY_PREFIXED)}) {
    functions.insert(f);
    functions.insert(std::string("p") + f);
  }
  // Declarations: a return type at the start of a line, then the name and "(".
  std::regex declaration(R"((?:^|\n)\s*(?:ncclResult_t|const char\s*\*|void)\s+(p?nccl\w+)\s*\()");
  for (const std::string& f : matches(text, declaration))
    EXPECT_TRUE(functions.count(f)) << "function " << f << " is not checked";
  EXPECT_EQ(matches(text, declaration).size(), 82u) << "NVIDIA's nccl.h has 41 x 2 functions";
  EXPECT_EQ(functions.size(), 82u);

  std::set<std::string> enumerators;
  for (const char* e : {LOOM_ENUMERATORS(LOOM_STRINGIFY_PREFIXED)}) enumerators.insert(e);
  for (const std::string& e : matches(text, std::regex(R"(\b(nccl\w+)\s*=)")))
    EXPECT_TRUE(enumerators.count(e)) << "enumerator " << e << " is not checked";

  std::set<std::string> macros;
  for (const char* m : {LOOM_INT_MACROS(LOOM_STRINGIFY) LOOM_OTHER_MACROS(LOOM_STRINGIFY)})
    macros.insert(m);
  for (const std::string& m : matches(text, std::regex(R"(#define\s+(NCCL_\w+))")))
    EXPECT_TRUE(macros.count(m)) << "macro " << m << " is not checked";

  auto fieldsOf = [&](const char* tag, const char* name) {
    std::smatch m;
    std::regex block(std::string("typedef struct ") + tag + R"(\s*\{([^}]*)\}\s*)" + name + ";");
    EXPECT_TRUE(std::regex_search(text, m, block)) << tag;
    return matches(m[1].str(), std::regex(R"((\w+)\s*;)"));
  };
  std::set<std::string> config{LOOM_CONFIG_FIELDS(LOOM_STRINGIFY)};
  EXPECT_EQ(fieldsOf("ncclConfig_v22800", "ncclConfig_t"), config);
  std::set<std::string> simInfo{LOOM_SIM_INFO_FIELDS(LOOM_STRINGIFY)};
  EXPECT_EQ(fieldsOf("ncclSimInfo_v22200", "ncclSimInfo_t"), simInfo);
}

}  // namespace

// Loom's extension header must also work on top of NVIDIA's nccl.h (it includes <nccl.h>,
// which by now is included, guard and all).
#include <loom/loom.h>

namespace {

TEST(ConformanceTest, GetVersion) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, 22809);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  EXPECT_EQ(ncclGetVersion(nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("version"), std::string::npos)
      << ncclGetLastError(nullptr);
  EXPECT_EQ(pncclGetVersion(nullptr), ncclInvalidArgument);
}

// NCCL's strings, word for word (checked against the real libnccl.so.2 below when present).
TEST(ConformanceTest, ErrorStrings) {
  const std::pair<int, const char*> expected[] = {
      {ncclSuccess, "no error"},
      {ncclUnhandledCudaError, "unhandled cuda error (run with NCCL_DEBUG=INFO for details)"},
      {ncclSystemError, "unhandled system error (run with NCCL_DEBUG=INFO for details)"},
      {ncclInternalError, "internal error - please report this issue to the NCCL developers"},
      {ncclInvalidArgument, "invalid argument (run with NCCL_DEBUG=WARN for details)"},
      {ncclInvalidUsage, "invalid usage (run with NCCL_DEBUG=WARN for details)"},
      {ncclRemoteError, "remote process exited or there was a network error"},
      {ncclInProgress, "NCCL operation in progress"},
      {ncclNumResults, "unknown result code"},
      {-1, "unknown result code"},
      {1000, "unknown result code"},
  };
  for (auto [code, text] : expected) {
    EXPECT_STREQ(ncclGetErrorString(static_cast<ncclResult_t>(code)), text) << code;
    EXPECT_STREQ(pncclGetErrorString(static_cast<ncclResult_t>(code)), text) << code;
  }
}

TEST(ConformanceTest, ErrorStringsMatchNvidiaLibrary) {
  void* nccl = dlopen(LOOM_REFERENCE_NCCL_LIB, RTLD_NOW | RTLD_LOCAL);
  if (!nccl) GTEST_SKIP() << "NVIDIA's libnccl.so.2 not loadable: " << dlerror();
  auto theirs = reinterpret_cast<const char* (*)(ncclResult_t)>(dlsym(nccl, "ncclGetErrorString"));
  ASSERT_NE(theirs, nullptr);
  ASSERT_EQ(dlsym(nccl, "loomGetVersionString"), nullptr) << "that is Loom, not NVIDIA's NCCL";
  for (int code = -2; code <= 12; ++code) {
    auto rc = static_cast<ncclResult_t>(code);
    EXPECT_STREQ(ncclGetErrorString(rc), theirs(rc)) << code;
  }
  dlclose(nccl);
}

TEST(ConformanceTest, MemAllocGivesAlignedWritableHostMemory) {
  for (size_t size : {size_t{1}, size_t{4096}, size_t{12345}, size_t{8} << 20}) {
    void* p = nullptr;
    ASSERT_EQ(ncclMemAlloc(&p, size), ncclSuccess) << size;
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % NCCL_WIN_REQUIRED_ALIGNMENT, 0u) << size;
    std::memset(p, 0xa5, size);
    EXPECT_EQ(static_cast<unsigned char*>(p)[size - 1], 0xa5);
    EXPECT_EQ(ncclMemFree(p), ncclSuccess);
  }
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(ncclMemAlloc(&p, 0), ncclInvalidArgument);
  EXPECT_EQ(p, reinterpret_cast<void*>(0x1)) << "*ptr must be left alone on error";
  EXPECT_EQ(ncclMemAlloc(nullptr, 64), ncclInvalidArgument);
  EXPECT_EQ(ncclMemFree(nullptr), ncclSuccess);
#ifndef __SANITIZE_ADDRESS__  // ASan aborts on impossible sizes instead of failing them
  // More than any machine has: a clean error, not a crash.
  EXPECT_EQ(ncclMemAlloc(&p, SIZE_MAX / 2), ncclSystemError);
#endif
}

TEST(ConformanceTest, LoomVersionAndFeatures) {
  EXPECT_STREQ(loomGetVersionString(), LOOM_VERSION_STRING);
  unsigned compiled = ~0u, available = ~0u;
  ASSERT_EQ(loomGetFeatures(&compiled, &available), ncclSuccess);
  const unsigned known = loomFeatureHostMemory | loomFeatureCuda | loomFeatureNvml |
                         loomFeatureIbverbs | loomFeatureUcx | loomFeatureNcclFallback;
  EXPECT_TRUE(compiled & loomFeatureHostMemory);
  EXPECT_TRUE(available & loomFeatureHostMemory);
  EXPECT_EQ(compiled & ~known, 0u);
  EXPECT_EQ(available & ~known, 0u);
  // Each "available" bit says whether the runtime library loads here.
  auto loads = [](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (void* h = dlopen(n, RTLD_NOW | RTLD_LOCAL)) {
        dlclose(h);
        return true;
      }
    return false;
  };
  EXPECT_EQ(bool(available & loomFeatureCuda),
            loads({"libcudart.so.13", "libcudart.so.12", "libcudart.so"}));
  EXPECT_EQ(bool(available & loomFeatureNvml), loads({"libnvidia-ml.so.1"}));
  EXPECT_EQ(bool(available & loomFeatureIbverbs), loads({"libibverbs.so.1"}));
  EXPECT_EQ(bool(available & loomFeatureUcx), loads({"libucp.so.0"}));
  // The UCX backend is built wherever UCX's headers are (CI installs libucx-dev).
#if __has_include(<ucp/api/ucp.h>) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
  EXPECT_TRUE(compiled & loomFeatureUcx);
#else
  EXPECT_FALSE(compiled & loomFeatureUcx);
#endif
  // The fallback is built in, except where the sanitizer runtime refuses RTLD_DEEPBIND.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  EXPECT_FALSE(compiled & loomFeatureNcclFallback);
#else
  EXPECT_TRUE(compiled & loomFeatureNcclFallback);
#endif

  unsigned onlyCompiled = 0;
  EXPECT_EQ(loomGetFeatures(&onlyCompiled, nullptr), ncclSuccess);
  EXPECT_EQ(onlyCompiled, compiled);
  EXPECT_EQ(loomGetFeatures(nullptr, nullptr), ncclInvalidArgument);
}

// The fallback bit follows LOOM_NCCL_LIBRARY, and Loom never mistakes itself for NCCL.
TEST(ConformanceTest, NcclFallbackAvailability) {
  auto fallbackAvailable = [] {
    unsigned available = 0;
    EXPECT_EQ(loomGetFeatures(nullptr, &available), ncclSuccess);
    return bool(available & loomFeatureNcclFallback);
  };
  setenv("LOOM_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  EXPECT_FALSE(fallbackAvailable());

  Dl_info self{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&loomGetFeatures), &self), 0);
  setenv("LOOM_NCCL_LIBRARY", self.dli_fname, 1);
  EXPECT_FALSE(fallbackAvailable()) << self.dli_fname << " is Loom, not a fallback";

  void* real = dlopen(LOOM_REFERENCE_NCCL_LIB, RTLD_NOW | RTLD_LOCAL);
  if (real) {
    dlclose(real);
    setenv("LOOM_NCCL_LIBRARY", LOOM_REFERENCE_NCCL_LIB, 1);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    EXPECT_FALSE(fallbackAvailable()) << "sanitizer builds cannot open stock NCCL (RTLD_DEEPBIND)";
#else
    EXPECT_TRUE(fallbackAvailable());
#endif
  }
  unsetenv("LOOM_NCCL_LIBRARY");
}

// ncclResetDebugInit makes a changed NCCL_DEBUG / NCCL_DEBUG_FILE take effect.
TEST(ConformanceTest, ResetDebugInitRereadsEnvironment) {
  std::string path = ::testing::TempDir() + "loom_conformance_debug_" + std::to_string(getpid());
  setenv("NCCL_DEBUG", "WARN", 1);
  setenv("NCCL_DEBUG_FILE", path.c_str(), 1);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ncclResetDebugInit();
#pragma GCC diagnostic pop
  EXPECT_EQ(ncclGetVersion(nullptr), ncclInvalidArgument);  // logged at WARN
  unsetenv("NCCL_DEBUG");
  unsetenv("NCCL_DEBUG_FILE");
  ncclResetDebugInitInternal();  // back to the default, closing the file
  std::string log = readFile(path.c_str());
  EXPECT_NE(log.find("NCCL WARN"), std::string::npos) << log;
  EXPECT_NE(log.find("ncclGetVersion"), std::string::npos) << log;
  std::remove(path.c_str());
}

}  // namespace
