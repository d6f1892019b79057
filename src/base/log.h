// NCCL-compatible logging: NCCL_DEBUG=VERSION|WARN|INFO|TRACE, NCCL_DEBUG_SUBSYS (comma
// list, ^ to exclude, ALL), NCCL_DEBUG_FILE with %h (host) and %p (pid). Lines look like
// NCCL's ("host:pid:tid [rank] NCCL INFO ...") so existing log parsers keep working.
#pragma once

#include <cstdint>
#include <cstdio>

namespace loom {

enum class LogLevel : int { kNone = 0, kVersion = 1, kWarn = 2, kInfo = 3, kAbort = 4, kTrace = 5 };

enum LogSubsys : uint64_t {
  kLogInit = 1ull << 0,
  kLogColl = 1ull << 1,
  kLogP2p = 1ull << 2,
  kLogShm = 1ull << 3,
  kLogNet = 1ull << 4,
  kLogGraph = 1ull << 5,
  kLogTuning = 1ull << 6,
  kLogEnv = 1ull << 7,
  kLogAlloc = 1ull << 8,
  kLogCall = 1ull << 9,
  kLogProxy = 1ull << 10,
  kLogBootstrap = 1ull << 11,
  kLogRas = 1ull << 12,  // diagnosis: flight recorder, status queries, arrival summaries
  kLogAll = ~0ull,
};

bool logEnabled(LogLevel level, uint64_t subsys);
void logMessage(LogLevel level, uint64_t subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
// Re-reads NCCL_DEBUG* (ncclResetDebugInit).
void logReset();

// For tools whose report goes to stdout while the library logs there too (its default, as
// NCCL's): returns a private stream on the original stdout and points fd 1 at stderr for
// everything else in the process. Falls back to stdout if it cannot separate them.
FILE* takeStdoutForReport();

// The rank printed in "[rank]"; set per thread while it works for a communicator.
void setLogRank(int rank);
int logRank();

class ScopedLogRank {
 public:
  explicit ScopedLogRank(int rank) : saved_(logRank()) { setLogRank(rank); }
  ~ScopedLogRank() { setLogRank(saved_); }

 private:
  int saved_;
};

}  // namespace loom

#define LOOM_LOG(level, subsys, ...)                                                  \
  do {                                                                                \
    if (::loom::logEnabled(::loom::LogLevel::level, subsys))                          \
      ::loom::logMessage(::loom::LogLevel::level, subsys, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define LOOM_WARN(...) LOOM_LOG(kWarn, ::loom::kLogAll, __VA_ARGS__)
#define LOOM_INFO(subsys, ...) LOOM_LOG(kInfo, subsys, __VA_ARGS__)
#define LOOM_TRACE(subsys, ...) LOOM_LOG(kTrace, subsys, __VA_ARGS__)
